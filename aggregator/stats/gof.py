"""Local goodness-of-fit tests (local-chi-square-tests spec §4.1, §4.2, §4.4, §4.5, §4.8, after
[Rogers2017] Ch. 8; for large domains the large-domain spec §3)."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import special

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats.calibration import check_calibration, choose, simulate_null
from aggregator.stats.channel import (
    debiased,
    extra_variance,
    is_support,
    quadratic_form,
    support_correlation,
)
from aggregator.stats.identity import (
    T1_LABEL,
    T2_LABEL,
    multinomial_frobenius2,
    null_variance,
    support_u_frobenius2,
    t3_test,
    u_statistic,
    u_test,
    unary_frobenius2,
)
from aggregator.stats.imhof import weighted_chi2_sf
from aggregator.stats.low_rank_law import LowRankLaw, exchangeable_null_law
from aggregator.stats.montecarlo import check_draws, monte_carlo_pvalue
from aggregator.stats.result import CalibratedFields, TestResult
from aggregator.stats.validate import (
    check_alpha,
    check_distribution,
    check_finite_statistic,
    check_histogram,
    check_method,
    make_rng,
)
from client.mechanisms import (
    FlipComponents,
    GaussianNoise,
    HadamardResponse,
    LaplaceNoise,
    LocalHashing,
    Mechanism,
    OptimizedUnaryEncoding,
    PublicCoinBit,
    RandomizedResponse,
    SubsetSelection,
    as_exchangeable,
)

GOF_METHODS: dict[type, tuple[str, ...]] = {
    RandomizedResponse: ("pearson", "t2"),
    GaussianNoise: ("projected", "nonprojected", "imhof"),
    LaplaceNoise: ("monte-carlo",),
    FlipComponents: ("projected", "nonprojected", "t1"),
    OptimizedUnaryEncoding: ("pearson", "t1"),
    HadamardResponse: ("pearson", "t2"),
    SubsetSelection: ("pearson", "t2"),
    LocalHashing: ("pearson", "t2"),
    PublicCoinBit: ("t3",),
}
#: The rate-optimal U-statistics (stats/identity.py): always a Monte Carlo null unless
#: calibration="asymptotic" asks for their normal law.
U_METHODS = ("t1", "t2")

_LABELS: dict[tuple[type[Mechanism], str], str] = {
    (RandomizedResponse, "pearson"): "LocalGOF: Pearson chi-square on privatized counts",
    (GaussianNoise, "projected"): "projected chi-square, Gaussian noise (NewStatAsymptGOF)",
    (GaussianNoise, "nonprojected"): "non-projected chi-square, Gaussian noise",
    (GaussianNoise, "imhof"): "noisy Pearson with weighted chi-square null (AsymptGOF, Imhof)",
    (LaplaceNoise, "monte-carlo"): "projected chi-square, Laplace noise",
    (FlipComponents, "projected"): "projected chi-square T_FC, flip components",
    (FlipComponents, "nonprojected"): "non-projected chi-square, flip components",
    (FlipComponents, "t1"): T1_LABEL,
    (RandomizedResponse, "t2"): T2_LABEL,
    (OptimizedUnaryEncoding, "pearson"): "Pearson on support counts, optimized unary encoding",
    (HadamardResponse, "pearson"): "Pearson on support counts, Hadamard response",
    (SubsetSelection, "pearson"): "Pearson on support counts, subset selection",
    (LocalHashing, "pearson"): "Pearson on support counts, optimized local hashing",
    (OptimizedUnaryEncoding, "t1"): "T1: U-statistic on unary reports (optimized unary encoding)",
    (HadamardResponse, "t2"): "T2: U-statistic on support counts (Hadamard response)",
    (SubsetSelection, "t2"): "T2: U-statistic on support counts (subset selection)",
    (LocalHashing, "t2"): "T2: U-statistic on support counts (optimized local hashing)",
}


def goodness_of_fit(
    hist: Histogram,
    p0: np.ndarray,
    alpha: float = 0.05,
    method: str | None = None,
    *,
    calibration: str = "auto",
    rng: np.random.Generator | int | None = None,
    n_draws: int = 999,
) -> TestResult:
    """Test H0: the true answers are distributed as ``p0``, from randomized reports only.

    Methods: randomized response ``pearson``, ``t2``; Gaussian ``projected`` (default),
    ``nonprojected``, ``imhof``; Laplace ``monte-carlo``; flip components ``projected`` (default),
    ``nonprojected``, ``t1``; optimized unary encoding, Hadamard response, subset selection, local
    hashing ``pearson`` (each support count against its binomial variance; asymptotically a
    weighted chi-square, ``support_null_law``) and the U-statistic on the support counts
    (``t1`` for optimized unary encoding, ``t2`` for the others; stats/identity.py,
    ``support_u_frobenius2``); public-coin one-bit reports ``t3`` (the grouped chi-square of
    stats/identity.py: chi-square(L) or L binomials given the sizes). T1 and T2 are the
    rate-optimal U-statistics of stats/identity.py for large k: with ``"auto"`` they always
    simulate their null.

    Parameters
    ----------
    hist : Histogram
        The sufficient statistic of the reports (``Histogram.from_reports`` or built from counts).
    p0 : array_like of float, shape (k,)
        The null distribution of the true answers: non-negative, summing to 1.
    alpha : float, default 0.05
        Level of the test, in (0, 1).
    method : str, optional
        One of the methods above for the histogram's mechanism; None picks its default (the first
        listed).
    calibration : {"auto", "asymptotic", "monte-carlo"}, default "auto"
        ``"asymptotic"``: the chi-square or Imhof law; ``"monte-carlo"``: ``n_draws`` exact null
        draws from the mechanism's aggregate sampler at p0 (exact level at every n); ``"auto"``:
        asymptotic only where the diagnostics of ``stats.calibration`` pass.
    rng : numpy.random.Generator or int, optional
        Randomness of a simulated null; a seed makes the p-value reproducible.
    n_draws : int, default 999
        Number m of null draws of a simulated null; at least the number alpha needs.

    Returns
    -------
    TestResult
        ``statistic``, ``pvalue``, ``dof`` (None when the null was simulated), ``reject`` and the
        calibration used and why.

    Raises
    ------
    InvalidInputError
        A malformed ``p0``, ``alpha``, ``method``, ``calibration``, ``rng`` or ``n_draws``; the
        ``imhof`` method with a zero cell in p0; T1/T2 with fewer than 2 reports.
    InsufficientDataError
        A histogram of zero reports.

    References
    ----------
    [Rogers2017] Ch. 8 (Alg. 18 LocalGOF, Thm 8.2.1-8.2.2, Thm 8.2.10-8.2.11) and
    [Gaboardi2018]; local-chi-square-tests spec §4.1, §4.2, §4.4, §4.5, §4.8; for T1, T2, T3
    the large-domain spec §3 and [Acharya2019Test]; the Imhof law [Imhof1961].

    Examples
    --------
    Randomized response with 4 categories at epsilon = 1; the counts of 2,000 privatized reports
    are tested against the uniform distribution:

    >>> from aggregator.histogram import Histogram
    >>> from aggregator.stats import goodness_of_fit
    >>> from client.mechanisms import LaplaceNoise, RandomizedResponse
    >>> hist = Histogram(RandomizedResponse(k=4, epsilon=1.0), 2000, [621, 492, 473, 414])
    >>> result = goodness_of_fit(hist, [0.25, 0.25, 0.25, 0.25])
    >>> result.dof, round(result.statistic, 2), result.reject
    (3, 45.66, True)
    >>> result.calibration
    'asymptotic'

    Laplace noise always simulates its null; a seed makes the p-value reproducible:

    >>> noisy = Histogram(LaplaceNoise(k=4, epsilon=1.0), 2000, [530.5, 498.25, 505.0, 466.0])
    >>> simulated = goodness_of_fit(noisy, [0.25, 0.25, 0.25, 0.25], rng=0)
    >>> simulated.calibration, simulated.dof, simulated.reject
    ('monte-carlo', None, False)
    """
    hist = check_histogram(hist)
    alpha = check_alpha(alpha)
    calibration = check_calibration(calibration)
    n_draws = check_draws(n_draws, alpha)
    mech = hist.mechanism
    p0 = check_distribution(p0, mech.k)
    kind = type(mech)
    method = check_method(method, GOF_METHODS[kind], mech.name)
    n = hist.n
    if method == "t3":
        return t3_test(hist, p0, alpha, calibration, make_rng(rng), n_draws)
    if method == "imhof" and (p0 <= 0).any():
        raise InvalidInputError(
            "the imhof method divides by p0 and needs every cell > 0; use method='projected'"
        )
    statistic_of = _statistic(mech, method, n, p0)
    statistic = float(statistic_of(hist.values[None, :])[0])
    check_finite_statistic(statistic)
    if method in U_METHODS:
        return _u_test(hist, p0, alpha, method, statistic, statistic_of, calibration, rng, n_draws)
    choice = choose(calibration, mech, n, p0, composite=False)
    common = CalibratedFields(
        method=_LABELS[(kind, method)],
        n=n,
        alpha=alpha,
        expected=n * mech.report_mean(p0),
        observed=hist.values.copy(),
        mechanism=mech.describe(),
        calibration=choice.calibration,
        calibration_reason=choice.reason,
    )
    if choice.simulated:
        draws = simulate_null(mech, n, p0, make_rng(rng), n_draws)
        pvalue = monte_carlo_pvalue(statistic, statistic_of(draws))
        reject = pvalue <= alpha
        return TestResult(statistic, pvalue, None, reject=reject, n_draws=n_draws, **common)
    if method == "imhof":
        weights = np.linalg.eigvalsh(imhof_matrix(p0, extra_variance(mech)))
        pvalue = weighted_chi2_sf(statistic, weights)
        return TestResult(statistic, pvalue, None, reject=pvalue <= alpha, **common)
    if is_support(mech):
        pvalue = weighted_chi2_sf(statistic, support_null_law(mech, p0))
        return TestResult(statistic, pvalue, None, reject=pvalue <= alpha, **common)
    dof = mech.k if method == "nonprojected" else mech.k - 1
    pvalue = float(special.chdtrc(dof, statistic))
    return TestResult(statistic, pvalue, dof, reject=pvalue <= alpha, **common)


def _u_test(hist, p0, alpha, method, statistic, statistic_of, calibration, rng, n_draws):
    """T1 / T2 on the histogram: Monte Carlo from the aggregate sampler at p0."""
    mech, n = hist.mechanism, hist.n
    if n < 2:
        raise InvalidInputError(f"{method.upper()} needs at least 2 reports, got n = {n}")
    q0 = mech.report_mean(p0)
    if is_support(mech):  # a dense k x k covariance: only for the normal law
        asymptotic = calibration == "asymptotic"
        variance0 = null_variance(n, support_u_frobenius2(mech, p0)) if asymptotic else math.nan
    elif method == "t1":
        variance0 = null_variance(n, unary_frobenius2(mech, p0))
    else:
        variance0 = null_variance(n, multinomial_frobenius2(q0))
    generator = make_rng(rng)
    return u_test(
        statistic,
        lambda: statistic_of(simulate_null(mech, n, p0, generator, n_draws)),
        variance0,
        _LABELS[(type(mech), method)],
        n=n,
        alpha=alpha,
        calibration=calibration,
        n_draws=n_draws,
        expected=n * q0,
        observed=hist.values.copy(),
        mechanism=mech.describe(),
    )


def _statistic(mech: Mechanism, method: str, n: int, p0: np.ndarray):
    """The method's statistic as a function of stacked sufficient statistics (m, k) -> (m,)."""
    if method in U_METHODS:
        q0 = mech.report_mean(p0)
        return lambda values: u_statistic(values, n, q0)
    if method == "imhof":
        return lambda values: np.sum((values - n * p0) ** 2 / (n * p0), axis=-1)
    projected = method != "nonprojected"
    return lambda values: n * quadratic_form(mech, debiased(values, n, mech) - p0, p0, projected)


