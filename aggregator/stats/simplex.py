"""Estimates on the probability simplex, and intervals that contain only valid values.

The point estimate: the unbiased estimate x projected onto ``{p >= 0, sum p = 1}`` in Euclidean
distance (Norm-Sub [Wang2020]: p_j = max(x_j - tau, 0), one shift tau for every cell). Why this
one: the true p lies in the simplex, a convex set, so the projection is never farther from p than
x is (``||proj(x) - p|| <= ||x - p||`` for every data set, not only on average); it is consistent
(x is, and the projection is continuous); it needs only x, so it works for every mechanism; and
where the channel's noise is nearly the same in every cell (Hadamard response, subset selection,
local hashing, Gaussian and Laplace noise) it is the constrained maximum likelihood estimate
under the normal approximation. Its cost is bias: every positive cell moves by the same tau,
which at sparse large k can be a standard error or more; the unbiased estimate stays beside it.

The intervals (``inside_unit``): a cell's interval for p_j, intersected with [0, 1], and where
that interval reaches a boundary of [0, 1] widened by the likelihood-ratio interval of a normal
mean restricted to [0, 1] with the cell's variance at that boundary. Only widening a set that
covers p_j, and cutting away values p_j cannot take, keeps at least its coverage; and the
widened interval always holds valid values, even when the first interval holds none (a count
below what p_j = 0 gives). See docs/calibration.md.
"""

from __future__ import annotations

import numpy as np

from aggregator.errors import InvalidInputError
from aggregator.stats.channel import project_simplex

ESTIMATORS = ("unbiased", "simplex")
LABELS = {
    "unbiased": "unbiased (de-biased reports; may fall outside [0, 1])",
    "simplex": "simplex (the unbiased estimate projected onto the simplex: Norm-Sub)",
}


def check_estimator(estimator: object) -> str:
    if estimator not in ESTIMATORS:
        raise InvalidInputError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    return str(estimator)


def on_simplex(unbiased: np.ndarray) -> np.ndarray:
    """The Euclidean projection of the unbiased estimate onto the probability simplex."""
    return project_simplex(np.asarray(unbiased, dtype=float)[None, :])[0]


def simplex_shift(unbiased: np.ndarray, projected: np.ndarray) -> float:
    """tau in ``projected = max(unbiased - tau, 0)``: what the projection took from (tau > 0)
    or gave to (tau < 0) every positive cell."""
    kept = projected > 0
    return float(np.mean(unbiased[kept] - projected[kept]))


def boundary_limits(
    x: np.ndarray,
    z: float | np.ndarray,
    variance_at_zero: np.ndarray,
    variance_at_one: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The likelihood-ratio interval's ends at the two boundaries, for x ~ N(p, v) restricted to
    p in [0, 1] with v the variance at that boundary: ``{p >= 0 : (x - p)^2 - (x - p_hat)^2 <=
    z^2 v}`` with p_hat = max(x, 0) reaches up to ``u = x + sqrt(x^2 + z^2 v0)`` when x <= 0
    (u = z sqrt(v0) at x = 0, shrinking towards 0 as x falls, never reaching it); the mirror
    image at 1 reaches down to ``l = x - sqrt((x - 1)^2 + z^2 v1)`` when x >= 1."""
    upper = x + np.sqrt(x * x + z * z * variance_at_zero)
    lower = x - np.sqrt((x - 1) ** 2 + z * z * variance_at_one)
    return lower, upper


def inside_unit(
    low: np.ndarray,
    high: np.ndarray,
    x: np.ndarray,
    z: float | np.ndarray,
    variance_at_zero: np.ndarray,
    variance_at_one: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """``[low, high]`` cut to [0, 1] and widened at a boundary it reaches (module docstring):
    every result lies inside [0, 1], has positive width and contains ``[low, high] & [0, 1]``."""
    lower, upper = boundary_limits(x, z, variance_at_zero, variance_at_one)
    cut_low, cut_high = np.clip(low, 0.0, 1.0), np.clip(high, 0.0, 1.0)
    new_high = np.where(low <= 0, np.maximum(cut_high, np.minimum(upper, 1.0)), cut_high)
    new_low = np.where(high >= 1, np.minimum(cut_low, np.maximum(lower, 0.0)), cut_low)
    return new_low, new_high


def holding(low: np.ndarray, high: np.ndarray, point: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The smallest intervals containing both ``[low, high]`` and ``point`` (so an estimate
    never lies outside its own interval; widening keeps coverage)."""
    return np.minimum(low, point), np.maximum(high, point)
