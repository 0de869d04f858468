"""k-sample homogeneity: did G >= 2 groups with a public label answer alike?

H0: every group's true answers follow one distribution p (unknown); all groups use the same
mechanism with the same parameters. The statistics generalize the two-sample ones
(docs/two-sample.md, "More than two groups"), and equal them at G = 2:

* randomized response: Pearson's homogeneity chi-square on the G x k table of privatized
  counts, chi-square((G - 1)(cells - 1)); its Monte Carlo null permutes the pooled privatized
  reports among the groups (a multivariate hypergeometric draw per group, given the ones
  before): exact at every n;
* flip components, Gaussian, Laplace and the support-count mechanisms:
  ``sum_g n_g (p_g - p_bar)^T W(p_bar) (p_g - p_bar)`` with p_g the de-biased histograms, p_bar
  the pooled estimate on the simplex and W the two-sample metric. Its limit is G - 1 independent
  copies of the two-sample law: chi-square((G - 1)(k - 1)), or for support counts the weighted
  chi-square whose weights each appear G - 1 times. Monte Carlo nulls as for two samples: each
  category's pooled support bits permuted among the groups (optimized unary encoding, local
  hashing), the one-category reports permuted (subset selection with d = 1), otherwise a
  parametric bootstrap at p_bar;
* public-coin one-bit reports: a G x 2 homogeneity chi-square per public group (the samples
  with a report in it), summed; chi-square(sum over informative public groups of (G_l - 1)); its
  Monte Carlo null permutes each public group's pooled bits among the samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from scipy import stats

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats.calibration import Choice, check_calibration, choose, simulate_null
from aggregator.stats.channel import (
    is_grouped,
    is_randomized_response,
    is_support,
    quadratic_form,
    support_correlation,
)
from aggregator.stats.gof import support_null_law
from aggregator.stats.imhof import weighted_chi2_sf
from aggregator.stats.low_rank_law import LowRankLaw
from aggregator.stats.ltz import QuadraticMoments, ltz_isf, ltz_sf, quadratic_moments
from aggregator.stats.montecarlo import check_draws, monte_carlo_pvalue
from aggregator.stats.result import CalibratedFields, ResultFields, TestResult
from aggregator.stats.two_sample import check_same_mechanism, count_choice, pooled_estimate
from aggregator.stats.validate import (
    check_alpha,
    check_count,
    check_distribution,
    check_finite_statistic,
    check_histogram,
    make_rng,
)
from client.mechanisms import Mechanism, as_public_coin

RR_LABEL = "k-sample homogeneity chi-square on privatized counts"
DEBIASED_LABEL = "k-sample projected chi-square on the de-biased histograms"
SUPPORT_LABEL = "k-sample Pearson on the support frequencies"
PUBLIC_LABEL = "k-sample grouped homogeneity chi-square on public-coin bits"
PUBLIC_PERMUTATION = "permutation of the pooled bits within each public group"


def k_sample(
    hists: Sequence[Histogram],
    alpha: float = 0.05,
    *,
    calibration: str = "auto",
    rng: np.random.Generator | int | None = None,
    n_draws: int = 999,
) -> TestResult:
    """Test H0: the groups have one answer distribution, from their reports only.

    ``expected`` and ``observed`` of the result are the first group's: its sufficient statistic
    and its expected value under the pooled estimate.

    Parameters
    ----------
    hists : sequence of Histogram
        Two or more groups' sufficient statistics, of one mechanism with the same parameters.
    alpha : float, default 0.05
        Level of the test, in (0, 1).
    calibration : {"auto", "asymptotic", "monte-carlo"}, default "auto"
        As for ``two_sample``: ``"auto"`` keeps the chi-square limit where every expected
        privatized count is at least 5 and simulates support counts and Laplace noise.
    rng : numpy.random.Generator or int, optional
        Randomness of a simulated null; a seed makes it reproducible.
    n_draws : int, default 999
        Number of null draws.

    Returns
    -------
    TestResult
        ``n`` is the total number of reports; ``dof`` is None when the null was simulated or is a
        weighted chi-square.

    Raises
    ------
    IncompatibleHistogramsError
        The groups use different mechanisms or parameters.
    InvalidInputError
        Fewer than two groups, or a malformed ``alpha``, ``calibration``, ``rng`` or
        ``n_draws``.
    InsufficientDataError
        A group with zero reports.

    References
    ----------
    docs/two-sample.md; the large-domain spec §3 (two-sample tests), whose statistic is the
    G = 2 case; [Imhof1961] for the support-count law.

    Examples
    --------
    Three clinics answered a 3-category question with randomized response at epsilon = 1:

    >>> from aggregator.histogram import Histogram
    >>> from aggregator.stats import k_sample
    >>> from client.mechanisms import RandomizedResponse
    >>> rr = RandomizedResponse(k=3, epsilon=1.0)
    >>> counts = [[420, 300, 280], [330, 340, 330], [340, 320, 340]]
    >>> clinics = [Histogram(rr, 1000, c) for c in counts]
    >>> result = k_sample(clinics)
    >>> result.dof, result.reject, result.n
    (4, True, 3000)
    """
    if isinstance(hists, Histogram) or not isinstance(hists, Sequence) or len(hists) < 2:
        raise InvalidInputError("k_sample needs a sequence of at least two histograms")
    hists = [check_histogram(h) for h in hists]
    for other in hists[1:]:
        check_same_mechanism(hists[0].mechanism, other.mechanism)
    alpha = check_alpha(alpha)
    calibration = check_calibration(calibration)
    n_draws = check_draws(n_draws, alpha)
    if is_grouped(hists[0].mechanism):
        return _public_coin(hists, alpha, calibration, rng, n_draws)
    if is_randomized_response(hists[0].mechanism):
        return _randomized_response(hists, alpha, calibration, rng, n_draws)
    return _debiased(hists, alpha, calibration, rng, n_draws)


def _fields(hists: list[Histogram], alpha: float, expected: np.ndarray, label: str) -> ResultFields:
    return ResultFields(
        method=label,
        n=sum(h.n for h in hists),
        alpha=alpha,
        expected=np.asarray(expected, dtype=float),
        observed=hists[0].values.copy(),
        mechanism=hists[0].mechanism.describe(),
    )


def _permuted(colors: np.ndarray, sizes: Sequence[int], rng: np.random.Generator, m: int):
    """``m`` draws of the groups' counts (m, G, k) when the pooled reports (``colors``: counts per
    category) are dealt at random to groups of ``sizes``: exact, one group after the other."""
    out = np.empty((m, len(sizes), colors.size))
    for draw in range(m):
        left = colors.copy()
        for g, size in enumerate(sizes[:-1]):
            taken = rng.multivariate_hypergeometric(left, size)
            out[draw, g] = taken
            left -= taken
        out[draw, -1] = left
    return out


def _split_bits(ones: np.ndarray, total: int, sizes: Sequence[int], rng, m: int) -> np.ndarray:
    """``m`` draws (m, G, len(ones)) of the groups' ones when each column's pooled ones (of
    ``total`` reports) are dealt at random to groups of ``sizes``, columns independently."""
    ones = np.broadcast_to(np.rint(ones).astype(np.int64), (m, ones.size)).copy()
    rest = np.broadcast_to(np.asarray(total, dtype=np.int64) - ones, ones.shape).copy()
    out = np.empty((m, len(sizes), ones.shape[1]))
    for g, size in enumerate(sizes[:-1]):
        size = np.minimum(
            np.broadcast_to(np.asarray(size, dtype=np.int64), ones.shape), ones + rest
        )
        taken = rng.hypergeometric(ones, rest, size)
        out[:, g] = taken
        ones, rest = ones - taken, rest - (size - taken)
    out[:, -1] = ones
    return out


def _randomized_response(hists, alpha, calibration, rng, n_draws) -> TestResult:
    sizes = [h.n for h in hists]
    table = np.stack([h.values for h in hists])
    pooled = table.sum(axis=0)
    total = sum(sizes)
    cells = pooled > 0
    expected = np.outer(sizes, pooled[cells]) / total

    def statistic_of(counts: np.ndarray) -> np.ndarray:
        return np.sum((counts[..., cells] - expected) ** 2 / expected, axis=(-2, -1))

    statistic = float(statistic_of(table))
    dof = (len(hists) - 1) * (int(cells.sum()) - 1)
    common = _fields(hists, alpha, sizes[0] * pooled / total, RR_LABEL)
    if dof < 1:
        return TestResult(
            0.0,
            1.0,
            None,
            reject=False,
            inconclusive=True,
            reason="every report of every group is in one category",
            **common,
        )
    smallest = float(expected.min())
    choice = count_choice(calibration, smallest, "permutation of the pooled privatized reports")
    calibrated = CalibratedFields(
        **common, calibration=choice.calibration, calibration_reason=choice.reason
    )
    if choice.simulated:
        draws = _permuted(pooled.astype(np.int64), sizes, make_rng(rng), n_draws)
        pvalue = monte_carlo_pvalue(statistic, statistic_of(draws))
        return TestResult(
            statistic, pvalue, None, reject=pvalue <= alpha, n_draws=n_draws, **calibrated
        )
    pvalue = float(stats.chi2.sf(statistic, dof))
    return TestResult(statistic, pvalue, dof, reject=pvalue <= alpha, **calibrated)


def _statistic(mech: Mechanism, sizes: Sequence[int], values: np.ndarray) -> np.ndarray:
    """``sum_g n_g (p_g - p_bar)^T W(p_bar) (p_g - p_bar)`` per draw of ``values`` (m, G, k)."""
    values = np.asarray(values, dtype=float)
    if values.ndim == 2:
        values = values[None]
    total = sum(sizes)
    pooled = values.sum(axis=1)
    p_bar = pooled_estimate(pooled, total, mech)
    statistic = np.zeros(values.shape[0])
    for g, n in enumerate(sizes):
        d = (values[:, g] / n - pooled / total) / mech.slope
        statistic += n * quadratic_form(mech, d, p_bar, projected=True)
    return statistic


def _debiased(hists, alpha, calibration, rng, n_draws) -> TestResult:
    mech = hists[0].mechanism
    sizes = [h.n for h in hists]
    table = np.stack([h.values for h in hists])
    pooled = table.sum(axis=0)
    total = sum(sizes)
    p_bar = pooled_estimate(pooled, total, mech)
    statistic = float(_statistic(mech, sizes, table)[0])
    check_finite_statistic(statistic)
    label = SUPPORT_LABEL if is_support(mech) else DEBIASED_LABEL
    common = _fields(hists, alpha, sizes[0] * mech.report_mean(p_bar), label)
    if is_support(mech) and calibration == "auto":
        choice = Choice("monte-carlo", "support counts: a weighted chi-square limit")
    else:
        choice = choose(calibration, mech, min(sizes), p_bar, composite=False)
    if choice.simulated:
        generator = make_rng(rng)
        if mech.exchangeable_pairs and mech.support_size is None:  # OUE, local hashing
            reason = f"{choice.reason}; permutation of each category's pooled bits"
            draws = _split_bits(pooled, total, sizes, generator, n_draws)
        elif mech.support_size == 1:  # subset selection with d = 1
            reason = f"{choice.reason}; permutation of the pooled one-category reports"
            draws = _permuted(np.rint(pooled).astype(np.int64), sizes, generator, n_draws)
        else:
            reason = f"{choice.reason}; parametric bootstrap at the pooled estimate"
            draws = np.stack(
                [simulate_null(mech, n, p_bar, generator, n_draws) for n in sizes], axis=1
            )
        pvalue = monte_carlo_pvalue(statistic, _statistic(mech, sizes, draws))
        calibrated = CalibratedFields(
            **common, calibration="monte-carlo", calibration_reason=reason
        )
        return TestResult(
            statistic, pvalue, None, reject=pvalue <= alpha, n_draws=n_draws, **calibrated
        )
    calibrated = CalibratedFields(
        **common, calibration="asymptotic", calibration_reason=choice.reason
    )
    copies = len(hists) - 1
    if is_support(mech):
        pvalue = weighted_chi2_sf(statistic, _repeated(support_null_law(mech, p_bar), copies))
        return TestResult(statistic, pvalue, None, reject=pvalue <= alpha, **calibrated)
    dof = copies * (mech.k - 1)
    pvalue = float(stats.chi2.sf(statistic, dof))
    return TestResult(statistic, pvalue, dof, reject=pvalue <= alpha, **calibrated)


def _repeated(law: np.ndarray | LowRankLaw, copies: int) -> np.ndarray | LowRankLaw:
    """The law of the sum of ``copies`` independent copies of a weighted chi-square."""
    if isinstance(law, LowRankLaw):
        return replace(law, copies=law.copies * copies)
    return np.tile(law, copies)


def _public_coin(hists, alpha, calibration, rng, n_draws) -> TestResult:
    mech = as_public_coin(hists[0].mechanism)
    parts = [np.split(h.values, 2) for h in hists]
    sizes = np.stack([size for size, _ in parts])  # (G, L)
    ones = np.stack([one for _, one in parts])
    total, pooled = sizes.sum(axis=0), ones.sum(axis=0)
    present = (sizes > 0).sum(axis=0)
    used = (present >= 2) & (pooled > 0) & (pooled < total)
    if not used.any():
        raise InvalidInputError(
            f"none of the {mech.groups} public groups is informative: each has reports from "
            "fewer than two samples, or all its bits are equal"
        )
    dropped = mech.groups - int(used.sum())
    m, t, big = sizes[:, used], pooled[used], total[used]
    share = np.divide(pooled, total, out=np.zeros_like(pooled), where=total > 0)
    center = m * t / big
    scale = np.divide(
        big**2, m * t * (big - t), out=np.zeros_like(center), where=m > 0
    )  # a sample absent from a public group adds nothing

    def statistic_of(draws: np.ndarray) -> np.ndarray:
        return np.sum(scale * (draws - center) ** 2, axis=(-2, -1))

    statistic = float(statistic_of(ones[:, used]))
    common = _fields(hists, alpha, np.concatenate([sizes[0], sizes[0] * share]), PUBLIC_LABEL)
    left_out = (
        f"{dropped} of {mech.groups} public groups left out: reports from fewer than two "
        "samples, or all their bits equal"
        if dropped
        else ""
    )
    cells = np.minimum(center, m - center)[m > 0]
    smallest = float(cells.min())
    choice = count_choice(calibration, smallest, PUBLIC_PERMUTATION)
    if choice.simulated:
        draws = _split_bits(t, big, list(m), make_rng(rng), n_draws)
        pvalue = monte_carlo_pvalue(statistic, statistic_of(draws))
        return TestResult(
            statistic,
            pvalue,
            None,
            reject=pvalue <= alpha,
            calibration="monte-carlo",
            calibration_reason=choice.reason,
            n_draws=n_draws,
            reason=left_out,
            **common,
        )
    dof = int(np.sum(present[used] - 1))
    pvalue = float(stats.chi2.sf(statistic, dof))
    return TestResult(
        statistic,
        pvalue,
        dof,
        reject=pvalue <= alpha,
        calibration="asymptotic",
        calibration_reason=choice.reason,
        reason=left_out,
        **common,
    )


def k_sample_power(
    mechanism: Mechanism,
    distributions: Sequence[Sequence[float]] | np.ndarray,
    sizes: Sequence[int],
    alpha: float = 0.05,
) -> float:
    """Asymptotic power of ``k_sample``: noncentral chi-square((G - 1)(k - 1)) with
    ``nu = sum_g n_g (p_g - p_bar)^T W(p_bar) (p_g - p_bar)``, p_bar the size-weighted mixture
    (support counts: their weighted noncentral law by the four-cumulant fit of stats/ltz.py, G - 1
    copies; public-coin reports: noncentral chi-square(L (G - 1))).

    Parameters
    ----------
    mechanism : Mechanism
        The mechanism every group uses.
    distributions : sequence of array_like, shape (G, k)
        Each group's true answer distribution under the alternative.
    sizes : sequence of int
        The groups' numbers of reports, in the same order.
    alpha : float, default 0.05
        Level of the planned test.

    Returns
    -------
    float
        The asymptotic probability, in [0, 1], that ``k_sample`` rejects.

    Raises
    ------
    InvalidInputError
        Fewer than two groups, sizes that do not match them, or a malformed distribution, size
        or ``alpha``.

    Examples
    --------
    >>> from aggregator.stats import k_sample_power
    >>> from client.mechanisms import RandomizedResponse
    >>> rr = RandomizedResponse(k=3, epsilon=1.0)
    >>> ps = [[0.5, 0.3, 0.2], [0.4, 0.3, 0.3], [0.4, 0.35, 0.25]]
    >>> round(k_sample_power(rr, ps, [1000, 1000, 1000]), 3) > 0.5
    True
    """
    alpha = check_alpha(alpha)
    if len(distributions) < 2 or len(distributions) != len(sizes):
        raise InvalidInputError("k_sample_power needs two or more groups, one size per group")
    ps = np.stack(
        [
            check_distribution(p, mechanism.k, f"distributions[{g}]")
            for g, p in enumerate(distributions)
        ]
    )
    n = np.array([check_count(s, f"sizes[{g}]") for g, s in enumerate(sizes)], dtype=float)
    weights = n / n.sum()
    p_bar = weights @ ps
    copies = len(n) - 1
    if is_grouped(mechanism):
        coin = as_public_coin(mechanism)
        mu = np.stack([coin.bit_probabilities(p) for p in ps])
        mu_bar = weights @ mu
        nu = float(np.sum(n[:, None] / coin.groups * (mu - mu_bar) ** 2 / (mu_bar * (1 - mu_bar))))
        dof = coin.groups * copies
        return float(stats.ncx2.sf(stats.chi2.isf(alpha, dof), dof, nu))
    if is_support(mechanism):
        scale = np.sqrt(np.diag(mechanism.report_covariance(p_bar)))
        r = support_correlation(mechanism, p_bar)
        contrasts = _contrasts(weights)  # (G - 1, G), orthonormal, orthogonal to sqrt(weights)
        shifts = contrasts @ (np.sqrt(n)[:, None] * ps) * mechanism.slope / scale
        parts = [quadratic_moments(r, shift) for shift in shifts]
        t = parts[0].traces  # the same for every contrast: G - 1 copies
        s = np.sum([part.shifts for part in parts], axis=0)
        moments = QuadraticMoments(
            (copies * t[0], copies * t[1], copies * t[2], copies * t[3]),
            (float(s[0]), float(s[1]), float(s[2]), float(s[3])),
        )
        return ltz_sf(ltz_isf(alpha, moments), moments, 1.0)
    nu = float(np.sum(n * quadratic_form(mechanism, ps - p_bar, p_bar)))
    dof = copies * (mechanism.k - 1)
    return float(stats.ncx2.sf(stats.chi2.isf(alpha, dof), dof, nu))


def _contrasts(weights: np.ndarray) -> np.ndarray:
    """G - 1 orthonormal rows orthogonal to sqrt(weights): the between-group directions."""
    root = np.sqrt(weights)[:, None]
    basis, _ = np.linalg.qr(np.hstack([root, np.eye(root.size)[:, :-1]]))
    return basis[:, 1:].T
