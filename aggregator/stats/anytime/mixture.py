"""The mixture boundary every confidence sequence here uses, computed from a running sum alone.

For a candidate mean m and each fixed lam, ``exp(lam (S_n - n m) - n psi_m(lam))`` is a
nonnegative supermartingale with initial value 1 when the reports are iid with mean m and
``psi_m`` bounds their centred log-MGF (Chernoff; Howard, Ramdas, McAuliffe, Sekhon, Annals of
Statistics 2021). A mixture over lam with fixed weights is one too, so by Ville's inequality the
set ``{m : capital_n(m) < 1/alpha}`` covers the true mean at every n at once with probability at
least 1 - alpha (survey-design-and-monitoring spec S.1).

The weights are a normal law on lam, discretised on a fixed grid (a discrete mixture is itself a
valid supermartingale, so the grid costs tightness, never validity), of precision
``rho = tuned_n * v(m) / c_alpha`` with ``c_alpha = 2 log(1/alpha) + log(1 + 2 log(1/alpha))``:
this rho minimises the closed-form normal-mixture boundary
``sqrt((V + rho) log((V + rho) / (rho alpha^2)))`` at V = ``tuned_n * v(m)`` (to within 4 % for
alpha in [0.005, 0.05]), so the sequence is tightest near n = ``tuned_n``. The capital depends
on the reports only through (n, S_n): nothing else need be kept between looks.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import optimize, special

#: Standardised mixing points and their log-weights (a normal law on [-10, 10]).
_Z = np.linspace(-10.0, 10.0, 401)
_LOG_W = -(_Z**2) / 2 - special.logsumexp(-(_Z**2) / 2)

LogMgf = Callable[[np.ndarray, np.ndarray], np.ndarray]


def c_alpha(alpha: float) -> float:
    """The constant that places the normal mixture's tightest point at ``tuned_n``."""
    two_log = 2 * math.log(1 / alpha)
    return two_log + math.log1p(two_log)


def log_capital(
    n: int,
    total: float | np.ndarray,
    means: np.ndarray,
    variance: np.ndarray,
    log_mgf: LogMgf,
    tuned_n: float,
    alpha: float,
) -> np.ndarray:
    """log of the mixture capital at every candidate mean (``means``), after n reports summing
    to ``total`` (a number, or one per candidate: paths of a simulation); ``variance`` is each
    candidate's per-report variance proxy (it scales lam)."""
    means, totals = np.broadcast_arrays(
        np.atleast_1d(np.asarray(means, dtype=float)), np.asarray(total, dtype=float)
    )
    if n == 0:
        return np.zeros_like(means)
    rho = tuned_n * np.maximum(np.broadcast_to(variance, means.shape), 1.0 / tuned_n)
    lam = _Z[None, :] / np.sqrt(rho / c_alpha(alpha))[:, None]
    psi = log_mgf(means[:, None], lam)
    with np.errstate(invalid="ignore"):
        exponent = _LOG_W + lam * (totals - n * means)[:, None] - n * psi
    exponent = np.where(np.isfinite(psi), exponent, -np.inf)
    return special.logsumexp(exponent, axis=1)


def interval(
    n: int,
    total: float,
    bounds: tuple[float, float],
    variance: Callable[[np.ndarray], np.ndarray],
    log_mgf: LogMgf,
    tuned_n: float,
    alpha: float,
) -> tuple[float, float]:
    """The hull of ``{m in bounds : capital_n(m) < 1/alpha}``.

    Searched outwards from the running mean ``total / n`` (clipped to ``bounds``), where the
    capital is smallest; if even that candidate is excluded, from the grid point of least
    capital, and when every candidate is excluded (probability at most alpha under the model)
    the interval shrinks to that point.
    """
    lo, hi = bounds
    if n == 0:
        return lo, hi
    threshold = math.log(1 / alpha)

    def excess(m: float) -> float:
        return float(
            log_capital(n, total, np.array([m]), variance(np.array([m])), log_mgf, tuned_n, alpha)[
                0
            ]
            - threshold
        )

    centre = min(max(total / n, lo), hi)
    if excess(centre) >= 0:
        grid = np.linspace(lo, hi, 513)
        values = log_capital(n, total, grid, variance(grid), log_mgf, tuned_n, alpha)
        centre = float(grid[int(np.argmin(values))])
        if values.min() >= threshold:
            return centre, centre
    return _edge(excess, centre, lo), _edge(excess, centre, hi)


def _edge(excess: Callable[[float], float], centre: float, end: float) -> float:
    """Where ``excess`` crosses zero between ``centre`` (inside) and ``end``, by bracketing
    outwards in doubling steps then Brent's method."""
    span = end - centre
    if span == 0 or excess(end) < 0:
        return end
    inner, step = centre, span / 1024
    while True:
        outer = centre + step if abs(step) < abs(span) else end
        if excess(outer) >= 0:
            return float(optimize.brentq(excess, inner, outer, xtol=1e-12, rtol=1e-10))
        inner, step = outer, step * 2
