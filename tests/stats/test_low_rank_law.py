"""The support-count Pearson null law through determinants (aggregator/stats/low_rank_law.py)
equals the law from the eigendecomposition, and lets `auto` keep the weighted chi-square at any
k for the exchangeable mechanisms."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from aggregator.histogram import Histogram
from aggregator.stats import goodness_of_fit
from aggregator.stats.calibration import MAX_SUPPORT_IMHOF, choose
from aggregator.stats.channel import support_null
from aggregator.stats.imhof import weighted_chi2_sf
from aggregator.stats.low_rank_law import exchangeable_null_law
from client.mechanisms import (
    HadamardResponse,
    LocalHashing,
    OptimizedUnaryEncoding,
    SubsetSelection,
)

EXCHANGEABLE = [OptimizedUnaryEncoding, SubsetSelection, LocalHashing]


def slow(value: float):
    return pytest.param(value, marks=pytest.mark.slow)


def _nulls(k: int) -> list[np.ndarray]:
    skewed = np.random.default_rng(k).dirichlet(np.full(k, 0.3)) + 1e-6
    return [np.full(k, 1 / k), skewed / skewed.sum()]


@pytest.mark.parametrize("kind", EXCHANGEABLE, ids=lambda kind: kind.name)
@pytest.mark.parametrize("k", [2, 3, 7, 64, 300])
@pytest.mark.parametrize(
    "epsilon",  # each case integrates the law numerically (seconds): the fast tier keeps 1.0
    [slow(0.1), 1.0, slow(4.0), slow(10.0)],
)
def test_tail_equals_the_eigendecomposition(kind, k: int, epsilon: float) -> None:
    mech = kind(k, epsilon)
    for p0 in _nulls(k):
        weights = support_null(mech, p0)[0]
        weights = weights[weights > 1e-12 * weights.max()]
        law = exchangeable_null_law(mech, p0)
        assert law.trace == pytest.approx(weights.sum(), rel=1e-9)
        assert law.top >= weights.max() * (1 - 1e-9)
        mean, sd = weights.sum(), np.sqrt(2 * np.sum(weights**2))
        for x in mean + sd * np.array([-2.0, -1.0, 0.0, 1.0, 3.0, 6.0]):
            assert weighted_chi2_sf(x, law) == pytest.approx(weighted_chi2_sf(x, weights), abs=1e-8)


def test_the_covariance_it_assumes_is_the_mechanisms() -> None:
    """Diag + signed rank-1 terms rebuild the report correlation matrix exactly."""
    for kind in EXCHANGEABLE:
        mech = kind(40, 1.5)
        p0 = _nulls(40)[1]
        law = exchangeable_null_law(mech, p0)
        rebuilt = np.diag(law.diagonal) + (law.vectors * law.signs) @ law.vectors.T
        cov = mech.report_covariance(p0)
        scale = 1 / np.sqrt(np.diag(cov))
        assert np.allclose(rebuilt, cov * scale[:, None] * scale[None, :], atol=1e-12)


def test_a_law_is_central_only() -> None:
    law = exchangeable_null_law(LocalHashing(8, 1.0), np.full(8, 1 / 8))
    with pytest.raises(ValueError, match="central"):
        weighted_chi2_sf(5.0, law, np.ones(8))


@pytest.mark.slow
def test_auto_keeps_the_weighted_law_above_the_eigendecomposition_limit() -> None:
    """Local hashing at k > 2,048 used to simulate at O(n k) per draw (0.22 s per draw at
    k = 4,096, n = 20,000); now only Hadamard response, whose covariance has no such form,
    simulates there. The Type I of the weighted law at that k: 150 null studies at alpha = 0.1
    inside the 99% binomial band (k = 4,096 is in docs/validation.md)."""
    k, n = MAX_SUPPORT_IMHOF + 200, 20_000
    p0 = 1 / np.arange(1, k + 1)
    p0 /= p0.sum()
    assert choose("auto", HadamardResponse(k, 1.0), n, p0, composite=False).simulated
    mech = LocalHashing(k, 1.0)
    assert not choose("auto", mech, n, p0, composite=False).simulated
    reps, rng = 150, np.random.default_rng(41)
    results = [
        goodness_of_fit(Histogram(mech, n, values), p0, 0.1)
        for values in mech.simulate_histogram(n, p0, rng, size=reps)
    ]
    assert {r.calibration for r in results} == {"asymptotic"}
    low, high = stats.binom.interval(0.99, reps, 0.1)
    assert low <= sum(r.reject for r in results) <= high
