"""The default goodness of fit of Hadamard response at large k (issue 25 item 5): above
MAX_SUPPORT_IMHOF categories its Pearson null is the exact simulation, not the O(k^3)
eigendecomposition, and its Type I stays in the binomial band (fixed seeds)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from aggregator.histogram import Histogram
from aggregator.stats import goodness_of_fit
from aggregator.stats.calibration import MAX_SUPPORT_IMHOF
from aggregator.stats.channel import support_null
from aggregator.stats.gof import support_null_law
from client.mechanisms import HadamardResponse


def zipf(k: int) -> np.ndarray:
    p = 1 / np.arange(1, k + 1) ** 1.1
    return p / p.sum()


def test_the_default_at_k_2000_simulates_its_null():
    k, n = 2_000, 60_000
    mech, p0 = HadamardResponse(k=k, epsilon=1.0), zipf(k)
    hist = Histogram(mech, n, mech.simulate_histogram(n, p0, np.random.default_rng(1)))
    result = goodness_of_fit(hist, p0, rng=2)
    assert result.calibration == "monte-carlo" and result.dof is None
    assert f"k > {MAX_SUPPORT_IMHOF}" in result.calibration_reason
    assert result.pvalue > 0.001  # the truth is not rejected outright


def test_the_weights_below_the_limit_are_the_eigenvalues():
    """eigvalsh (no eigenvectors) gives the same law as the full decomposition."""
    k = 200
    mech, p0 = HadamardResponse(k=k, epsilon=1.0), zipf(k)
    full = support_null(mech, p0)[0]
    weights = support_null_law(mech, p0)
    assert isinstance(weights, np.ndarray)  # Hadamard response: not a LowRankLaw
    np.testing.assert_allclose(np.sort(weights), np.sort(full[full > 1e-9]))


@pytest.mark.slow
def test_type_one_of_the_default_above_the_limit():
    k, n, trials, alpha = MAX_SUPPORT_IMHOF + 76, 20_000, 200, 0.05
    mech, p0 = HadamardResponse(k=k, epsilon=1.0), zipf(k)
    rng = np.random.default_rng(3)
    rejected = 0
    for t, values in enumerate(mech.simulate_histogram(n, p0, rng, size=trials)):
        result = goodness_of_fit(Histogram(mech, n, values), p0, alpha, rng=100 + t)
        assert result.calibration == "monte-carlo"
        rejected += result.reject
    low, high = stats.binom.ppf([0.005, 0.995], trials, alpha)
    assert low <= rejected <= high, rejected
