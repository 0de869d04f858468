"""Design statistics kept per design key: the sums a store keeps give the contributions' sums
exactly, and the frame joined to them gives the cells the reports themselves give."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.errors import InvalidInputError
from aggregator.stats import design_estimate
from aggregator.stats.design.cells import (
    Design,
    contributions,
    contributions_from_counts,
    design_cells,
)
from aggregator.stats.design.keys import keyed_cells
from client.mechanisms import (
    FlipComponents,
    GaussianNoise,
    HadamardResponse,
    LaplaceNoise,
    LocalHashing,
    OptimizedUnaryEncoding,
    PublicCoinBit,
    RandomizedResponse,
    SubsetSelection,
)

MECHANISMS = [
    RandomizedResponse(k=4, epsilon=1.0),
    FlipComponents(k=4, epsilon=1.0),
    GaussianNoise(k=4, rho=0.5),
    LaplaceNoise(k=4, epsilon=1.0),
    OptimizedUnaryEncoding(k=4, epsilon=1.0),
    HadamardResponse(k=4, epsilon=1.0),
    SubsetSelection(k=4, epsilon=1.0),
    LocalHashing(k=4, epsilon=1.0),
]


def _store_sums(mechanism, decoded):
    """What the store keeps of reports: n, the int64 sums of their rows, the sums of squares."""
    rows = mechanism.statistic_rows(decoded)
    return len(rows), rows.sum(axis=0), np.square(rows.astype(float)).sum(axis=0)


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m.name)
def test_contributions_from_counts_equal_the_summed_contributions(mechanism):
    rng = np.random.default_rng(3)
    decoded = mechanism.simulate(rng.choice(4, size=500, p=[0.4, 0.3, 0.2, 0.1]), rng)
    x_hat = contributions(mechanism, decoded)
    total, square = contributions_from_counts(mechanism, *_store_sums(mechanism, decoded))
    np.testing.assert_allclose(total, x_hat.sum(axis=0), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(square, (x_hat**2).sum(axis=0), rtol=1e-12)


def test_public_coin_reports_have_no_contributions():
    mechanism = PublicCoinBit(4, 1.0, 7, 2)
    with pytest.raises(InvalidInputError, match="no per-report contribution"):
        contributions_from_counts(mechanism, 1, np.zeros(mechanism.statistic_size))


def test_additive_noise_needs_the_sums_of_squares():
    with pytest.raises(InvalidInputError, match="squares"):
        contributions_from_counts(GaussianNoise(k=4, rho=0.5), 1, np.zeros(4))


#: A frame: key -> (stratum, psu, weight): two weight classes in some PSUs.
FRAME = {
    f"{h}-{c}-{w}": (f"s{h}", f"p{h}{c}", 1.0 + h + 2.5 * w)
    for h in range(3)
    for c in range(4)
    for w in range(2)
}


@pytest.mark.parametrize("mechanism", MECHANISMS[:3], ids=lambda m: m.name)
@pytest.mark.parametrize("fpc", [False, True])
def test_keyed_cells_equal_the_reports_cells(mechanism, fpc):
    rng = np.random.default_rng(5)
    names = sorted(FRAME)
    key_of = rng.choice(len(names), size=900)
    answers = rng.choice(4, size=900, p=[0.4, 0.3, 0.2, 0.1])
    decoded = mechanism.simulate(answers, rng)
    group = rng.choice(2, size=900)
    rows = [FRAME[names[i]] for i in key_of]
    stratum = np.array([r[0] for r in rows])
    fpcs = np.array([{"s0": 10, "s1": 0.5, "s2": 8}[s] for s in stratum], dtype=float)
    design = Design(
        stratum,
        np.array([r[1] for r in rows]),
        np.array([r[2] for r in rows]),
        fpcs if fpc else None,
    )
    expected = design_cells(contributions(mechanism, decoded), design, group, 2)
    stats = []
    for i in np.unique(key_of):
        for g in (0, 1):
            mask = (key_of == i) & (group == g)
            if mask.any():
                total, square = contributions_from_counts(
                    mechanism, *_store_sums(mechanism, decoded[mask])
                )
                stats.append((names[i], g, int(mask.sum()), total, square))
    frame = [FRAME[s[0]] for s in stats]
    by_stratum = {"s0": 10, "s1": 0.5, "s2": 8}
    got = keyed_cells(
        np.array([f[0] for f in frame]),
        np.array([f[1] for f in frame]),
        np.array([f[2] for f in frame]),
        np.array([by_stratum[f[0]] for f in frame], dtype=float) if fpc else None,
        np.array([s[2] for s in stats]),
        np.array([s[3] for s in stats]),
        np.array([s[4] for s in stats]),
        np.array([s[1] for s in stats]),
        2,
    )
    for name in ("stratum", "sampling_fraction", "count", "weight", "weight_square"):
        np.testing.assert_allclose(getattr(got, name), getattr(expected, name), rtol=1e-12)
    np.testing.assert_allclose(got.total, expected.total, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(got.square, expected.square, rtol=1e-12)
    a, b = design_estimate(got, mechanism), design_estimate(expected, mechanism)
    np.testing.assert_allclose(a.estimate, b.estimate, rtol=1e-12)
    np.testing.assert_allclose(a.covariance, b.covariance, rtol=1e-10)
