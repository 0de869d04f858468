"""The anytime guarantees at the validation's scale (issue 30; scripts/validate_sequential.py):
every mechanism, looked at after every 100 reports up to n = 20,000, 200 paths; the count of
paths that ever reject a true null (or whose confidence sequence ever misses) stays within the
99% binomial band of alpha. Fixed seeds."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from aggregator.histogram import Histogram
from aggregator.stats.anytime import EProcess, nulls
from aggregator.stats.anytime.sequences import frequency_excluded, mean_score_excluded
from client.mechanisms import (
    FlipComponents,
    GaussianNoise,
    HadamardResponse,
    LaplaceNoise,
    OptimizedUnaryEncoding,
    RandomizedResponse,
    SubsetSelection,
)

pytestmark = pytest.mark.slow  # a statistical validation (docs/validation.md)

ALPHA = 0.05
PATHS = 200
LOOKS = 200
MECHANISMS = [
    RandomizedResponse(k=4, epsilon=1.0),
    FlipComponents(k=4, epsilon=1.0),
    OptimizedUnaryEncoding(k=4, epsilon=1.0),
    HadamardResponse(k=4, epsilon=1.0),
    SubsetSelection(k=4, epsilon=1.0),
    GaussianNoise(k=4, rho=0.5),
    LaplaceNoise(k=4, epsilon=1.0),
]
BAND = int(stats.binom.ppf(0.99, PATHS, ALPHA))


def cumulative(mech, p, seed):
    draws = mech.simulate_histogram(100, p, np.random.default_rng(seed), size=LOOKS * PATHS)
    return np.cumsum(draws.reshape(LOOKS, PATHS, -1), axis=0)


@pytest.mark.parametrize("mech", MECHANISMS, ids=lambda m: m.name)
def test_sequential_goodness_of_fit_type_one(mech):
    p0 = np.full(4, 0.25)
    path_stats = cumulative(mech, p0, seed=101)
    rejected = 0
    for i in range(PATHS):
        process = EProcess(nulls.simple(p0, 4), [mech], ALPHA)
        for look, values in enumerate(path_stats[:, i], start=1):
            result = process.update([Histogram(mech, look * 100, values)])
        rejected += result.reject
    assert rejected <= BAND


@pytest.mark.parametrize("mech", MECHANISMS, ids=lambda m: m.name)
def test_sequences_cover_over_the_whole_path(mech):
    p = np.array([0.1, 0.2, 0.3, 0.4])
    missed = np.zeros(PATHS, dtype=bool)
    missed_mean = np.zeros(PATHS, dtype=bool)
    for look, values in enumerate(cumulative(mech, p, seed=202), start=1):
        missed |= frequency_excluded(look * 100, values, mech, p, ALPHA).any(axis=1)
        missed_mean |= mean_score_excluded(look * 100, values, mech, 3.0, alpha=ALPHA)
    assert missed.sum() <= BAND
    assert missed_mean.sum() <= BAND
