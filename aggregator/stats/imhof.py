"""Tail probabilities and quantiles of weighted sums of chi-squares ([Imhof1961];
local-chi-square-tests spec §2.2)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np

from aggregator.stats.low_rank_law import LowRankLaw


def weighted_chi2_sf(
    x: float, weights: np.ndarray | LowRankLaw, noncentralities: np.ndarray | None = None
) -> float:
    """P(sum_j w_j chi2_1(delta_j) > x) for positive weights w_j, given as a vector or as a
    ``LowRankLaw`` (central only: its weights are never formed).

    Integrates Imhof's formula on [0, 1] with adaptive quadrature and on [1, inf) with QUADPACK's
    Fourier-weighted rule, after scaling by the largest weight (or a bound of it).
    """
    if isinstance(weights, LowRankLaw):
        if noncentralities is not None:
            raise ValueError("a LowRankLaw is central")
        return _determinant_sf(x, weights)
    weights = np.asarray(weights, dtype=float)
    if weights.ndim != 1 or weights.size == 0 or not np.all(weights > 0):
        raise ValueError("weights must be a non-empty vector of positive numbers")
    if noncentralities is None:
        delta = np.zeros_like(weights)
    else:
        delta = np.asarray(noncentralities, dtype=float)
    if x <= 0:
        return 1.0
    top = weights.max()
    lam, xs = weights / top, x / top

    def phase_and_log_rho(u: float) -> tuple[float, float]:
        lu = lam * u
        lu2 = lu**2
        theta = 0.5 * float(np.sum(np.arctan(lu) + delta * lu / (1 + lu2)))
        log_rho = float(0.25 * np.sum(np.log1p(lu2)) + 0.5 * np.sum(delta * lu2 / (1 + lu2)))
        return theta, log_rho

    return _imhof(xs, float(np.sum(lam * (1 + delta))), phase_and_log_rho)


def _determinant_sf(x: float, law: LowRankLaw) -> float:
    """Imhof's phase and log modulus from one log det(I - i u M): -Im / 2 and Re / 2 of it."""
    if x <= 0:
        return 1.0
    top = law.top

    def phase_and_log_rho(u: float) -> tuple[float, float]:
        log_det = law.log_det(u / top)
        return -0.5 * log_det.imag, 0.5 * log_det.real

    return _imhof(x / top, law.trace / top, phase_and_log_rho)


def _imhof(
    xs: float, mean: float, phase_and_log_rho: Callable[[float], tuple[float, float]]
) -> float:
    """0.5 + (1 / pi) int_0^inf sin(theta(u)) / (u rho(u)) du, theta(u) = theta_rest(u) - xs u / 2,
    for weights scaled to at most 1 (``mean``: their sum plus the noncentralities');
    ``phase_and_log_rho(u)`` gives theta_rest(u) and log rho(u) from one evaluation."""

    def parts(u: float) -> tuple[float, float]:  # theta_rest(u), 1 / (u rho(u)) (0 on underflow)
        theta, log_rho = phase_and_log_rho(u)
        return theta, math.exp(-log_rho) / u

    def integrand(u: float) -> float:
        if u == 0.0:
            return 0.5 * (mean - xs)
        theta, envelope = parts(u)
        return math.sin(theta - xs * u / 2) * envelope

    def tail_cos(u: float) -> float:  # multiplies cos(xs u / 2)
        theta, envelope = parts(u)
        return math.sin(theta) * envelope

    def tail_sin(u: float) -> float:  # multiplies sin(xs u / 2)
        theta, envelope = parts(u)
        return -math.cos(theta) * envelope

    from scipy import integrate  # here: a simulated test never loads it (start-up)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", integrate.IntegrationWarning)
        head, _ = integrate.quad(integrand, 0.0, 1.0, limit=200, epsabs=1e-12)
        wvar = xs / 2
        if wvar > 0:
            cos_part, _ = integrate.quad(tail_cos, 1.0, np.inf, weight="cos", wvar=wvar, limlst=100)
            sin_part, _ = integrate.quad(tail_sin, 1.0, np.inf, weight="sin", wvar=wvar, limlst=100)
            tail = cos_part + sin_part
        else:
            tail, _ = integrate.quad(integrand, 1.0, np.inf, limit=400)
    return float(min(1.0, max(0.0, 0.5 + (head + tail) / math.pi)))


def weighted_chi2_isf(alpha: float, weights: np.ndarray) -> float:
    """The upper-alpha quantile tau with P(sum_j w_j chi2_1 > tau) = alpha."""
    weights = np.asarray(weights, dtype=float)
    mean = float(weights.sum())
    sd = math.sqrt(2 * float(np.sum(weights**2)))
    hi = mean + 10 * sd
    while weighted_chi2_sf(hi, weights) > alpha:
        hi *= 2
    from scipy import optimize

    root = optimize.brentq(
        lambda t: weighted_chi2_sf(t, weights) - alpha, 1e-12, hi, xtol=1e-10, rtol=1e-12
    )
    return float(root)
