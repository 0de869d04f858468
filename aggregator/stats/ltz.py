"""Tail probabilities of a quadratic form ``Q = ||z||^2``, ``z ~ N(sqrt(n) mu, R)``, by the
four-cumulant chi-square approximation of Liu, Tang and Zhang [Liu2009].

Planning uses it for the support-count Pearson tests at large k, where the exact weighted
chi-square (an eigendecomposition of k x k, then Imhof's integral) costs seconds per mechanism:
the cumulants ``c_j = tr R^j + j n mu^T R^(j-1) mu`` need one matrix product.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class QuadraticMoments:
    """``traces[j] = tr R^(j+1)`` and ``shifts[j] = mu^T R^j mu`` (per unit n), j = 0..3."""

    traces: tuple[float, float, float, float]
    shifts: tuple[float, float, float, float]


def quadratic_moments(r: np.ndarray, mu: np.ndarray) -> QuadraticMoments:
    """The moments of ``||z||^2`` for a covariance ``r`` (k x k) and a mean shift ``mu``."""
    r2 = r @ r
    r_mu = r @ mu
    r2_mu = r @ r_mu
    traces = (float(np.trace(r)), float(np.sum(r * r)), float(np.sum(r2 * r)), float(np.sum(r2**2)))
    shifts = (float(mu @ mu), float(mu @ r_mu), float(r_mu @ r_mu), float(r_mu @ r2_mu))
    return QuadraticMoments(traces, shifts)


def _fit(moments: QuadraticMoments, n: float) -> tuple[float, float, float, float, float]:
    """The matched chi-square_l(delta) (its sd is sqrt(2) a) and Q's mean c1 and sd sqrt(2 c2)."""
    c = [moments.traces[j] + (j + 1) * n * moments.shifts[j] for j in range(4)]
    s1 = c[2] / c[1] ** 1.5
    s2 = c[3] / c[1] ** 2
    if s1**2 > s2:
        a = 1 / (s1 - math.sqrt(s1**2 - s2))
        delta = s1 * a**3 - a**2
        dof = a**2 - 2 * delta
    else:
        a, delta = 1 / s1, 0.0
        dof = a**2
    return dof, delta, a, c[0], math.sqrt(2 * c[1])


def ltz_isf(alpha: float, moments: QuadraticMoments) -> float:
    """The upper-alpha quantile of Q under no shift (n = 0: the null)."""
    dof, _, a, mean, sd = _fit(moments, 0.0)
    return (float(stats.chi2.isf(alpha, dof)) - dof) / (math.sqrt(2) * a) * sd + mean


def ltz_sf(x: float, moments: QuadraticMoments, n: float) -> float:
    """P(Q > x) with the mean shift ``sqrt(n) mu``."""
    dof, delta, a, mean, sd = _fit(moments, n)
    t = (x - mean) / sd * math.sqrt(2) * a + dof + delta
    value = float(stats.ncx2.sf(t, dof, delta) if delta > 0 else stats.chi2.sf(t, dof))
    return 1.0 if math.isnan(value) else value  # SciPy's NaN is far out in the upper tail
