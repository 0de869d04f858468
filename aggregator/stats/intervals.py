"""Per-coordinate confidence intervals for the true frequencies that keep at least their nominal
coverage at small n and for sparse large k, and never have zero width (docs/calibration.md).

* Randomized response, flip components and the support-count mechanisms (optimized unary
  encoding, Hadamard response): a category's count (bit sum, support count) is exactly
  Binomial(n, q_j) with q_j = offset + slope * p_j, so the Clopper-Pearson interval for q_j,
  mapped through the increasing map p = (q - offset) / slope, covers p_j with probability at
  least the nominal level at every n and p (exact, conservative).
* Gaussian and Laplace noise, where the de-biased estimate is close to normal (the largest
  skewness over p of a cell's estimate, ``max_p p(1-p)(1-2p) / (p(1-p) + b)^1.5 / sqrt(n)``, is
  at most ``MAX_SKEWNESS``): the score interval ``{p : (x - p)^2 <= z^2 (p (1 - p) + b) / n}``,
  x the de-biased estimate and b the per-report noise variance; for Laplace noise z is raised
  by the Cornish-Fisher term of the noise sum's excess kurtosis (at most 3 / n).
* Gaussian and Laplace noise otherwise (small n, little noise): the sum S = C + N of a
  category's count C ~ Binomial(n, p_j) and the noise sum N. alpha is split in proportion to
  the per-report variances (b for the noise, at most 1/4 for the count): |N| <= t outside
  probability alpha_noise (normal quantile of N's exact variance n b, raised for Laplace noise
  as above), so C lies in [S - t, S + t], and the Clopper-Pearson bounds at level alpha_count of
  the ends of that range bound p_j. Conservative at every n, never empty.

Every interval is then kept inside [0, 1] (``stats.simplex.inside_unit``): cut to [0, 1], which
cannot lower coverage since p_j is in [0, 1], and where it reaches a boundary widened by the
likelihood-ratio interval of the boundary-restricted normal mean, which cannot lower it either.
So no interval lies wholly outside [0, 1], even when the count is below what p_j = 0 gives.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special  # not scipy.stats: ``estimate`` starts in well under a second

from aggregator.histogram import Histogram
from aggregator.stats.calibration import per_report_variance
from aggregator.stats.channel import debiased_histogram, extra_variance, is_binomial
from aggregator.stats.simplex import inside_unit
from client.mechanisms import Mechanism

CLOPPER_PEARSON = "Clopper-Pearson on the privatized counts, mapped through the channel"
SCORE = "score interval with the noise variance"
NOISE_BOUNDED = "noise sum bounded, then Clopper-Pearson on the count"
MAX_SKEWNESS = 0.1


def interval_method(hist: Histogram) -> str:
    if _is_binomial(hist):
        return CLOPPER_PEARSON
    return SCORE if _count_skewness_bound(hist) <= MAX_SKEWNESS else NOISE_BOUNDED


def confidence_intervals(hist: Histogram, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-coordinate (low, high) at level ``confidence``, each coordinate on its own."""
    tail = (1 - confidence) / 2
    if _is_binomial(hist):
        low, high = _clopper_pearson(hist, tail)
    elif _count_skewness_bound(hist) <= MAX_SKEWNESS:
        low, high = _score(hist, tail)
    else:
        low, high = _noise_bounded(hist, tail)
    mech, k = hist.mechanism, hist.k
    at_zero = per_report_variance(mech, np.zeros(1))[0] / hist.n
    at_one = per_report_variance(mech, np.ones(1))[0] / hist.n
    z = _normal_isf(tail)
    x = debiased_histogram(hist)
    return inside_unit(low, high, x, z, np.full(k, at_zero), np.full(k, at_one))


