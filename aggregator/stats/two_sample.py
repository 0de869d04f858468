"""Two-sample (homogeneity) tests: did two groups with a public label answer alike?

H0: the true answers of group A and group B have the same distribution p (unknown). Both groups
must use the same mechanism with the same parameters. docs/two-sample.md derives the nulls:

* randomized response: the classical homogeneity chi-square on the 2 x k table of privatized
  counts (under H0 both rows are multinomials with the same cell probabilities a0 + a1 p); its
  Monte Carlo null permutes the pooled privatized reports between the groups, which from the
  counts alone is a multivariate hypergeometric draw: exact at every n;
* flip components, Gaussian, Laplace: ``n_a n_b / N * d^T W(p_bar) d`` with d the difference of
  the two de-biased histograms and W the projected metric of the mechanism at the pooled
  estimate p_bar (on the simplex), chi-square(k - 1) in the limit; its Monte Carlo null is a
  parametric bootstrap: both groups drawn from the mechanism's exact aggregate sampler at p_bar;
* the support-count mechanisms (optimized unary encoding, Hadamard response, subset selection,
  local hashing): the same statistic with their support metric ``c1^2 / (q (1 - q))`` at p_bar
  (Pearson on the difference of the two groups' support frequencies). Its limit is a weighted
  chi-square (the support null weights at p_bar), so ``"auto"`` always simulates: the parametric
  bootstrap at p_bar from the mechanism's exact support-count sampler, except for optimized unary
  encoding and local hashing, whose support bits are (pairwise) independent given the answer:
  there each category's pooled bits are permuted between the groups (the bootstrap over-rejects
  on sparse answers at large eps), and
  subset selection with subsets of one category (d = 1: eps >= ln(k - 1)), whose support
  counts are the counts of one-category reports: permuted exactly as randomized response's;
  ``"asymptotic"`` uses the weighted chi-square (Imhof);
* public-coin one-bit reports: a 2 x 2 homogeneity chi-square per public group, summed
  (``stats/two_sample_public.py``); its Monte Carlo null permutes the pooled bits within each
  group, a hypergeometric draw per group from the counts: exact at every n.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from aggregator.errors import IncompatibleHistogramsError
from aggregator.histogram import Histogram
from aggregator.stats.calibration import (
    MIN_EFFECTIVE_COUNT,
    Choice,
    check_calibration,
    choose,
    simulate_null,
)
from aggregator.stats.channel import (
    is_grouped,
    is_randomized_response,
    is_support,
    project_simplex,
    quadratic_form,
    rough_distribution,
    support_correlation,
)
from aggregator.stats.gof import support_null_law
from aggregator.stats.imhof import weighted_chi2_sf
from aggregator.stats.ltz import ltz_isf, ltz_sf, quadratic_moments
from aggregator.stats.montecarlo import check_draws, monte_carlo_pvalue
from aggregator.stats.result import CalibratedFields, ResultFields, TestResult
from aggregator.stats.two_sample_public import public_coin_power, public_coin_two_sample
from aggregator.stats.validate import (
    check_alpha,
    check_count,
    check_distribution,
    check_finite_statistic,
    check_histogram,
    make_rng,
)
from client.mechanisms import Mechanism, as_public_coin

RR_LABEL = "two-sample homogeneity chi-square on privatized counts"
DEBIASED_LABEL = "two-sample projected chi-square on the difference of de-biased histograms"
SUPPORT_LABEL = "two-sample Pearson on the difference of support frequencies"


def two_sample(
    hist_a: Histogram,
    hist_b: Histogram,
    alpha: float = 0.05,
    *,
    calibration: str = "auto",
    rng: np.random.Generator | int | None = None,
    n_draws: int = 999,
) -> TestResult:
    """Test H0: groups A and B have the same answer distribution, from their reports only.

    ``expected`` and ``observed`` of the result are group A's: its sufficient statistic and its
    expected value under the pooled estimate.

    Parameters
    ----------
    hist_a, hist_b : Histogram
        The two groups' sufficient statistics, of the same mechanism with the same parameters.
    alpha : float, default 0.05
        Level of the test, in (0, 1).
    calibration : {"auto", "asymptotic", "monte-carlo"}, default "auto"
        ``"asymptotic"``: chi-square(k - 1); public-coin reports: chi-square(number of informative
        public groups). ``"monte-carlo"``: ``n_draws`` null draws, a permutation of the pooled
        reports for randomized response and public-coin bits (exact), a parametric bootstrap at
        the pooled estimate otherwise. ``"auto"``: asymptotic only where every expected
        privatized count of both groups is at least 5; Laplace noise always simulated.
    rng : numpy.random.Generator or int, optional
        Randomness of a simulated null; a seed makes it reproducible.
    n_draws : int, default 999
        Number of null draws.

    Returns
    -------
    TestResult
        ``n`` is the total number of reports of both groups; ``dof`` is None when the null was
        simulated.

    Raises
    ------
    IncompatibleHistogramsError
        The groups use different mechanisms or parameters.
    InvalidInputError
        A malformed ``alpha``, ``calibration``, ``rng`` or ``n_draws``.
    InsufficientDataError
        A group with zero reports.

    References
    ----------
    docs/two-sample.md (the nulls); the large-domain spec §3 (two-sample tests); the projected
    metric of local-chi-square-tests spec §2.1 and [Kifer2017]; [Imhof1961] for the support-count
    law.

    Examples
    --------
    Two groups answered a 4-category question with randomized response at epsilon = 1:

    >>> from aggregator.histogram import Histogram
    >>> from aggregator.stats import two_sample
    >>> from client.mechanisms import RandomizedResponse
    >>> rr = RandomizedResponse(k=4, epsilon=1.0)
    >>> group_a = Histogram(rr, 2000, [621, 492, 473, 414])
    >>> group_b = Histogram(rr, 2000, [510, 498, 505, 487])
    >>> result = two_sample(group_a, group_b)
    >>> result.dof, result.reject, result.n
    (3, True, 4000)
    >>> two_sample(group_a, group_a, calibration="monte-carlo", rng=0).reject
    False
    """
    hist_a = check_histogram(hist_a)
    hist_b = check_histogram(hist_b)
    check_same_mechanism(hist_a.mechanism, hist_b.mechanism)
    alpha = check_alpha(alpha)
    calibration = check_calibration(calibration)
    n_draws = check_draws(n_draws, alpha)
    if is_grouped(hist_a.mechanism):
        return public_coin_two_sample(hist_a, hist_b, alpha, calibration, rng, n_draws)
    if is_randomized_response(hist_a.mechanism):
        return _randomized_response(hist_a, hist_b, alpha, calibration, rng, n_draws)
    return _debiased(hist_a, hist_b, alpha, calibration, rng, n_draws)


def check_same_mechanism(a: Mechanism, b: Mechanism) -> None:
    """Both groups must be randomized by the same mechanism with the same parameters."""
    if a == b:
        return
    if type(a) is not type(b):
        why = f"group A uses {a.name}, group B uses {b.name}"
    elif a.k != b.k:
        why = f"group A has {a.k} categories, group B has {b.k}"
    elif a.describe() != b.describe():
        why = f"group A is {a.describe()}, group B is {b.describe()}"
    else:  # a parameter describe() leaves out, e.g. a public-coin seed
        why = f"group A is {a!r}, group B is {b!r}"
    raise IncompatibleHistogramsError(
        f"two-sample test needs the same question definition (mechanism and parameters): {why}"
    )


def _randomized_response(hist_a, hist_b, alpha, calibration, rng, n_draws) -> TestResult:
    n_a, n_b = hist_a.n, hist_b.n
    pooled = hist_a.values + hist_b.values
    cells = pooled > 0
    share = pooled / (n_a + n_b)
    statistic_of = _homogeneity(n_a, n_b, pooled)
    statistic = float(statistic_of(hist_a.values[None, :])[0])
    dof = int(cells.sum()) - 1
    common = _common(hist_a, hist_b, alpha, n_a * share, RR_LABEL)
    if dof < 1:
        return TestResult(
            0.0,
            1.0,
            None,
            reject=False,
            inconclusive=True,
            reason="every report of both groups is in one category",
            **common,
        )
    smallest = min(n_a, n_b) * float(share[cells].min())
    choice = count_choice(calibration, smallest, "permutation of the pooled privatized reports")
    calibrated = CalibratedFields(
        **common, calibration=choice.calibration, calibration_reason=choice.reason
    )
    if choice.simulated:
        colors = pooled.astype(np.int64)
        draws = make_rng(rng).multivariate_hypergeometric(colors, n_a, size=n_draws)
        pvalue = monte_carlo_pvalue(statistic, statistic_of(draws.astype(float)))
        return TestResult(
            statistic, pvalue, None, reject=pvalue <= alpha, n_draws=n_draws, **calibrated
        )
    pvalue = float(stats.chi2.sf(statistic, dof))
    return TestResult(statistic, pvalue, dof, reject=pvalue <= alpha, **calibrated)


def _homogeneity(n_a: int, n_b: int, pooled: np.ndarray):
    """Pearson's homogeneity statistic of the 2 x k table as a function of group A's counts
    (rows of (m, k)); group B's are the pooled counts minus A's."""
    cells = pooled > 0
    total = n_a + n_b
    expected_a = n_a * pooled[cells] / total
    expected_b = n_b * pooled[cells] / total

    def statistic_of(counts_a: np.ndarray) -> np.ndarray:
        a = counts_a[:, cells]
        b = pooled[cells] - a
        return np.sum((a - expected_a) ** 2 / expected_a + (b - expected_b) ** 2 / expected_b, -1)

    return statistic_of


def _debiased(hist_a, hist_b, alpha, calibration, rng, n_draws) -> TestResult:
    mech = hist_a.mechanism
    n_a, n_b = hist_a.n, hist_b.n
    p_bar = pooled_estimate(hist_a.values + hist_b.values, n_a + n_b, mech)
    statistic = float(_statistic(mech, n_a, n_b, hist_a.values, hist_b.values)[0])
    check_finite_statistic(statistic)
    label = SUPPORT_LABEL if is_support(mech) else DEBIASED_LABEL
    common = _common(hist_a, hist_b, alpha, n_a * mech.report_mean(p_bar), label)
    if is_support(mech) and calibration == "auto":
        choice = Choice("monte-carlo", "support counts: a weighted chi-square limit")
    else:
        choice = choose(calibration, mech, min(n_a, n_b), p_bar, composite=False)
    if choice.simulated:
        generator = make_rng(rng)
        pooled = hist_a.values + hist_b.values
        if mech.exchangeable_pairs and mech.support_size is None:  # OUE, local hashing
            reason = f"{choice.reason}; permutation of each category's pooled bits"
            draws_a, draws_b = _permute_bits(pooled, n_a, n_b, generator, n_draws)
        elif mech.support_size == 1:  # subset selection with d = 1
            reason = f"{choice.reason}; permutation of the pooled one-category reports"
            colors = np.rint(pooled).astype(np.int64)
            draws_a = generator.multivariate_hypergeometric(colors, n_a, size=n_draws)
            draws_a, draws_b = draws_a.astype(float), (colors - draws_a).astype(float)
        else:
            reason = f"{choice.reason}; parametric bootstrap at the pooled estimate"
            draws_a = simulate_null(mech, n_a, p_bar, generator, n_draws)
            draws_b = simulate_null(mech, n_b, p_bar, generator, n_draws)
        pvalue = monte_carlo_pvalue(statistic, _statistic(mech, n_a, n_b, draws_a, draws_b))
        calibrated = CalibratedFields(
            **common, calibration="monte-carlo", calibration_reason=reason
        )
        return TestResult(
            statistic, pvalue, None, reject=pvalue <= alpha, n_draws=n_draws, **calibrated
        )
    calibrated = CalibratedFields(
        **common, calibration="asymptotic", calibration_reason=choice.reason
    )
    if is_support(mech):
        pvalue = weighted_chi2_sf(statistic, support_null_law(mech, p_bar))
        return TestResult(statistic, pvalue, None, reject=pvalue <= alpha, **calibrated)
    dof = mech.k - 1
    pvalue = float(stats.chi2.sf(statistic, dof))
    return TestResult(statistic, pvalue, dof, reject=pvalue <= alpha, **calibrated)


def _permute_bits(pooled: np.ndarray, n_a: int, n_b: int, rng: np.random.Generator, m: int):
    """Optimized unary encoding, local hashing: group A's support counts when each category's
    pooled support bits are split at random between the groups (hypergeometric per category), and
    group B's the rest. Exact for each category; the categories are drawn independently, which
    leaves out the weak dependence between a report's bits. Given the answer, OUE's bits are
    independent and local hashing's support bits pairwise independent (its hash family is 3-wise
    independent), so that dependence runs only through the answer: correlation
    -c1^2 p_j p_l / (sd_j sd_l), the same second moments the statistic's law depends on."""
    ones = np.rint(pooled).astype(np.int64)
    draws_a = rng.hypergeometric(ones, n_a + n_b - ones, n_a, size=(m, ones.size))
    return draws_a.astype(float), (ones - draws_a).astype(float)


