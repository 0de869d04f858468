"""Sequential tests on support counts with the report's exact conditional law (issue 30;
aggregator/stats/anytime/support_laws.py): the moment generating functions against brute-force
enumeration of every report, each batch's factor of expectation 1 under the null (simulated with
the mechanism's own sampler), Type I under repeated looks within the 99% binomial band, and the
power gained over Hoeffding's bound. Fixed seeds."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import special, stats

from aggregator.histogram import Histogram
from aggregator.stats.anytime import EProcess, laws, nulls
from aggregator.stats.anytime.eprocess import MAX_TILT, tilts
from client.mechanisms import (
    HadamardResponse,
    LocalHashing,
    OptimizedUnaryEncoding,
    SubsetSelection,
)

ALPHA = 0.05
P0 = np.full(4, 0.25)
P1 = np.array([0.3, 0.3, 0.2, 0.2])
EXACT = [OptimizedUnaryEncoding(4, 1.0), HadamardResponse(4, 1.0), SubsetSelection(4, 1.0)]


def brute_force(mech, lam: np.ndarray) -> np.ndarray:
    """log sum_y P(y | x) exp(lam . y) over every support row y the mechanism can send."""
    k = mech.k
    out = np.empty(k)
    for x in range(k):
        if isinstance(mech, OptimizedUnaryEncoding):
            on = mech.offset + mech.slope * (np.arange(k) == x)
            rows = np.array(list(itertools.product([0, 1], repeat=k)))
            probs = np.prod(np.where(rows == 1, on, 1 - on), axis=1)
        elif isinstance(mech, SubsetSelection):
            d, a = mech.subset_size, mech.in_probability
            sets = list(itertools.combinations(range(k), d))
            rows = np.zeros((len(sets), k))
            for i, chosen in enumerate(sets):
                rows[i, list(chosen)] = 1
            probs = np.where(
                rows[:, x] == 1, a / special.comb(k - 1, d - 1), (1 - a) / special.comb(k - 1, d)
            )
        else:  # Hadamard response: every column, read through the mechanism's own support
            rows = mech.support(np.arange(mech.columns)).astype(float)
            rho = mech.keep_probability
            probs = np.where(rows[:, x] == 1, rho, 1 - rho) * 2 / mech.columns
        assert math.isclose(probs.sum(), 1.0, rel_tol=1e-12)
        out[x] = math.log(np.sum(probs * np.exp(rows @ lam)))
    return out


@pytest.mark.parametrize(
    "mech",
    [
        OptimizedUnaryEncoding(5, 1.0),
        SubsetSelection(5, 1.0),
        SubsetSelection(12, 0.2),  # d = 6
        SubsetSelection(9, 3.0),  # d = 1
        HadamardResponse(5, 1.0),
        HadamardResponse(8, 2.0),  # K = 16
    ],
    ids=lambda m: m.describe(),
)
def test_conditional_mgf_matches_enumeration(mech):
    rng = np.random.default_rng(7)
    assert not laws.hoeffding_bound(mech)
    for scale in (0.2, MAX_TILT):
        lam = rng.uniform(-scale, scale, mech.k)
        want = brute_force(mech, lam)
        assert laws.log_conditional_mgf(mech, lam) == pytest.approx(want, rel=1e-12, abs=1e-12)
    stacked = rng.normal(size=(3, mech.k))
    rows = laws.log_conditional_mgf(mech, stacked)
    assert rows[2] == pytest.approx(laws.log_conditional_mgf(mech, stacked[2]), rel=1e-14)


def test_exact_laws_are_below_hoeffding_and_local_hashing_keeps_it():
    """Hoeffding's bound is an upper bound of the exact MGF (the exact one bets more)."""
    rng = np.random.default_rng(8)
    lam = rng.uniform(-1, 1, (20, 4))
    for mech in EXACT:
        hoeffding = (
            mech.offset * lam.sum(axis=1, keepdims=True)
            + mech.slope * lam
            + np.abs(lam).sum(axis=1, keepdims=True) ** 2 / 8
        )
        assert np.all(laws.log_conditional_mgf(mech, lam) <= hoeffding + 1e-12)
    assert laws.hoeffding_bound(LocalHashing(4, 1.0))


@pytest.mark.parametrize(
    "mech", [*EXACT, SubsetSelection(10, 0.5), LocalHashing(4, 1.0)], ids=lambda m: m.describe()
)
def test_each_batch_factor_has_expectation_one_under_the_null(mech):
    """exp(lam . T - n kappa_p(lam)) over batches of 3 reports drawn by the mechanism's sampler:
    its mean is 1 (at most 1 for Hoeffding's bound), within 4 standard errors."""
    k = mech.k
    p = np.linspace(1, 2, k) / np.linspace(1, 2, k).sum()
    lam = tilts(mech, p, (0.7 * p + 0.3 * np.eye(k)[0])[None, :])[0]
    kappa = special.logsumexp(np.log(p) + laws.log_conditional_mgf(mech, lam))
    draws = mech.simulate_histogram(3, p, np.random.default_rng(9), size=40_000)
    factors = np.exp(draws @ lam - 3 * kappa)
    error = 4 * factors.std() / math.sqrt(factors.size)
    if laws.hoeffding_bound(mech):
        assert factors.mean() <= 1 + error
    else:
        assert abs(factors.mean() - 1) <= error


def run_paths(mech, p, paths: int, looks: int, seed: int) -> np.ndarray:
    """The n at which each path's goodness-of-fit e-process first reaches 1/alpha (0: never)."""
    draws = mech.simulate_histogram(100, p, np.random.default_rng(seed), size=looks * paths)
    cumulative = np.cumsum(draws.reshape(looks, paths, -1), axis=0)
    stopped = np.zeros(paths, dtype=int)
    for i in range(paths):
        process = EProcess(nulls.simple(P0, 4), [mech], ALPHA)
        for look, values in enumerate(cumulative[:, i], start=1):
            result = process.update([Histogram(mech, look * 100, values)])
            if result.reject:
                stopped[i] = look * 100
                break
    return stopped


@pytest.mark.parametrize("mech", EXACT, ids=lambda m: m.name)
def test_type_one_under_looks_stays_in_the_band(mech):
    """Under the null, looked at after every 100 reports up to 5,000 on 100 paths."""
    paths = 100
    rejected = int(np.count_nonzero(run_paths(mech, P0, paths, 50, seed=41)))
    assert rejected <= stats.binom.ppf(0.99, paths, ALPHA)


@pytest.mark.parametrize("mech", EXACT, ids=lambda m: m.name)
def test_exact_law_stops_where_hoeffding_rarely_did(mech):
    """Under (0.3, 0.3, 0.2, 0.2) the median stop of 20 paths is at most 12,000 reports; with
    Hoeffding's bound it was 11,450 (subset selection), 17,300 and 17,900 (optimized unary,
    Hadamard response) on 40 paths (docs/validation.md)."""
    stops = run_paths(mech, P1, 20, 120, seed=42)
    assert np.count_nonzero(stops) >= 11
