"""Exact discrete noise with numpy, for studies and Monte Carlo nulls (devices use the secure
samplers in ``secure_random``): discrete Laplace, discrete Gaussian, and the law of a *sum* of n
discrete Gaussians, which is what an aggregate of n reports carries.

The sum is not a rounded normal: on the grid of step 1 it is a lattice law whose shape matters
when the grid noise is small (granularity_bits = 0). It is sampled exactly, in three regimes:

* sigma >= 6 (grid units): by Poisson summation the characteristic function of N_Z(0, s^2) is the
  2 pi-periodized normal one up to terms of size exp(-pi^2 s^2 / 2), so a sum of n draws is
  N_Z(0, n s^2) to within 2 n exp(-pi^2 s^2 / 2) in total variation (below 1e-70 here);
* smaller sigma: the n-fold convolution of the one-draw pmf by FFT (its characteristic function is
  positive, a Jacobi theta function, so the n-th power is taken on real numbers), then inverse-CDF
  sampling; the pmf is accurate to about n * 1e-16, far below any Monte Carlo error;
* smaller sigma and n above 1e8: a discrete Gaussian with the sum's exact variance, whose law
  differs from the sum's only in cumulants of relative order 1/n (below 1e-8).
"""

from __future__ import annotations

import math
from functools import lru_cache

from client.mechanisms.lazy_numpy import np

# Below this many grid units the one-draw law is visibly a lattice law (see the module docstring).
THETA_SIGMA = 6.0
# Largest n convolved by FFT (its rounding grows like n * 1e-16), and the largest FFT length.
MAX_FFT_N = 10**8
MAX_FFT = 2**22


def discrete_laplace(scale: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """Discrete Laplace draws (P(z) ~ exp(-|z|/scale)) as a difference of two geometrics."""
    success = -math.expm1(-1.0 / scale)
    return rng.geometric(success, size) - rng.geometric(success, size)


def discrete_gaussian(sigma2: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """Draws of N_Z(0, sigma2) by rejection from a discrete Laplace ([Canonne2020] Alg. 3)."""
    t = math.isqrt(int(sigma2)) + 1
    out = np.empty(size, dtype=np.int64)
    pending = np.arange(size)
    while pending.size:
        y = discrete_laplace(float(t), pending.size, rng)
        accept = rng.random(pending.size) < np.exp(-((np.abs(y) - sigma2 / t) ** 2) / (2 * sigma2))
        out[pending[accept]] = y[accept]
        pending = pending[~accept]
    return out


def discrete_gaussian_variance(sigma2: float) -> float:
    """Exact variance of N_Z(0, sigma2), by direct summation where it differs from sigma2.

    For sigma >= 50 the relative gap is below exp(-2 pi^2 sigma^2), far under double precision.
    """
    sigma = math.sqrt(sigma2)
    if sigma >= 50:
        return sigma2
    z = np.arange(-int(40 * sigma) - 10, int(40 * sigma) + 11, dtype=np.float64)
    weights = np.exp(-(z**2) / (2 * sigma2))
    return float(np.sum(z**2 * weights) / np.sum(weights))


def discrete_gaussian_sum(
    n: int, sigma2: float, shape: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """Sums of n iid N_Z(0, sigma2) draws (grid units), one for every entry of ``shape``."""
    size = int(np.prod(shape))
    if n == 0:
        return np.zeros(shape, dtype=np.int64)
    if math.sqrt(sigma2) >= THETA_SIGMA:
        return discrete_gaussian(n * sigma2, size, rng).reshape(shape)
    cdf = _sum_cdf(n, sigma2)
    if cdf is None:
        matched = n * discrete_gaussian_variance(sigma2)
        return discrete_gaussian(matched, size, rng).reshape(shape)
    values, cumulative = cdf
    index = np.searchsorted(cumulative, rng.random(size), side="right")
    return values[np.minimum(index, values.size - 1)].reshape(shape)


@lru_cache(maxsize=16)
def _sum_cdf(n: int, sigma2: float) -> tuple[np.ndarray, np.ndarray] | None:
    """Support and CDF of the sum of n draws of N_Z(0, sigma2), or None past the FFT's reach."""
    if n > MAX_FFT_N:
        return None
    sigma = math.sqrt(sigma2)
    width = math.ceil(12 * sigma) + 1  # one draw's mass beyond this is below 1e-31
    half = math.ceil(13 * sigma * math.sqrt(n)) + width
    length = 1 << (2 * half + 1).bit_length()
    if length > MAX_FFT:
        return None
    z = np.arange(-width, width + 1)
    one = np.zeros(length)
    one[z % length] = np.exp(-(z.astype(np.float64) ** 2) / (2 * sigma2))
    one /= one.sum()
    spectrum = np.fft.rfft(one).real  # real and positive: the pmf is symmetric (a theta function)
    pmf = np.fft.irfft(np.power(np.maximum(spectrum, 0.0), n), length)
    values = np.arange(-half, half + 1)
    pmf = np.maximum(pmf[values % length], 0.0)
    cumulative = np.cumsum(pmf)
    return values, cumulative / cumulative[-1]