def pooled_estimate(values: np.ndarray, n: int, mech: Mechanism) -> np.ndarray:
    """The pooled estimate of p (rows of ``values``), projected onto the simplex."""
    return project_simplex(rough_distribution(values, n, mech))


def _statistic(mech, n_a: int, n_b: int, values_a, values_b) -> np.ndarray:
    """``n_a n_b / N * d^T W(p_bar) d`` per row of the stacked sufficient statistics."""
    values_a = np.atleast_2d(values_a)
    values_b = np.atleast_2d(values_b)
    total = n_a + n_b
    p_bar = pooled_estimate(values_a + values_b, total, mech)
    d = _difference(mech, values_a, n_a, values_b, n_b)
    return n_a * n_b / total * quadratic_form(mech, d, p_bar, projected=True)


def _difference(mech, values_a, n_a: int, values_b, n_b: int) -> np.ndarray:
    """The difference of the two groups' de-biased histograms (the offset cancels)."""
    return (values_a / n_a - values_b / n_b) / mech.slope


def count_choice(calibration: str, smallest: float, simulated: str) -> Choice:
    """Randomized response: asymptotic where every expected count of both rows is >= 5."""
    if calibration == "asymptotic":
        return Choice("asymptotic", "requested")
    if calibration == "monte-carlo":
        return Choice("monte-carlo", f"requested; {simulated}")
    if smallest < MIN_EFFECTIVE_COUNT:
        return Choice(
            "monte-carlo",
            f"an expected privatized count is {smallest:.3g} < {MIN_EFFECTIVE_COUNT:g}; "
            f"{simulated}",
        )
    return Choice("asymptotic", "diagnostics passed")


