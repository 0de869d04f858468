"""The law of one report's sufficient-statistic row, as the anytime-valid methods need it: log
moment generating functions (exact where the row's law is known in closed form, an upper bound
otherwise), which is all an exponential supermartingale needs (survey-design-and-monitoring spec
S.1-S.2).

A coordinate j of a row is ``B + Z`` in statistic units: B a 0/1 indicator with mean
``m = offset + slope * p_j`` (randomized response, flip components, support counts; Z = 0) or
B the one-hot coordinate itself with mean p_j (Gaussian and Laplace noise; Z the noise in real
units). Bounds used:

* discrete Gaussian N_Z(0, s^2) is s^2-sub-Gaussian ([Canonne2020]): log E e^(lZ) <= l^2 / (2 rho)
  in real units (s^2 = g^2 / rho on the grid of step 1/g);
* discrete Laplace with ratio r = exp(-eps / (2g)): exact, log((1-r)^2 / ((1 - r e^t)(1 - r e^-t)))
  with t = l / g, finite for |l| < eps / 2;
* the aggregator's refusal of far-out coordinates only conditions on |Z| <= bound, which can only
  lower E cosh(lZ), so the untruncated bounds stay valid.
"""

from __future__ import annotations

import math

import numpy as np

from aggregator.errors import InvalidInputError
from aggregator.stats.anytime import support_laws
from aggregator.stats.channel import check_signal
from aggregator.stats.validate import PUBLIC_COIN_REFUSAL
from client.mechanisms import Mechanism


def check_mechanism(mechanism: Mechanism, analysis: str) -> Mechanism:
    """InvalidInputError for public-coin reports, which carry no per-category channel."""
    if mechanism.statistic_kind == "groups":
        raise InvalidInputError(PUBLIC_COIN_REFUSAL.format(k=mechanism.k, analysis=analysis))
    check_signal(mechanism)
    return mechanism


def noise_log_mgf(mechanism: Mechanism, lam: np.ndarray) -> np.ndarray:
    """log E exp(lam Z) (an upper bound for the Gaussian) for one coordinate's noise Z in real
    units, elementwise; 0 for the counting mechanisms, +inf outside the Laplace MGF's domain."""
    lam = np.asarray(lam, dtype=float)
    if mechanism.statistic_kind != "noise":
        return np.zeros_like(lam)
    if mechanism.cost.kind == "zcdp":  # discrete Gaussian: variance parameter 1 / rho
        return lam**2 / (2 * mechanism.cost.value)
    scale = float(mechanism.scale)  # type: ignore[attr-defined]
    eps = mechanism.cost.value
    log_r = -eps / (2 * scale)
    t = np.abs(lam) / scale
    inside = t < -log_r
    safe_t = np.where(inside, t, 0.0)
    value = 2 * math.log(-math.expm1(log_r)) - np.log(-np.expm1(log_r + safe_t))
    value = value - np.log(-np.expm1(log_r - safe_t))
    return np.where(inside, value, np.inf)


def noise_variance(mechanism: Mechanism) -> float:
    """Per-coordinate noise variance in real units (0 for the counting mechanisms)."""
    if mechanism.statistic_kind != "noise":
        return 0.0
    return float(mechanism.noise_variance)  # type: ignore[attr-defined]


def bernoulli_log_mgf(m: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """log E exp(lam (B - m)) for B ~ Bernoulli(m), exact and stable (broadcasts)."""
    m = np.asarray(m, dtype=float)
    lam = np.asarray(lam, dtype=float)
    with np.errstate(divide="ignore"):
        log_m, log_1m = np.log(m), np.log1p(-m)
    return np.logaddexp(log_1m, log_m + lam) - lam * m


def coordinate_log_mgf(mechanism: Mechanism, m: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """log E exp(lam (X - m)) for one statistic coordinate X = B + Z with E B = m (bound)."""
    return bernoulli_log_mgf(m, lam) + noise_log_mgf(mechanism, lam)


def log_conditional_mgf(mechanism: Mechanism, lam: np.ndarray) -> np.ndarray:
    """log E[exp(lam . Y) | answer x] for every answer x: (..., k) for lam of shape (..., k).

    Exact for randomized response (one category per report), flip components (independent bits),
    additive noise (one-hot plus independent noise) and the support mechanisms of
    ``support_laws`` (optimized unary, subset selection, Hadamard response); for the others
    (local hashing) Hoeffding's bound on the 0/1 support row given x:
    lam . E[Y|x] + (sum |lam|)^2 / 8.
    """
    lam = np.asarray(lam, dtype=float)
    c0, c1 = float(mechanism.offset), float(mechanism.slope)
    kind = mechanism.statistic_kind
    if kind == "counts":  # P(Y = y | x) = c0 + c1 [y = x]
        top = lam.max(axis=-1, keepdims=True)
        shifted = np.exp(lam - top)
        return top + np.log(c0 * shifted.sum(axis=-1, keepdims=True) + c1 * shifted)
    if kind == "bits":  # independent bits, P(Y_j = 1 | x) = c0 + c1 [j = x]
        return support_laws.independent_bits(c0, c1, lam)
    if kind == "noise":
        return lam + noise_log_mgf(mechanism, lam).sum(axis=-1, keepdims=True)
    exact = support_laws.exact_law(mechanism)
    if exact is not None:
        return exact(lam)
    spread = np.abs(lam).sum(axis=-1, keepdims=True)
    return c0 * lam.sum(axis=-1, keepdims=True) + c1 * lam + spread**2 / 8


def hoeffding_bound(mechanism: Mechanism) -> bool:
    """Whether ``log_conditional_mgf`` is Hoeffding's bound (a support law not known exactly)."""
    return mechanism.statistic_kind == "support" and support_laws.exact_law(mechanism) is None


def tilt_limit(mech: Mechanism) -> float:
    """Half the radius of the noise MGF's domain (Laplace: eps / 4), inf where it has none."""
    if mech.statistic_kind == "noise" and mech.cost.kind == "pure":
        return mech.cost.value / 4
    return math.inf
