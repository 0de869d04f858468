"""The law of a sum of n discrete Gaussians, which the Gaussian mechanism's Monte Carlo null
draws for an aggregate: checked against direct convolution and against summed single draws."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from client.mechanisms import GaussianNoise
from client.mechanisms.discrete_noise import (
    THETA_SIGMA,
    _sum_cdf,
    discrete_gaussian,
    discrete_gaussian_sum,
    discrete_gaussian_variance,
)


def _pmf(sigma2: float, width: int) -> np.ndarray:
    z = np.arange(-width, width + 1, dtype=np.float64)
    weights = np.exp(-(z**2) / (2 * sigma2))
    return weights / weights.sum()


def _convolved(sigma2: float, n: int) -> np.ndarray:
    """The n-fold convolution by repeated np.convolve (support -n*w .. n*w)."""
    one = _pmf(sigma2, math.ceil(12 * math.sqrt(sigma2)) + 1)
    out = one
    for _ in range(n - 1):
        out = np.convolve(out, one)
    return out


@pytest.mark.parametrize(("sigma2", "n"), [(0.3, 1), (0.5, 7), (1.0, 40), (4.0, 25), (30.0, 3)])
def test_fft_pmf_matches_direct_convolution(sigma2, n):
    values, cdf = _sum_cdf(n, sigma2)
    pmf = np.diff(cdf, prepend=0.0)
    direct = _convolved(sigma2, n)
    half = (direct.size - 1) // 2
    ours = np.zeros(direct.size)
    inside = np.abs(values) <= half
    ours[values[inside] + half] = pmf[inside]
    assert np.max(np.abs(ours - direct)) < 1e-12
    assert pmf[np.abs(values) > half].sum() < 1e-15


@pytest.mark.parametrize("sigma2", [THETA_SIGMA**2, 50.0])
def test_above_the_theta_threshold_a_sum_is_a_wider_discrete_gaussian(sigma2):
    """Poisson summation: the sum of n draws is N_Z(0, n sigma2) to far below double precision."""
    n = 4
    direct = _convolved(sigma2, n)
    half = (direct.size - 1) // 2
    assert np.max(np.abs(direct - _pmf(n * sigma2, half))) < 1e-15


def test_below_the_threshold_the_sum_is_not_a_discrete_gaussian():
    """The reason for the FFT regime: at sigma 0.5 the lattice law is far from N_Z(0, n sigma2)."""
    sigma2, n = 0.25, 3
    direct = _convolved(sigma2, n)
    half = (direct.size - 1) // 2
    assert np.max(np.abs(direct - _pmf(n * sigma2, half))) > 1e-3


@pytest.mark.parametrize("sigma2", [0.25, 2.0, 40.0])
def test_sampled_sums_have_the_law_of_summed_draws(sigma2):
    """Chi-square homogeneity of 40,000 sampled sums against 40,000 sums of 12 single draws."""
    rng = np.random.default_rng(11)
    n, size = 12, 40_000
    ours = discrete_gaussian_sum(n, sigma2, (size,), rng)
    summed = discrete_gaussian(sigma2, size * n, rng).reshape(size, n).sum(axis=1)
    edges = np.unique(np.quantile(np.concatenate([ours, summed]), np.linspace(0, 1, 30)))
    edges[-1] += 1
    table = np.array([np.histogram(x, bins=edges)[0] for x in (ours, summed)])
    table = table[:, table.sum(axis=0) > 0]
    assert stats.chi2_contingency(table)[1] > 0.001
    assert ours.var() == pytest.approx(n * discrete_gaussian_variance(sigma2), rel=0.03)


def test_past_the_ffts_reach_the_sum_has_the_matched_variance():
    assert _sum_cdf(10**9, 1.0) is None
    draws = discrete_gaussian_sum(10**9, 1.0, (20_000,), np.random.default_rng(3))
    assert draws.var() == pytest.approx(10**9 * discrete_gaussian_variance(1.0), rel=0.04)


def test_gaussian_aggregates_at_granularity_zero_are_integers_with_the_exact_variance():
    """At granularity 0 an aggregate is an integer vector: so is every Monte Carlo draw of it."""
    mech = GaussianNoise(k=4, rho=2.0, granularity_bits=0)
    hists = mech.simulate_histogram(30, np.full(4, 0.25), np.random.default_rng(5), size=20_000)
    assert np.array_equal(hists, np.round(hists))
    noise = hists - hists.mean(axis=0)
    expected = 30 * (0.25 * 0.75 + mech.noise_variance)
    assert noise.var(axis=0) == pytest.approx(np.full(4, expected), rel=0.05)


def test_zero_reports_carry_no_noise():
    assert not discrete_gaussian_sum(0, 1.0, (3, 2), np.random.default_rng(0)).any()
