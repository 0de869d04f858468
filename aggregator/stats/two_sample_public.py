"""Two-sample test for public-coin one-bit reports (``PublicCoinBit``): a 2 x 2 homogeneity
chi-square per public group, summed.

Group l's devices of both samples report a bit about the same public subset S_l. Under H0 (one
answer distribution p) the ones are B_l^A ~ Bin(n_l^A, mu_l) and B_l^B ~ Bin(n_l^B, mu_l) with the
same unknown mu_l = (1 - rho) + (2 rho - 1) p(S_l), so each group is a 2 x 2 table (sample x bit)
whose rows share one law, and the groups are independent given their sizes:
``Q = sum_l chi2_l`` is chi-square(number of informative groups) in the limit. The exact null
permutes the pooled bits of each group between the samples: given the group's margins, group A's
ones are hypergeometric, so the permutation null needs the counts only. A group with no report in
one sample, or whose pooled bits are all equal, has a degenerate table and carries no information
about H0: it is left out (and the result says so).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats.calibration import MIN_EFFECTIVE_COUNT
from aggregator.stats.montecarlo import monte_carlo_pvalue
from aggregator.stats.result import ResultFields, TestResult
from aggregator.stats.validate import make_rng
from client.mechanisms import PublicCoinBit, as_public_coin

PUBLIC_LABEL = "two-sample grouped homogeneity chi-square on public-coin bits"
PERMUTATION = "permutation of the pooled bits within each public group"


def public_coin_two_sample(
    hist_a: Histogram,
    hist_b: Histogram,
    alpha: float,
    calibration: str,
    rng: np.random.Generator | int | None,
    n_draws: int,
) -> TestResult:
    """Q = sum over informative groups of the 2 x 2 Pearson homogeneity chi-square; arguments
    checked by ``two_sample``. ``observed`` is group A's statistic ([n_l], then [B_l]) and
    ``expected`` its expectation given the pooled margins."""
    mech = as_public_coin(hist_a.mechanism)
    sizes_a, ones_a = np.split(hist_a.values, 2)
    sizes_b, ones_b = np.split(hist_b.values, 2)
    sizes, ones = sizes_a + sizes_b, ones_a + ones_b
    used = (sizes_a > 0) & (sizes_b > 0) & (ones > 0) & (ones < sizes)
    dropped = mech.groups - int(used.sum())
    if not used.any():
        raise InvalidInputError(
            f"none of the {mech.groups} public groups is informative: each has no report in one "
            "of the samples, or all its bits are equal"
        )
    share = np.divide(ones, sizes, out=np.zeros_like(ones), where=sizes > 0)
    common = ResultFields(
        method=PUBLIC_LABEL,
        n=hist_a.n + hist_b.n,
        alpha=alpha,
        expected=np.concatenate([sizes_a, sizes_a * share]),
        observed=hist_a.values.copy(),
        mechanism=mech.describe(),
    )
    left_out = (
        f"{dropped} of {mech.groups} public groups left out: no report in one sample, or "
        "all their bits equal"
        if dropped
        else ""
    )
    m_a, m_b, t = sizes_a[used], sizes_b[used], ones[used]
    statistic_of = _homogeneity(m_a, m_b, t)
    statistic = float(statistic_of(ones_a[used])[0])
    smallest = float(np.min(np.minimum(m_a, m_b) * np.minimum(t, m_a + m_b - t) / (m_a + m_b)))
    simulated, reason = _choice(calibration, smallest)
    if simulated:
        draws = make_rng(rng).hypergeometric(
            t.astype(np.int64),
            (m_a + m_b - t).astype(np.int64),
            m_a.astype(np.int64),
            size=(n_draws, t.size),
        )
        pvalue = monte_carlo_pvalue(statistic, statistic_of(draws.astype(float)))
        return TestResult(
            statistic,
            pvalue,
            None,
            reject=pvalue <= alpha,
            calibration="monte-carlo",
            calibration_reason=reason,
            n_draws=n_draws,
            reason=left_out,
            **common,
        )
    dof = int(t.size)
    pvalue = float(stats.chi2.sf(statistic, dof))
    return TestResult(
        statistic,
        pvalue,
        dof,
        reject=pvalue <= alpha,
        calibration="asymptotic",
        calibration_reason=reason,
        reason=left_out,
        **common,
    )


def _homogeneity(m_a: np.ndarray, m_b: np.ndarray, ones: np.ndarray):
    """sum_l of the 2 x 2 Pearson statistic as a function of group A's ones (rows of (m, G)):
    ``N^3 (B^A - n^A T / N)^2 / (n^A n^B T (N - T))`` per group, N = n^A + n^B, T the pooled
    ones."""
    total = m_a + m_b
    center = m_a * ones / total
    scale = total**3 / (m_a * m_b * ones * (total - ones))

    def statistic_of(ones_a: np.ndarray) -> np.ndarray:
        return np.sum(scale * (np.atleast_2d(ones_a) - center) ** 2, axis=-1)

    return statistic_of


def _choice(calibration: str, smallest: float) -> tuple[bool, str]:
    """(simulated, why): ``auto`` keeps the chi-square law where every expected cell of every
    informative group's 2 x 2 table is at least ``MIN_EFFECTIVE_COUNT``."""
    if calibration == "asymptotic":
        return False, "requested"
    if calibration == "monte-carlo":
        return True, f"requested; {PERMUTATION}"
    if smallest < MIN_EFFECTIVE_COUNT:
        return True, (
            f"an expected cell count is {smallest:.3g} < {MIN_EFFECTIVE_COUNT:g}; {PERMUTATION}"
        )
    return False, f"every expected cell count is >= {MIN_EFFECTIVE_COUNT:g}"


def public_coin_power(
    mech: PublicCoinBit, p_a: np.ndarray, p_b: np.ndarray, n_a: float, n_b: float, alpha: float
) -> float:
    """Asymptotic power for the survey's public subsets: noncentral chi-square(L) with
    ``nu = sum_l (n_a n_b / (N L)) (mu_l^A - mu_l^B)^2 / (mu_l (1 - mu_l))``, each group holding
    1/L of each sample and mu_l its pooled bit probability."""
    mu_a, mu_b = mech.bit_probabilities(p_a), mech.bit_probabilities(p_b)
    total = n_a + n_b
    mu = (n_a * mu_a + n_b * mu_b) / total
    nu = float(np.sum(n_a * n_b / (total * mech.groups) * (mu_a - mu_b) ** 2 / (mu * (1 - mu))))
    dof = mech.groups
    return float(stats.ncx2.sf(stats.chi2.isf(alpha, dof), dof, nu))
