"""Histogram: validation, construction from reports, and exact merging across shards."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aggregator.errors import IncompatibleHistogramsError, InvalidInputError
from aggregator.histogram import Histogram
from client.mechanisms import FlipComponents, GaussianNoise, LaplaceNoise, RandomizedResponse

K = 4
P = np.array([0.1, 0.2, 0.3, 0.4])
MECHANISMS = [
    RandomizedResponse(K, 1.0),
    FlipComponents(K, 1.0),
    GaussianNoise(K, 0.5),
    LaplaceNoise(K, 1.0),
]
RR, FC, GAUSS, LAPLACE = MECHANISMS
IDS = [m.name for m in MECHANISMS]
by_mechanism = pytest.mark.parametrize("mech", MECHANISMS, ids=IDS)


def reports(mech, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return mech.simulate(rng.choice(mech.k, size=n, p=P), rng)


def valid_values(mech, n: int) -> np.ndarray:
    return mech.aggregate(reports(mech, n))


# --- construction ---------------------------------------------------------------------------------


@by_mechanism
def test_valid_histogram(mech):
    values = valid_values(mech, 50)
    hist = Histogram(mech, np.int64(50), values)
    assert hist.n == 50 and type(hist.n) is int
    assert hist.k == K and hist.mechanism is mech
    assert hist.values.dtype == np.float64
    assert np.array_equal(hist.values, values)
    assert np.array_equal(hist.mean, values / 50)


@by_mechanism
def test_values_are_a_read_only_copy(mech):
    values = valid_values(mech, 50)
    hist = Histogram(mech, 50, values)
    with pytest.raises(ValueError):
        hist.values[0] = 1.0
    values[0] += 1  # the caller's array is not shared
    assert hist.values[0] == values[0] - 1


@by_mechanism
@pytest.mark.parametrize("shape", [(K - 1,), (K + 1,), (1, K), (), (K, 1)], ids=str)
def test_rejects_wrong_shape(mech, shape):
    with pytest.raises(InvalidInputError):
        Histogram(mech, 0, np.zeros(shape))


@by_mechanism
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_rejects_non_finite_values(mech, bad):
    values = valid_values(mech, 50)
    values[2] = bad
    with pytest.raises(InvalidInputError):
        Histogram(mech, 50, values)


@by_mechanism
@pytest.mark.parametrize("n", [-1, 2.0, 2.5, True, "2", None, math.nan], ids=repr)
def test_rejects_bad_n(mech, n):
    with pytest.raises(InvalidInputError):
        Histogram(mech, n, valid_values(mech, 2))


def test_rejects_a_non_mechanism():
    with pytest.raises(InvalidInputError):
        Histogram("randomized_response", 0, np.zeros(K))


@pytest.mark.parametrize(
    ("mech", "n", "values"),
    [
        (RR, 10, [1, 2, 3, 3]),  # sums to 9
        (RR, 10, [1, 2, 3, 5]),  # sums to 11
        (RR, 10, [-1, 3, 3, 5]),  # negative count
        (RR, 10, [0.5, 2.5, 3, 4]),  # sums to n but not integers
        (FC, 10, [1.5, 2, 3, 4]),
        (FC, 10, [11, 0, 0, 0]),  # more ones than reports
        (FC, 10, [-1, 0, 0, 0]),
        (RR, 0, [1, 0, 0, 0]),
        (FC, 0, [0, 0, 1, 0]),
        (GAUSS, 0, [0, 0.5, 0, 0]),
        (LAPLACE, 0, [0, 0, 0, -1 / 1024]),
    ],
    ids=lambda v: v.name if hasattr(v, "name") else None,
)
def test_rejects_values_outside_the_support(mech, n, values):
    with pytest.raises(InvalidInputError) as info:
        Histogram(mech, n, np.array(values, dtype=float))
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("mech", "values"), [(GAUSS, [-3.5, 0.25, 1e6, 2.0]), (FC, [0, 10, 0, 10])]
)
def test_accepts_any_finite_sums_within_the_support(mech, values):
    """Additive sums may be negative or exceed n; flip-component sums may reach n."""
    assert Histogram(mech, 10, values).values.tolist() == values


@pytest.mark.parametrize("values", [[1, [2, 3], 0, 0], ["a", 0, 0, 0]], ids=["ragged", "string"])
def test_unconvertible_values_raise_invalid_input(values):
    with pytest.raises(InvalidInputError):
        Histogram(GAUSS, 1, values)


# --- from reports ---------------------------------------------------------------------------------


@by_mechanism
def test_from_reports_equals_aggregate(mech):
    stack = reports(mech, 700, seed=3)
    hist = Histogram.from_reports(mech, stack)
    assert hist == Histogram(mech, 700, mech.aggregate(stack))
    assert hist.n == 700


@by_mechanism
def test_from_secure_reports(mech):
    stack = np.array([mech.randomize(x % K) for x in range(40)])
    hist = Histogram.from_reports(mech, stack)
    assert hist.n == 40
    assert np.array_equal(hist.values, mech.aggregate(stack))


@pytest.mark.parametrize(
    ("mech", "bad"),
    [
        (RR, np.array([0, 1, K])),
        (RR, np.array([0.0, 1.0])),
        (FC, np.zeros((3, K + 1), dtype=np.uint8)),
        (FC, np.zeros(K, dtype=np.uint8)),
        (GAUSS, np.zeros((3, K - 1), dtype=np.int64)),
        (LAPLACE, np.zeros(K, dtype=np.int64)),
    ],
    ids=lambda v: v.name if hasattr(v, "name") else None,
)
def test_from_reports_rejects_malformed_reports(mech, bad):
    with pytest.raises(InvalidInputError):
        Histogram.from_reports(mech, bad)


# --- merging --------------------------------------------------------------------------------------


def shards(mech, sizes=(311, 1000, 57)):
    stack = reports(mech, sum(sizes), seed=9)
    parts = np.split(stack, np.cumsum(sizes)[:-1])
    return stack, [Histogram.from_reports(mech, part) for part in parts]


@by_mechanism
def test_merge_is_associative_and_commutative(mech):
    """Exact equality, also for the additive mechanisms: their values are dyadic (grid sums
    divided by a power of two), so float addition is exact in any order."""
    _, (a, b, c) = shards(mech)
    assert (a + b) + c == a + (b + c)
    assert a + b == b + a
    assert (a + b) + c == (c + a) + b
    assert (a + b + c).n == a.n + b.n + c.n


@by_mechanism
def test_shards_sum_to_the_histogram_of_all_reports(mech):
    stack, parts = shards(mech)
    whole = Histogram.from_reports(mech, stack)
    assert sum(parts, Histogram.empty(mech)) == whole
    assert sum(reversed(parts), Histogram.empty(mech)) == whole


@by_mechanism
def test_empty_is_the_identity(mech):
    empty = Histogram.empty(mech)
    assert empty.n == 0 and np.array_equal(empty.values, np.zeros(K))
    _, (a, _, _) = shards(mech)
    assert a + empty == a
    assert empty + a == a
    assert empty + empty == empty
    with pytest.raises(InvalidInputError):
        _ = empty.mean


@pytest.mark.parametrize(
    ("left", "right"),
    [
        (RR, RandomizedResponse(K + 1, 1.0)),
        (RR, RandomizedResponse(K, 2.0)),
        (RR, FlipComponents(K, 1.0)),
        (FC, FlipComponents(K, 1.5)),
        (GAUSS, GaussianNoise(K, 0.25)),
        (GAUSS, GaussianNoise(K, 0.5, granularity_bits=8)),
        (GaussianNoise(K, 1.0), LaplaceNoise(K, 1.0)),
        (LAPLACE, LaplaceNoise(K + 1, 1.0)),
    ],
    ids=lambda m: m.describe(),
)
def test_merging_different_mechanisms_is_refused(left, right):
    a, b = Histogram.empty(left), Histogram.empty(right)
    for first, second in ((a, b), (b, a)):
        with pytest.raises(IncompatibleHistogramsError) as info:
            _ = first + second
        assert isinstance(info.value, InvalidInputError)


def test_equal_mechanisms_built_separately_merge():
    a = Histogram(RandomizedResponse(K, 1), 1, [0, 1, 0, 0])
    b = Histogram(RandomizedResponse(np.int64(K), 1.0), 2, [1, 1, 0, 0])
    assert (a + b).values.tolist() == [1, 2, 0, 0]


@by_mechanism
def test_adding_a_non_histogram_is_a_type_error(mech):
    with pytest.raises(TypeError):
        _ = Histogram.empty(mech) + np.zeros(K)


def test_equality_and_hashing():
    a = Histogram(RR, 3, [1, 1, 1, 0])
    assert a == Histogram(RR, 3, np.array([1.0, 1.0, 1.0, 0.0]))
    assert a != Histogram(RR, 3, [1, 1, 0, 1])
    assert a != Histogram(RandomizedResponse(K, 2.0), 3, [1, 1, 1, 0])
    assert a != Histogram(FC, 3, [1, 1, 1, 0])
    assert a != "histogram"
    with pytest.raises(TypeError):
        hash(a)


def test_repr_names_the_mechanism():
    text = repr(Histogram(RR, 3, [1, 1, 1, 0]))
    assert "randomized_response(k=4, epsilon=1)" in text and "n=3" in text