def _common(
    hist_a: Histogram, hist_b: Histogram, alpha: float, expected_a: np.ndarray, label: str
) -> ResultFields:
    return ResultFields(
        method=label,
        n=hist_a.n + hist_b.n,
        alpha=alpha,
        expected=np.asarray(expected_a, dtype=float),
        observed=hist_a.values.copy(),
        mechanism=hist_a.mechanism.describe(),
    )


def two_sample_power(
    mechanism: Mechanism,
    p_a: np.ndarray,
    p_b: np.ndarray,
    sizes: tuple[int, int],
    alpha: float = 0.05,
) -> float:
    """Asymptotic power of ``two_sample`` with group sizes ``sizes``: noncentral chi-square(k - 1)
    with ``nu = n_a n_b / N * (p_a - p_b)^T W(p_bar) (p_a - p_b)``, p_bar the pooled mixture
    (support-count mechanisms: their weighted noncentral chi-square, by the four-cumulant law of
    stats/ltz.py; public-coin reports: noncentral chi-square(L) over the survey's public
    subsets).

    Parameters
    ----------
    mechanism : Mechanism
        The mechanism both groups use, with its parameters.
    p_a, p_b : array_like of float, shape (k,)
        The true answer distributions of groups A and B under the alternative.
    sizes : tuple of int
        ``(n_a, n_b)``, the numbers of reports of the two groups.
    alpha : float, default 0.05
        Level of the planned test.

    Returns
    -------
    float
        The asymptotic probability, in [0, 1], that ``two_sample`` rejects.

    Raises
    ------
    InvalidInputError
        A malformed ``p_a``, ``p_b``, group size or ``alpha``.

    References
    ----------
    docs/two-sample.md; local-chi-square-tests spec §5 (noncentral chi-square power);
    [Liu2009] for the support-count mechanisms.

    Examples
    --------
    >>> from aggregator.stats import two_sample_power
    >>> from client.mechanisms import RandomizedResponse
    >>> rr = RandomizedResponse(k=4, epsilon=1.0)
    >>> p_a, p_b = [0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]
    >>> round(two_sample_power(rr, p_a, p_b, (2000, 2000)), 3)
    0.961
    >>> two_sample_power(rr, p_a, p_b, (500, 500)) < 0.961
    True
    """
    alpha = check_alpha(alpha)
    p_a = check_distribution(p_a, mechanism.k, "p_a")
    p_b = check_distribution(p_b, mechanism.k, "p_b")
    n_a, n_b = (check_count(n, name) for n, name in zip(sizes, ("n_a", "n_b"), strict=True))
    if is_grouped(mechanism):
        return public_coin_power(as_public_coin(mechanism), p_a, p_b, n_a, n_b, alpha)
    p_bar = (n_a * p_a + n_b * p_b) / (n_a + n_b)
    if is_support(mechanism):
        scale = np.sqrt(np.diag(mechanism.report_covariance(p_bar)))
        shift = mechanism.slope * (p_a - p_b) / scale * np.sqrt(n_a * n_b / (n_a + n_b))
        moments = quadratic_moments(support_correlation(mechanism, p_bar), shift)
        return ltz_sf(ltz_isf(alpha, moments), moments, 1.0)
    nu = n_a * n_b / (n_a + n_b) * float(quadratic_form(mechanism, p_a - p_b, p_bar))
    dof = mechanism.k - 1
    return float(stats.ncx2.sf(stats.chi2.isf(alpha, dof), dof, nu))
