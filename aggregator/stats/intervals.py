"""Per-coordinate confidence intervals for the true frequencies that keep at least their nominal
coverage at small n and for sparse large k, and never have zero width (docs/calibration.md).

* Randomized response and flip components: a category's count (or bit sum) is exactly
  Binomial(n, q_j) with q_j = offset + slope * p_j, so the Clopper-Pearson interval for q_j,
  mapped through the increasing map p = (q - offset) / slope, covers p_j with probability at
  least the nominal level at every n and p (exact, conservative).
* Gaussian and Laplace noise: the score interval {p : (x - p)^2 <= z^2 (p (1 - p) + b) / n},
  with x the de-biased estimate, b the per-report noise variance and, for Laplace noise, z raised
  by the Cornish-Fisher term for the noise sum's excess kurtosis (at most 3 / n).

An interval is intersected with [0, 1] (which cannot lower coverage, since p_j is in [0, 1])
unless that would leave less than a positive width.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from aggregator.histogram import Histogram
from aggregator.stats.channel import debiased_histogram, extra_variance
from client.mechanisms import FlipComponents, LaplaceNoise, RandomizedResponse

CLOPPER_PEARSON = "Clopper-Pearson on the privatized counts, mapped through the channel"
SCORE = "score interval with the noise variance"


def interval_method(hist: Histogram) -> str:
    return CLOPPER_PEARSON if _is_binomial(hist) else SCORE


def confidence_intervals(hist: Histogram, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-coordinate (low, high) at level ``confidence``, each coordinate on its own."""
    tail = (1 - confidence) / 2
    if _is_binomial(hist):
        low, high = _clopper_pearson(hist, tail)
    else:
        low, high = _score(hist, tail)
    return _clip_to_unit(low, high)


def simultaneous_intervals(hist: Histogram, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Intervals covering all k coordinates at once with probability >= confidence (Bonferroni)."""
    return confidence_intervals(hist, 1 - (1 - confidence) / hist.k)


def _is_binomial(hist: Histogram) -> bool:
    return isinstance(hist.mechanism, RandomizedResponse | FlipComponents)


def _clopper_pearson(hist: Histogram, tail: float) -> tuple[np.ndarray, np.ndarray]:
    n, x = hist.n, hist.values
    with np.errstate(invalid="ignore"):
        q_low = np.where(x > 0, stats.beta.ppf(tail, x, n - x + 1), 0.0)
        q_high = np.where(x < n, stats.beta.ppf(1 - tail, x + 1, n - x), 1.0)
    mech = hist.mechanism
    return (q_low - mech.offset) / mech.slope, (q_high - mech.offset) / mech.slope


def _score(hist: Histogram, tail: float) -> tuple[np.ndarray, np.ndarray]:
    n, b = hist.n, extra_variance(hist.mechanism)
    z = float(stats.norm.isf(tail))
    if isinstance(hist.mechanism, LaplaceNoise):
        z += (3 / n) / 24 * max(z**3 - 3 * z, 0.0)  # Cornish-Fisher, excess kurtosis <= 3/n
    x = debiased_histogram(hist)
    z2 = z * z
    a = n + z2
    linear = 2 * n * x + z2
    disc = z2 * (4 * n * x * (1 - x) + z2 + 4 * n * b + 4 * z2 * b)
    root = np.sqrt(np.clip(disc, 0.0, None))
    low, high = (linear - root) / (2 * a), (linear + root) / (2 * a)
    wald = z * np.sqrt(b / n)  # x so far outside [0, 1] that no p in it fits
    empty = disc <= 0
    return np.where(empty, x - wald, low), np.where(empty, x + wald, high)


def _clip_to_unit(low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    clipped_low, clipped_high = np.maximum(low, 0.0), np.minimum(high, 1.0)
    keep = clipped_high > clipped_low
    return np.where(keep, clipped_low, low), np.where(keep, clipped_high, high)