def simultaneous_intervals(hist: Histogram, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Intervals covering all k coordinates at once with probability >= confidence (Bonferroni)."""
    return confidence_intervals(hist, 1 - (1 - confidence) / hist.k)


def _is_binomial(hist: Histogram) -> bool:
    return is_binomial(hist.mechanism)


def _clopper_pearson(hist: Histogram, tail: float) -> tuple[np.ndarray, np.ndarray]:
    n, x = hist.n, hist.values
    with np.errstate(invalid="ignore"):
        q_low = np.where(x > 0, _beta_ppf(tail, x, n - x + 1), 0.0)
        q_high = np.where(x < n, _beta_ppf(1 - tail, x + 1, n - x), 1.0)
    mech = hist.mechanism
    return (q_low - mech.offset) / mech.slope, (q_high - mech.offset) / mech.slope


def _count_skewness_bound(hist: Histogram) -> float:
    """The largest skewness, over p in [0, 1], of a cell's de-biased estimate: the count's
    third cumulant n p (1 - p)(1 - 2 p) over the total variance n (p (1 - p) + b) to 3/2."""
    b = extra_variance(hist.mechanism)
    p = np.linspace(0.0, 0.5, 2001)
    v = p * (1 - p)
    return float(np.max(v * (1 - 2 * p) / (v + b) ** 1.5)) / math.sqrt(hist.n)


def _score(hist: Histogram, tail: float) -> tuple[np.ndarray, np.ndarray]:
    """{p : (x - p)^2 <= z^2 (p (1 - p) + b) / n}, in closed form (a quadratic in p)."""
    n, b = hist.n, extra_variance(hist.mechanism)
    z = _cornish_fisher(_normal_isf(tail), hist.mechanism, n)
    x = debiased_histogram(hist)
    z2 = z * z
    linear = 2 * n * x + z2
    disc = z2 * (4 * n * x * (1 - x) + z2 + 4 * n * b + 4 * z2 * b)
    root = np.sqrt(np.clip(disc, 0.0, None))
    low, high = (linear - root) / (2 * (n + z2)), (linear + root) / (2 * (n + z2))
    wald = z * np.sqrt(b / n)  # x so far outside [0, 1] that no p in it fits
    empty = disc <= 0
    return np.where(empty, x - wald, low), np.where(empty, x + wald, high)


def _cornish_fisher(z: float, mech: Mechanism, n: int) -> float:
    """The normal quantile z corrected for the noise's excess kurtosis (Cornish-Fisher): that
    of a sum of n reports is the mechanism's ``noise_excess_kurtosis`` / n (Laplace: 3 / n)."""
    kurtosis = mech.noise_excess_kurtosis
    if kurtosis:
        z += (kurtosis / n) / 24 * max(z**3 - 3 * z, 0.0)
    return z


def _noise_bounded(hist: Histogram, tail: float) -> tuple[np.ndarray, np.ndarray]:
    """Split alpha = 2 tail between the noise sum and the count: outside an event of probability
    alpha_noise the noise sum is at most t, so the count C lies in [S - t, S + t]; Clopper-Pearson
    at level alpha_count then bounds p. Coverage >= 1 - alpha_noise - alpha_count."""
    mech, n = hist.mechanism, hist.n
    b = extra_variance(mech)
    alpha = 2 * tail
    alpha_noise = alpha * b / (b + 0.25)  # the noise's share of the largest per-report variance
    z = _cornish_fisher(_normal_isf(alpha_noise / 2), mech, n)
    t = z * math.sqrt(n * b)
    sums = hist.values  # count + noise sum, in count units
    x_high = np.clip(np.floor(sums + t), 0, n)
    x_low = np.minimum(np.clip(np.ceil(sums - t), 0, n), x_high)
    count_tail = (alpha - alpha_noise) / 2
    with np.errstate(invalid="ignore"):
        low = np.where(x_low > 0, _beta_ppf(count_tail, x_low, n - x_low + 1), 0.0)
        high = np.where(x_high < n, _beta_ppf(1 - count_tail, x_high + 1, n - x_high), 1.0)
    return low, high


def _beta_ppf(level: float, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The Beta(a, b) quantile (scipy.stats.beta.ppf, without importing scipy.stats)."""
    return special.betaincinv(a, b, level)


def _normal_isf(tail: float) -> float:
    """The standard normal's upper-``tail`` quantile."""
    return float(-special.ndtri(tail))
