"""k-sample homogeneity across G >= 2 public groups: equal to the two-sample test at G = 2 for
every mechanism family, Type I inside the 99% binomial band at G = 3 and 5 (small n, sparse
large k, tiny and large epsilon), power against the noncentral prediction, and typed errors
(docs/two-sample.md, "More than two groups")."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from aggregator.errors import IncompatibleHistogramsError, InsufficientDataError, InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats import k_sample, k_sample_power, two_sample, two_sample_power
from aggregator.stats.studies import draw_histogram, geometric, k_sample_rate, zipf
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

ALPHA = 0.05
EVERY_FAMILY = [
    RandomizedResponse(6, 1.0),
    FlipComponents(6, 1.0),
    GaussianNoise(6, 0.5),
    LaplaceNoise(6, 1.0),
    HadamardResponse(12, 1.0),
    OptimizedUnaryEncoding(12, 1.0),
    SubsetSelection(12, 1.0),
    SubsetSelection(64, 8.0),  # d = 1: one-category reports
    LocalHashing(12, 1.0),
    PublicCoinBit(8, 1.0, 7, 4),
]


@pytest.mark.parametrize("mech", EVERY_FAMILY, ids=lambda m: m.describe())
def test_two_groups_give_the_two_sample_test(mech):
    rng = np.random.default_rng(zlib.crc32(mech.describe().encode()))
    p = zipf(mech.k)
    a, b = draw_histogram(mech, p, 800, rng), draw_histogram(mech, p, 500, rng)
    pair, k = two_sample(a, b, calibration="asymptotic"), k_sample([a, b], calibration="asymptotic")
    assert k.statistic == pytest.approx(pair.statistic, rel=1e-9)
    assert k.pvalue == pytest.approx(pair.pvalue, rel=1e-6, abs=1e-12)
    assert k.dof == pair.dof
    q = p.copy()
    q[0], q[1] = q[0] + 0.05, q[1] - 0.05
    assert k_sample_power(mech, [p, q], [800, 500]) == pytest.approx(
        two_sample_power(mech, p, q, (800, 500)), rel=1e-9
    )


# (mechanism, p, sizes, trials): small n, sparse k, eps 0.05 .. 8, every family, G = 3 and 5
TYPE1 = [
    (RandomizedResponse(4, 1.0), zipf(4), (30, 20, 25), 300),
    (RandomizedResponse(16, 0.05), zipf(16), (400, 600, 500), 300),
    (FlipComponents(8, 1.0), zipf(8), (300, 200, 250, 300, 200), 200),
    (GaussianNoise(6, 0.5), zipf(6), (400, 300, 500), 300),
    (LaplaceNoise(6, 1.0), zipf(6), (300, 300, 300), 200),
    (HadamardResponse(30, 1.0), zipf(30), (400, 300, 300), 200),
    (OptimizedUnaryEncoding(64, 8.0), geometric(64, 0.9), (150, 150, 150), 200),
    (SubsetSelection(12, 1.0), zipf(12), (200, 150, 150), 200),
    (LocalHashing(12, 1.0), zipf(12), (200, 150, 200), 200),
    (PublicCoinBit(8, 1.0, 7, 4), zipf(8), (300, 400, 300), 300),
]


@pytest.mark.parametrize(("mech", "p", "sizes", "trials"), TYPE1, ids=lambda v: str(v)[:30])
def test_type1_inside_band(mech, p, sizes, trials):
    rate = k_sample_rate(
        mech,
        [p] * len(sizes),
        sizes,
        trials=trials,
        seed=zlib.crc32(f"k-sample {mech.describe()} {sizes}".encode()),
        n_draws=99,
    )
    assert rate.within_band(ALPHA), f"{mech.describe()} {sizes}: Type I {rate.rate:.3f}"


@pytest.mark.parametrize(
    ("mech", "scale"),
    [
        (RandomizedResponse(4, 2.0), 1),
        (FlipComponents(4, 2.0), 1),
        (GaussianNoise(4, 2.0), 1),
        (HadamardResponse(8, 2.0), 3),
    ],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_power_matches_noncentral_prediction(mech, scale):
    ps = [zipf(mech.k), zipf(mech.k), zipf(mech.k)]
    ps[1] = ps[1] + np.r_[0.05, -0.05, np.zeros(mech.k - 2)]
    ps[2] = ps[2] + np.r_[0.0, 0.04, -0.04, np.zeros(mech.k - 3)]
    sizes = (1500 * scale, 1000 * scale, 1200 * scale)
    predicted = k_sample_power(mech, ps, sizes)
    rate = k_sample_rate(mech, ps, sizes, trials=300, seed=21, calibration="asymptotic")
    assert 0.2 < predicted < 0.95
    assert rate.close_to(predicted, points=0.06), (rate.rate, predicted)


def test_permutation_null_keeps_its_level_at_tiny_n():
    """Randomized response's exact permutation null with 4-6 reports a group."""
    rate = k_sample_rate(
        RandomizedResponse(3, 1.0), [zipf(3)] * 3, (4, 6, 5), trials=400, seed=5, n_draws=99
    )
    assert rate.rate <= ALPHA + 3 * np.sqrt(ALPHA * (1 - ALPHA) / 400), rate.rate


def test_clear_differences_are_found():
    rr = RandomizedResponse(3, 1.0)
    clinics = [Histogram(rr, 1000, c) for c in ([420, 300, 280], [330, 340, 330], [340, 320, 340])]
    result = k_sample(clinics)
    assert result.reject and result.dof == 4 and result.n == 3000
    same = k_sample([clinics[1], clinics[1], clinics[1]])
    assert same.statistic == pytest.approx(0.0) and not same.reject


def test_typed_errors():
    rr = RandomizedResponse(3, 1.0)
    hist = Histogram(rr, 10, [4, 3, 3])
    with pytest.raises(InvalidInputError, match="at least two"):
        k_sample([hist])
    with pytest.raises(InvalidInputError, match="at least two"):
        k_sample(hist)  # type: ignore[arg-type]
    with pytest.raises(IncompatibleHistogramsError, match="same question definition"):
        k_sample([hist, hist, Histogram(RandomizedResponse(3, 2.0), 10, [4, 3, 3])])
    with pytest.raises(InsufficientDataError):
        k_sample([hist, Histogram(rr, 0, [0, 0, 0])])
    with pytest.raises(InvalidInputError, match="one size per group"):
        k_sample_power(rr, [zipf(3), zipf(3)], [10, 10, 10])
