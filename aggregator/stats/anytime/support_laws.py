"""Exact conditional moment generating functions of support rows: log E[exp(lam . Y) | answer x]
for every x, Y the 0/1 support row of one report, where the report's law given x is known in
closed form (survey-design-and-monitoring spec S.2). With them the sequential tests on support
counts bet with the report's own law instead of Hoeffding's bound on a 0/1 row, and gain power.

* optimized unary encoding: independent bits, a product of Bernoullis (O(k));
* subset selection: the answer in the set with probability a plus a uniform set of the others,
  through the elementary symmetric polynomials of exp(lam) without x, in log space from prefix
  and suffix products (O(k d), d the set size);
* Hadamard response: a column c, uniform within the answer's half (probability rho) or the other
  half; lam . Y(c) for all K columns is one Walsh-Hadamard transform, and the sum of exp over
  each category's half another (O(K log K)).

Local hashing stays on Hoeffding's bound: its support row given x depends on the joint law of
the k hashes of a degree-2 polynomial over GF(2^31 - 1) reduced mod g, only 3-wise independent,
so the exact MGF is a sum over the P^3 seeds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import special

from client.mechanisms import (
    HadamardResponse,
    Mechanism,
    OptimizedUnaryEncoding,
    SubsetSelection,
)
from client.mechanisms.hadamard import fwht

#: Reports x categories x (d + 1) log-domain cells per block of the subset-selection recursion.
_BLOCK = 2**21


def independent_bits(c0: float, c1: float, lam: np.ndarray) -> np.ndarray:
    """Bits independent given x, P(Y_j = 1 | x) = c0 + c1 [j = x]: (..., k) from lam (..., k)."""

    def log_bernoulli(m: float) -> np.ndarray:  # log E exp(lam B), B ~ Bernoulli(m)
        with np.errstate(divide="ignore"):
            return np.logaddexp(np.log1p(-m), np.log(m) + lam)

    other, own = log_bernoulli(c0), log_bernoulli(c0 + c1)
    return other.sum(axis=-1, keepdims=True) - other + own


def unary(mech: OptimizedUnaryEncoding, lam: np.ndarray) -> np.ndarray:
    """The answer's bit is 1 with probability 1/2, every other bit with q, independently."""
    return independent_bits(float(mech.offset), float(mech.slope), lam)


def subset(mech: SubsetSelection, lam: np.ndarray) -> np.ndarray:
    """With probability a the set is x and d - 1 of the other k - 1 categories, otherwise d of
    them, uniformly: E[exp(lam . Y) | x] = a e^lam_x e_{d-1}(w_-x) / C(k-1, d-1) + (1 - a)
    e_d(w_-x) / C(k-1, d), w = exp(lam) without x."""
    k, d, a = mech.k, mech.subset_size, mech.in_probability
    flat = lam.reshape(-1, k)
    out = np.empty_like(flat)
    step = max(1, _BLOCK // (k * (d + 1)))
    for start in range(0, flat.shape[0], step):
        block = flat[start : start + step]
        low, high = _symmetric_without_each(block, d)
        inside = np.log(a) + block + low - _log_binom(k - 1, d - 1)
        outside = np.log1p(-a) + high - _log_binom(k - 1, d)
        out[start : start + step] = np.logaddexp(inside, outside)
    return out.reshape(lam.shape)


def _log_binom(n: int, r: int) -> float:
    return float(special.gammaln(n + 1) - special.gammaln(r + 1) - special.gammaln(n - r + 1))


def _symmetric_without_each(lam: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """log e_{d-1} and log e_d of exp(lam) without each coordinate x: two (m, k) arrays, from
    the polynomials prod (1 + w_j t) of the coordinates before x and after x (degrees <= d),
    multiplied at the needed degree. Sums of positive terms only, so stable in log space."""
    m, k = lam.shape
    empty = np.full((m, d + 1), -np.inf)
    empty[:, 0] = 0.0
    before = np.empty((k, m, d + 1))
    after = np.empty((k, m, d + 1))
    poly = empty
    for j in range(k):
        before[j] = poly
        poly = _times_linear(poly, lam[:, j])
    poly = empty
    for j in range(k - 1, -1, -1):
        after[j] = poly
        poly = _times_linear(poly, lam[:, j])
    with np.errstate(divide="ignore", invalid="ignore"):
        high = special.logsumexp(before + after[..., ::-1], axis=-1)
        low = special.logsumexp(before[..., :d] + after[..., d - 1 :: -1], axis=-1)
    return low.T, high.T


def _times_linear(poly: np.ndarray, lam_j: np.ndarray) -> np.ndarray:
    """Log coefficients of poly(t) (1 + exp(lam_j) t), truncated at poly's degree."""
    shifted = np.concatenate([np.full((poly.shape[0], 1), -np.inf), poly[:, :-1]], axis=1)
    return np.logaddexp(poly, lam_j[:, None] + shifted)


def hadamard(mech: HadamardResponse, lam: np.ndarray) -> np.ndarray:
    """Y_j(c) = [H[j+1, c] = +1], so lam . Y(c) = (sum lam + (H lam~)_c) / 2, lam~ the tilt on
    rows 1..k; given x the column is uniform on x's half (H[x+1, c] = +1) with probability rho:
    E = (2 / K) (rho S_x + (1 - rho) (S - S_x)), S_x = (S + (H u)_{x+1}) / 2, u = exp(lam . Y)."""
    k, size, rho = mech.k, mech.columns, mech.keep_probability
    flat = lam.reshape(-1, k)
    padded = np.zeros((flat.shape[0], size))
    padded[:, 1 : k + 1] = flat
    values = (flat.sum(axis=1, keepdims=True) + fwht(padded)) / 2
    top = values.max(axis=1, keepdims=True)
    u = np.exp(values - top)
    total = u.sum(axis=1, keepdims=True)
    own = np.clip((total + fwht(u)[:, 1 : k + 1]) / 2, 0.0, total)
    mean = (rho * own + (1 - rho) * (total - own)) * (2 / size)
    return (top + np.log(mean)).reshape(lam.shape)


#: The support mechanisms whose conditional law is exact here; the others use Hoeffding's bound.
EXACT: dict[type, Callable[..., np.ndarray]] = {
    OptimizedUnaryEncoding: unary,
    SubsetSelection: subset,
    HadamardResponse: hadamard,
}


def exact_law(mech: Mechanism) -> Callable[[np.ndarray], np.ndarray] | None:
    """``lam -> log E[exp(lam . Y) | x]`` for every x when the support law is exact, else None."""
    law = EXACT.get(type(mech))
    return None if law is None else (lambda lam: law(mech, np.asarray(lam, dtype=float)))