def support_null_law(mech: Mechanism, p0: np.ndarray) -> np.ndarray | LowRankLaw:
    """The null law of the support-count Pearson statistic: for exchangeable mechanisms (OUE, SS,
    local hashing) a ``LowRankLaw`` in O(k); otherwise (Hadamard response) its positive weights,
    an O(k^3) eigendecomposition, so the last few (mechanism, p0) pairs are remembered."""
    p0 = np.asarray(p0, dtype=float)
    if mech.exchangeable_pairs:
        return exchangeable_null_law(as_exchangeable(mech), p0)
    return _support_null_weights(mech, p0.tobytes())


@lru_cache(maxsize=8)
def _support_null_weights(mech: Mechanism, p0: bytes) -> np.ndarray:
    # eigenvalues only: the eigenvectors (planning's noncentralities) cost 5-7x more at k = 2,000
    weights = np.clip(np.linalg.eigvalsh(support_correlation(mech, np.frombuffer(p0))), 0.0, None)
    weights = weights[weights > 1e-12 * weights.max()]
    weights.setflags(write=False)
    return weights


def imhof_matrix(p0: np.ndarray, noise_variance: float) -> np.ndarray:
    """``C = I - sqrt(p0) sqrt(p0)^T + a Diag(p0)^{-1}``: the limit covariance of the noisy
    Pearson residuals, whose eigenvalues weight the null (local-chi-square-tests spec §3.3,
    §4.1)."""
    root = np.sqrt(p0)
    return np.eye(p0.size) - np.outer(root, root) + np.diag(noise_variance / p0)
