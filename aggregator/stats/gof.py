"""Local goodness-of-fit tests (spec sections 4.1, 4.2, 4.4, 4.5, 4.8)."""

from __future__ import annotations

import numpy as np
from scipy import stats

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats.channel import debiased_histogram, extra_variance, quadratic_form
from aggregator.stats.imhof import weighted_chi2_sf
from aggregator.stats.montecarlo import check_draws, monte_carlo_pvalue
from aggregator.stats.result import TestResult
from aggregator.stats.validate import (
    check_alpha,
    check_distribution,
    check_histogram,
    check_method,
    make_rng,
)
from client.mechanisms import FlipComponents, GaussianNoise, LaplaceNoise, RandomizedResponse

GOF_METHODS: dict[type, tuple[str, ...]] = {
    RandomizedResponse: ("pearson",),
    GaussianNoise: ("projected", "nonprojected", "imhof"),
    LaplaceNoise: ("monte-carlo",),
    FlipComponents: ("projected", "nonprojected"),
}

_LABELS = {
    (RandomizedResponse, "pearson"): "LocalGOF: Pearson chi-square on privatized counts",
    (GaussianNoise, "projected"): "projected chi-square, Gaussian noise (NewStatAsymptGOF)",
    (GaussianNoise, "nonprojected"): "non-projected chi-square, Gaussian noise",
    (GaussianNoise, "imhof"): "noisy Pearson with weighted chi-square null (AsymptGOF, Imhof)",
    (LaplaceNoise, "monte-carlo"): "projected chi-square, Laplace noise, exact Monte Carlo null",
    (FlipComponents, "projected"): "projected chi-square T_FC, flip components",
    (FlipComponents, "nonprojected"): "non-projected chi-square, flip components",
}


def goodness_of_fit(
    hist: Histogram,
    p0: np.ndarray,
    alpha: float = 0.05,
    method: str | None = None,
    *,
    rng: np.random.Generator | int | None = None,
    n_draws: int = 999,
) -> TestResult:
    """Test H0: the true answers are distributed as ``p0``, from randomized reports only.

    Methods: randomized response ``pearson``; Gaussian ``projected`` (default), ``nonprojected``,
    ``imhof``; Laplace ``monte-carlo`` (exact level at every n, ``n_draws`` fresh null draws);
    flip components ``projected`` (default), ``nonprojected``.
    """
    hist = check_histogram(hist)
    alpha = check_alpha(alpha)
    mech = hist.mechanism
    p0 = check_distribution(p0, mech.k)
    kind = type(mech)
    method = check_method(method, GOF_METHODS[kind], mech.name)
    n = hist.n
    deviation = debiased_histogram(hist) - p0
    expected = n * mech.report_mean(p0)
    common = dict(
        method=_LABELS[(kind, method)],
        n=n,
        alpha=alpha,
        expected=expected,
        observed=hist.values.copy(),
        mechanism=mech.describe(),
    )

    if method == "imhof":
        statistic, pvalue = _imhof(hist, p0)
        return TestResult(statistic, pvalue, None, reject=pvalue <= alpha, **common)

    projected = method != "nonprojected"
    statistic = float(n * quadratic_form(mech, deviation, p0, projected))
    if method == "monte-carlo":
        n_draws = check_draws(n_draws, alpha)
        draws = mech.simulate_histogram(n, p0, make_rng(rng), size=n_draws)
        null = n * quadratic_form(mech, (draws / n - mech.offset) / mech.slope - p0, p0)
        pvalue = monte_carlo_pvalue(statistic, null)
        return TestResult(statistic, pvalue, None, reject=pvalue <= alpha, **common)

    dof = mech.k - 1 if projected else mech.k
    pvalue = float(stats.chi2.sf(statistic, dof))
    return TestResult(statistic, pvalue, dof, reject=pvalue <= alpha, **common)


def imhof_matrix(p0: np.ndarray, noise_variance: float) -> np.ndarray:
    """``C = I - sqrt(p0) sqrt(p0)^T + a Diag(p0)^{-1}``: the limit covariance of the noisy
    Pearson residuals, whose eigenvalues weight the null (spec 3.3 / 4.1)."""
    root = np.sqrt(p0)
    return np.eye(p0.size) - np.outer(root, root) + np.diag(noise_variance / p0)


def _imhof(hist: Histogram, p0: np.ndarray) -> tuple[float, float]:
    if (p0 <= 0).any():
        raise InvalidInputError(
            "the imhof method divides by p0 and needs every cell > 0; use method='projected'"
        )
    n = hist.n
    statistic = float(np.sum((hist.values - n * p0) ** 2 / (n * p0)))
    weights = np.linalg.eigvalsh(imhof_matrix(p0, extra_variance(hist.mechanism)))
    return statistic, weighted_chi2_sf(statistic, weights)
