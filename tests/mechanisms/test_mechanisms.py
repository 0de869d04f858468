"""Unit and statistical tests of the four local randomizers (client/mechanisms).

Statistical checks use fixed numpy seeds where numpy draws; the secure path (``randomize``) reads
the OS CSPRNG and cannot be seeded, so every check has a false-failure probability of at most
~1e-7: means and rates use ``|z| < 5.5`` (two-sided 3.8e-8 under normality); second moments use
``|z| < 6`` because the sampling law of a variance estimate is right-skewed (for Laplace noise
and 3,000 reports the Cornish-Fisher 1e-7 quantile is ~5.9 standard errors); chi-square and
two-sample p-values must exceed 1e-7.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import struct
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from client.mechanisms import (
    FlipComponents,
    GaussianNoise,
    LaplaceNoise,
    Mechanism,
    OptimizedUnaryEncoding,
    PrivacyCost,
    PublicCoinBit,
    RandomizedResponse,
    ReportRangeError,
    as_exchangeable,
    as_public_coin,
)
from client.mechanisms.discrete_noise import discrete_gaussian_variance

Z_MEAN = 5.5
Z_MOMENT = 6.0
P_MIN = 1e-7
K = 4
X = 1  # the true answer behind every conditional sample
P = np.array([0.1, 0.2, 0.3, 0.4])

CLASSES = {
    "randomized_response": RandomizedResponse,
    "flip_components": FlipComponents,
    "gaussian": GaussianNoise,
    "laplace": LaplaceNoise,
}
DEFAULT_PARAMETER = {
    "randomized_response": 1.0,
    "flip_components": 1.0,
    "gaussian": 0.5,
    "laplace": 1.0,
}
NAMES = list(CLASSES)
ADDITIVE = ["gaussian", "laplace"]


_DEFAULT = object()


def make(name: str, k: object = K, parameter: object = _DEFAULT, **kwargs) -> Mechanism:
    parameter = DEFAULT_PARAMETER[name] if parameter is _DEFAULT else parameter
    return CLASSES[name](k, parameter, **kwargs)


def label(mech: object) -> str | None:
    """Test id of a mechanism (None: let pytest name other parameters)."""
    if not isinstance(mech, Mechanism):
        return None
    bits = getattr(mech, "granularity_bits", None)
    return mech.describe() + ("" if bits is None else f"[g=2^{bits}]")


# The four default mechanisms, plus the additive ones on the coarsest grid, where the discrete
# noise law differs visibly from its continuous limit (variance 0.4627... instead of 0.5, and
# 7.84... instead of 8).
CONFIGS = [make(name) for name in NAMES] + [
    GaussianNoise(K, 2.0, granularity_bits=0),
    LaplaceNoise(K, 1.0, granularity_bits=0),
]
SECURE_N = {
    "randomized_response": 20_000,
    "flip_components": 20_000,
    "gaussian": 3_000,
    "laplace": 3_000,
}
NUMPY_N = 200_000


def onehot(x: int, k: int = K) -> np.ndarray:
    return np.eye(k)[x]


def report_vectors(mech: Mechanism, reports: np.ndarray) -> np.ndarray:
    """The real report vectors whose mean and covariance the channel describes."""
    if isinstance(mech, RandomizedResponse):
        return np.eye(mech.k)[reports]
    if isinstance(mech, FlipComponents):
        return np.asarray(reports, dtype=np.float64)
    return mech.to_real(reports)


@functools.cache
def secure_reports(mech: Mechanism) -> np.ndarray:
    """Reports of the true answer X from the secure path (cached: several tests share them)."""
    return np.array([mech.randomize(X) for _ in range(SECURE_N[mech.name])])


@functools.cache
def numpy_reports(mech: Mechanism) -> np.ndarray:
    return mech.simulate(np.full(NUMPY_N, X), np.random.default_rng(1234))


def sample(mech: Mechanism, source: str) -> np.ndarray:
    return secure_reports(mech) if source == "secure" else numpy_reports(mech)


def assert_rate(successes: int, n: int, p: float) -> None:
    z = (successes - n * p) / math.sqrt(n * p * (1 - p))
    assert abs(z) < Z_MEAN, f"rate {successes / n:.6f} vs {p:.6f} (z = {z:.2f})"


def assert_moments(vectors: np.ndarray, mean: np.ndarray, cov: np.ndarray) -> None:
    """Sample mean ~ ``mean`` (standard errors from ``cov``) and the second moments about the
    true mean ~ ``cov`` (standard errors from the sample), entry by entry."""
    n = vectors.shape[0]
    z_mean = (vectors.mean(axis=0) - mean) / np.sqrt(np.diag(cov) / n)
    assert np.abs(z_mean).max() < Z_MEAN, f"mean z-scores {z_mean}"
    dev = vectors - mean
    products = dev[:, :, None] * dev[:, None, :]
    se = products.std(axis=0) / math.sqrt(n)
    gap = np.abs(products.mean(axis=0) - cov)
    assert (gap <= Z_MOMENT * se + 1e-12).all(), f"covariance gap / se:\n{gap / se}"


def dyadic_exact(values: np.ndarray, scale: int, integers) -> bool:
    return all(
        Fraction(float(v)) == Fraction(int(i), scale) for v, i in zip(values, integers, strict=True)
    )


# --- parameter validation -------------------------------------------------------------------------

BAD_K = [1, 0, -3, 2.0, 3.5, True, False, "4", None, 2**31 + 1]
BAD_PARAMETER = [0, 0.0, -1.0, -1e-300, math.nan, math.inf, -math.inf, "1.0", None, True, 1 + 0j]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("k", BAD_K, ids=repr)
def test_rejects_bad_k(name, k):
    with pytest.raises(ValueError):
        make(name, k=k)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("parameter", BAD_PARAMETER, ids=repr)
def test_rejects_bad_privacy_parameter(name, parameter):
    with pytest.raises(ValueError):
        make(name, parameter=parameter)


@pytest.mark.parametrize("name", NAMES)
def test_parameters_are_normalised(name):
    mech = make(name, k=np.int64(5), parameter=Fraction(1, 2))
    assert type(mech.k) is int and mech.k == 5
    assert type(mech.parameter) is float and mech.parameter == 0.5
    assert make(name, k=2, parameter=np.float32(0.25)).parameter == 0.25


@pytest.mark.parametrize("name", ADDITIVE)
@pytest.mark.parametrize("bits", [-1, 21, 2.0, True, "10", None], ids=repr)
def test_rejects_bad_granularity(name, bits):
    with pytest.raises(ValueError):
        make(name, granularity_bits=bits)


@pytest.mark.parametrize("name", ADDITIVE)
def test_granularity_is_keyword_only_and_sets_the_scale(name):
    with pytest.raises(TypeError):
        CLASSES[name](K, 1.0, 3)
    assert make(name).scale == 2**10
    assert make(name, granularity_bits=0).scale == 1
    assert make(name, granularity_bits=20).scale == 2**20


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "value", [-1, K, K + 7, 2**70, 1.0, np.float64(1.0), True, np.bool_(True), "1", None], ids=repr
)
def test_randomize_rejects_bad_values(name, value):
    with pytest.raises(ValueError):
        make(name).randomize(value)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "values",
    [
        np.array([[0, 1]]),
        np.array([0.0, 1.0]),
        np.array([0, K]),
        np.array([-1, 0]),
        np.array([True, False]),
    ],
    ids=["2d", "float", "too-big", "negative", "bool"],
)
def test_simulate_rejects_bad_values(name, values):
    with pytest.raises(ValueError):
        make(name).simulate(values, np.random.default_rng(0))


# --- privacy cost ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mech", "kind", "value"),
    [
        (RandomizedResponse(3, 0.7), "pure", 0.7),
        (FlipComponents(3, 0.7), "pure", 0.7),
        (LaplaceNoise(3, 0.7), "pure", 0.7),
        (GaussianNoise(3, 0.7), "zcdp", 0.7),
    ],
    ids=label,
)
def test_cost(mech, kind, value):
    cost = mech.cost
    assert cost == PrivacyCost(kind, value)
    assert mech.parameter == value
    if kind == "pure":
        assert cost.epsilon == value
        assert cost.rho == pytest.approx(value**2 / 2, rel=1e-15)
    else:
        assert cost.epsilon is None
        assert cost.rho == value


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("pure", -1.0),
        ("zcdp", -0.5),
        ("pure", 0.0),
        ("pure", math.nan),
        ("zcdp", math.inf),
        ("pure", "1"),
        ("renyi", 1.0),
    ],
)
def test_privacy_cost_rejects_invalid(kind, value):
    with pytest.raises(ValueError):
        PrivacyCost(kind, value)


def test_describe():
    assert RandomizedResponse(4, 1.5).describe() == "randomized_response(k=4, epsilon=1.5)"
    assert GaussianNoise(3, 0.25).describe() == "gaussian(k=3, rho=0.25)"


# --- realised privacy of the integer samplers -----------------------------------------------------
#
# The secure samplers compare a uniform integer on a 2**-64 grid (k * 2**64 values for randomized
# response) with a threshold rounded towards privacy, so the realised lie / flip probability exceeds
# the exact one by at most two grid steps. Where that is negligible against the probability itself,
# the realised epsilon is within 1e-9 of epsilon; for huge epsilon it saturates near the grid.

RESOLVED = [(2, 1e-6), (4, 1e-6), (2, 1.0), (7, 3.0), (1000, 5.0), (4, 20.0)]
SATURATED = [(2, 50.0), (10, 50.0), (4, 700.0)]


def rr_lie(k: int, epsilon: float) -> float:
    """Probability that randomized response reports a wrong category."""
    return (k - 1) / (math.exp(epsilon) + k - 1)


def fc_flip(epsilon: float) -> float:
    return 1 / (math.exp(epsilon / 2) + 1)


@pytest.mark.parametrize(("k", "epsilon"), RESOLVED + SATURATED)
def test_rr_realized_epsilon_is_at_most_epsilon_and_on_the_grid(k, epsilon):
    realized = RandomizedResponse(k, epsilon).realized_epsilon
    assert realized <= epsilon
    excess = rr_lie(k, realized) - rr_lie(k, epsilon)
    slack = 1e-12 * rr_lie(k, realized)  # float rounding of the probabilities themselves
    assert -slack <= excess <= 2 / (k * 2**64) + slack


@pytest.mark.parametrize(("k", "epsilon"), RESOLVED + SATURATED)
def test_fc_realized_epsilon_is_at_most_epsilon_and_on_the_grid(k, epsilon):
    realized = FlipComponents(k, epsilon).realized_epsilon
    assert realized <= epsilon
    excess = fc_flip(realized) - fc_flip(epsilon)
    slack = 1e-12 * fc_flip(realized)
    assert -slack <= excess <= 2 / 2**64 + slack


@pytest.mark.parametrize("cls", [RandomizedResponse, FlipComponents])
@pytest.mark.parametrize(("k", "epsilon"), RESOLVED)
def test_realized_epsilon_is_close_where_the_grid_resolves_it(cls, k, epsilon):
    assert 0 <= epsilon - cls(k, epsilon).realized_epsilon < 1e-9


@pytest.mark.parametrize("cls", [RandomizedResponse, FlipComponents])
@pytest.mark.parametrize(("k", "epsilon"), SATURATED)
def test_realized_epsilon_saturates_on_the_grid(cls, k, epsilon):
    """Documents the 64-bit grid: the realised epsilon of a huge nominal epsilon is finite and
    still large (the lie / flip probability is a couple of 2**-64 steps)."""
    realized = cls(k, epsilon).realized_epsilon
    assert 40 < realized < epsilon


# --- channel constants ----------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "epsilon"), RESOLVED + SATURATED)
def test_rr_channel_constants(k, epsilon):
    mech = RandomizedResponse(k, epsilon)
    keep = 1 - rr_lie(k, epsilon)
    assert mech.a0 + mech.a1 == pytest.approx(keep, rel=1e-12)
    assert mech.a0 == pytest.approx(rr_lie(k, epsilon) / (k - 1), rel=1e-12)
    assert mech.report_mean(onehot(0, k)).sum() == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("epsilon", [1e-6, 1.0, 20.0, 50.0, 700.0])
def test_fc_channel_constants(epsilon):
    mech = FlipComponents(3, epsilon)
    assert mech.flip_probability == pytest.approx(fc_flip(epsilon), rel=1e-12)
    assert mech.offset == mech.flip_probability
    assert mech.slope == pytest.approx(1 - 2 * fc_flip(epsilon), rel=1e-8)
    assert mech.keep_ratio == pytest.approx(math.exp(epsilon / 2), rel=1e-12)


# --- encoding -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mech", "size"),
    [
        (RandomizedResponse(2, 1.0), 4),
        (RandomizedResponse(1000, 1.0), 4),
        (FlipComponents(2, 1.0), 1),
        (FlipComponents(8, 1.0), 1),
        (FlipComponents(9, 1.0), 2),
        (FlipComponents(17, 1.0), 3),
        (GaussianNoise(3, 1.0), 24),
        (LaplaceNoise(5, 1.0), 40),
    ],
    ids=label,
)
def test_payload_size(mech, size):
    assert mech.payload_size == size


@pytest.mark.parametrize("mech", CONFIGS, ids=label)
def test_round_trip_of_randomized_reports_has_constant_length(mech):
    for value in range(mech.k):
        for _ in range(5):
            report = mech.randomize(value)
            payload = mech.encode(report)
            assert isinstance(payload, bytes)
            assert len(payload) == mech.payload_size
            assert np.array_equal(mech.decode(payload), report)


def test_rr_every_report_round_trips():
    mech = RandomizedResponse(5, 1.0)
    payloads = [mech.encode(y) for y in range(5)]
    assert {len(p) for p in payloads} == {4}
    assert [mech.decode(p) for p in payloads] == list(range(5))
    assert all(type(mech.decode(p)) is int for p in payloads)


def test_fc_every_bit_vector_round_trips():
    mech = FlipComponents(9, 1.0)  # two bytes, seven padding bits
    codes = np.arange(2**9)
    vectors = ((codes[:, None] >> np.arange(9)) & 1).astype(np.uint8)
    for bits in vectors:
        payload = mech.encode(bits)
        assert len(payload) == 2
        assert np.array_equal(mech.decode(payload), bits)


@pytest.mark.parametrize("name", ADDITIVE)
@pytest.mark.parametrize("bits", [0, 10])
def test_additive_decode_accepts_exactly_the_possible_range(name, bits):
    """decode accepts every coordinate in [-(g + bound), g + bound] and rejects anything beyond
    with ReportRangeError; the bound leaves honest devices a rejection chance below 1e-20."""
    mech = make(name, k=3, granularity_bits=bits)
    top = mech.scale + mech.noise_bound
    edge = np.array([-top, 0, top], dtype=np.int64)
    payload = mech.encode(edge)
    assert len(payload) == 24
    decoded = mech.decode(payload)
    assert decoded.dtype == np.int64 and np.array_equal(decoded, edge)
    for outside in ([top + 1, 0, 0], [0, -top - 1, 0], [0, 0, np.iinfo(np.int64).max]):
        with pytest.raises(ReportRangeError):
            mech.decode(np.array(outside, dtype="<i8").tobytes())


@pytest.mark.parametrize("mech", CONFIGS[2:], ids=label)
def test_additive_noise_bound_is_never_reached_by_honest_noise(mech):
    """P(|Z| > noise_bound) under the exact noise law (summed from its definition) is < 1e-20."""
    bound = mech.noise_bound
    if isinstance(mech, LaplaceNoise):
        r = math.exp(-mech.epsilon / (2 * mech.scale))
        tail = 2 * r ** (bound + 1) / (1 + r)  # P(|Z| > bound) for P(z) ~ r^|z|
    else:
        sigma2 = mech.scale**2 / mech.rho
        width = int(40 * math.sqrt(sigma2)) + 10
        weight = [math.exp(-(z * z) / (2 * sigma2)) for z in range(width)]
        total = weight[0] + 2 * math.fsum(weight[1:])
        tail = 2 * math.fsum(weight[bound + 1 :]) / total
    assert tail < 1e-20


@pytest.mark.parametrize("name", ADDITIVE)
def test_additive_decode_rejects_int64_min(name):
    """np.abs(-2**63) overflows to -2**63, so the range check passes; two such reports then
    aggregate to 0 by int64 wrap-around."""
    payload = np.array([np.iinfo(np.int64).min, 0], dtype="<i8").tobytes()
    with pytest.raises(ValueError):
        make(name, k=2).decode(payload)


@pytest.mark.parametrize("mech", CONFIGS[:4], ids=label)
@pytest.mark.parametrize("delta", [-1, 1, None], ids=["short", "long", "empty"])
def test_decode_rejects_wrong_length(mech, delta):
    size = 0 if delta is None else mech.payload_size + delta
    with pytest.raises(ValueError):
        mech.decode(b"\x00" * size)


@pytest.mark.parametrize("index", [5, 6, 2**31, 2**32 - 1])
def test_rr_decode_rejects_out_of_range_index(index):
    with pytest.raises(ReportRangeError):
        RandomizedResponse(5, 1.0).decode(struct.pack("<I", index))


@pytest.mark.parametrize("padding_bit", range(9, 16))
def test_fc_decode_rejects_nonzero_padding(padding_bit):
    mech = FlipComponents(9, 1.0)
    payload = (1 << padding_bit).to_bytes(2, "little")
    with pytest.raises(ValueError):
        mech.decode(payload)


def test_fc_decode_without_padding_accepts_all_ones():
    assert FlipComponents(8, 1.0).decode(b"\xff").tolist() == [1] * 8


@pytest.mark.parametrize(
    ("mech", "report"),
    [
        (RandomizedResponse(4, 1.0), 4),
        (RandomizedResponse(4, 1.0), -1),
        (FlipComponents(4, 1.0), np.array([1, 0, 0], dtype=np.uint8)),
        (FlipComponents(4, 1.0), np.array([2, 0, 0, 0])),
        (GaussianNoise(4, 1.0), np.zeros(3, dtype=np.int64)),
        (GaussianNoise(4, 1.0), np.zeros(4)),
        (LaplaceNoise(4, 1.0), np.zeros((1, 4), dtype=np.int64)),
    ],
    ids=label,
)
def test_encode_rejects_malformed_reports(mech, report):
    with pytest.raises(ValueError):
        mech.encode(report)


@pytest.mark.parametrize("report", [2.7, True], ids=repr)
def test_rr_encode_rejects_non_integer_reports(report):
    with pytest.raises(ValueError):
        RandomizedResponse(4, 1.0).encode(report)


# --- report types ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mech", CONFIGS, ids=label)
def test_randomize_output_type(mech):
    for value in range(mech.k):
        report = mech.randomize(np.int64(value))
        if isinstance(mech, RandomizedResponse):
            assert type(report) is int and 0 <= report < mech.k
        elif isinstance(mech, FlipComponents):
            assert report.dtype == np.uint8 and report.shape == (mech.k,)
            assert set(report.tolist()) <= {0, 1}
        else:
            assert report.dtype == np.int64 and report.shape == (mech.k,)


@pytest.mark.parametrize("mech", CONFIGS, ids=label)
def test_simulate_output_shape(mech):
    rng = np.random.default_rng(5)
    reports = mech.simulate(np.array([0, 3, 3, 1, 2]), rng)
    empty = mech.simulate(np.array([], dtype=np.int64), rng)
    if isinstance(mech, RandomizedResponse):
        assert reports.shape == (5,) and np.issubdtype(reports.dtype, np.integer)
        assert empty.shape == (0,)
    else:
        assert reports.shape == (5, mech.k) and np.issubdtype(reports.dtype, np.integer)
        assert empty.shape == (0, mech.k)
    assert np.array_equal(mech.aggregate(empty), np.zeros(mech.k))


# --- the law of one report ------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["secure", "numpy"])
@pytest.mark.parametrize(
    "mech", [RandomizedResponse(4, 1.0), RandomizedResponse(7, 0.3)], ids=label
)
def test_rr_keep_rate_and_uniform_lies(mech, source):
    reports = (
        np.array([mech.randomize(X) for _ in range(20_000)])
        if source == "secure"
        else mech.simulate(np.full(NUMPY_N, X), np.random.default_rng(7))
    )
    keep = math.exp(mech.epsilon) / (math.exp(mech.epsilon) + mech.k - 1)
    assert_rate(int((reports == X).sum()), reports.size, keep)
    lies = np.delete(np.bincount(reports, minlength=mech.k), X)
    assert stats.chisquare(lies).pvalue > P_MIN


@pytest.mark.parametrize("source", ["secure", "numpy"])
def test_fc_flip_rate_per_bit_and_independence(source):
    mech = FlipComponents(K, 1.0)
    reports = sample(mech, source)
    s = 1 / (math.exp(0.5) + 1)
    flips = reports != onehot(X)
    for j in range(K):
        assert_rate(int(flips[:, j].sum()), len(flips), s)
    # joint law of the flip pattern: independent bits, each flipped with probability s
    patterns = flips.astype(np.int64) @ (1 << np.arange(K))
    nflips = np.array([bin(c).count("1") for c in range(2**K)])
    expected = s**nflips * (1 - s) ** (K - nflips) * len(flips)
    assert stats.chisquare(np.bincount(patterns, minlength=2**K), expected).pvalue > P_MIN


def test_fc_many_categories_flip_rate():
    """k = 600 needs 4,800 random bytes per report, above the 4,096-byte buffer."""
    mech = FlipComponents(600, 2.0)
    flips = np.array([mech.randomize(5) for _ in range(200)]) != onehot(5, 600)
    assert_rate(int(flips.sum()), flips.size, mech.flip_probability)


@pytest.mark.parametrize("source", ["secure", "numpy"])
@pytest.mark.parametrize("mech", CONFIGS, ids=label)
def test_report_law_given_the_answer_matches_the_channel(mech, source):
    """Given the answer X, the report vector has mean report_mean(e_X) and covariance
    report_covariance(e_X): the keep rate and uniform lies for randomized response, the flip
    rate for flip components, mean e_X and iid noise of variance noise_variance otherwise."""
    vectors = report_vectors(mech, sample(mech, source))
    p = onehot(X, mech.k)
    assert_moments(vectors, mech.report_mean(p), mech.report_covariance(p))


@pytest.mark.parametrize("mech", CONFIGS, ids=label)
def test_report_law_under_p_matches_the_channel(mech):
    rng = np.random.default_rng(11)
    values = rng.choice(K, size=NUMPY_N, p=P)
    reports = mech.simulate(values, rng)
    assert_moments(report_vectors(mech, reports), mech.report_mean(P), mech.report_covariance(P))


@pytest.mark.parametrize("mech", CONFIGS, ids=label)
def test_secure_and_numpy_reports_have_the_same_law(mech):
    secure, fast = secure_reports(mech), numpy_reports(mech)
    if isinstance(mech, RandomizedResponse | FlipComponents):
        if isinstance(mech, FlipComponents):  # compare the joint law of the bit patterns
            secure, fast = (r.astype(np.int64) @ (1 << np.arange(mech.k)) for r in (secure, fast))
        table = np.array([np.bincount(r, minlength=2**mech.k) for r in (secure, fast)])
        table = table[:, table.sum(axis=0) > 0]
        assert stats.chi2_contingency(table).pvalue > P_MIN
    else:
        for j in range(mech.k):
            assert stats.ks_2samp(secure[:, j], fast[:, j]).pvalue > P_MIN


# --- aggregates -----------------------------------------------------------------------------------


def test_rr_aggregate_is_a_bincount():
    mech = RandomizedResponse(4, 1.0)
    agg = mech.aggregate(np.array([0, 2, 2, 3, 2]))
    assert agg.dtype == np.float64
    assert agg.tolist() == [1.0, 0.0, 3.0, 1.0]
    for bad in ([0, 4], [-1], [0.0, 1.0], [[0, 1]]):
        with pytest.raises(ValueError):
            mech.aggregate(np.array(bad))


def test_fc_aggregate_sums_bits():
    mech = FlipComponents(3, 1.0)
    agg = mech.aggregate(np.array([[1, 0, 1], [1, 1, 0]], dtype=np.uint8))
    assert agg.dtype == np.float64
    assert agg.tolist() == [2.0, 1.0, 1.0]
    for bad in (np.zeros(3), np.zeros((2, 4)), np.zeros((2, 2))):
        with pytest.raises(ValueError):
            mech.aggregate(bad)


@pytest.mark.parametrize("name", ADDITIVE)
@pytest.mark.parametrize("bits", [0, 10, 20])
def test_additive_aggregate_is_the_exact_dyadic_sum(name, bits):
    mech = make(name, granularity_bits=bits)
    reports = np.random.default_rng(bits).integers(-(2**40), 2**40, size=(1000, K))
    agg = mech.aggregate(reports)
    assert agg.dtype == np.float64
    assert dyadic_exact(agg, mech.scale, [sum(int(v) for v in column) for column in reports.T])
    for bad in (np.zeros(K, dtype=np.int64), np.zeros((2, K + 1), dtype=np.int64)):
        with pytest.raises(ValueError):
            mech.aggregate(bad)


@pytest.mark.parametrize("name", ADDITIVE)
def test_additive_aggregate_rejects_real_valued_reports(name):
    with pytest.raises(ValueError):
        make(name, k=2).aggregate(np.array([[0.5, 0.0], [0.9, 0.0]]))


@pytest.mark.parametrize("mech", CONFIGS, ids=label)
def test_aggregate_is_the_sum_of_report_vectors(mech):
    reports = mech.simulate(
        np.random.default_rng(3).choice(K, size=5000, p=P), np.random.default_rng(4)
    )
    agg = mech.aggregate(reports)
    assert agg.shape == (mech.k,) and agg.dtype == np.float64
    assert np.array_equal(agg, report_vectors(mech, reports).sum(axis=0))


# --- the law of an aggregate ----------------------------------------------------------------------


@pytest.mark.parametrize("mech", CONFIGS, ids=label)
def test_simulate_histogram_matches_the_channel(mech):
    n, replicates = 500, 20_000
    agg = mech.simulate_histogram(n, P, np.random.default_rng(21), size=replicates)
    assert agg.shape == (replicates, mech.k)
    assert_moments(agg, n * mech.report_mean(P), n * mech.report_covariance(P))


@pytest.mark.parametrize("mech", CONFIGS, ids=label)
def test_simulate_histogram_support(mech):
    rng = np.random.default_rng(8)
    one = mech.simulate_histogram(300, P, rng)
    assert one.shape == (mech.k,) and one.dtype == np.float64
    assert np.array_equal(mech.simulate_histogram(0, P, rng), np.zeros(mech.k))
    many = mech.simulate_histogram(300, P, rng, size=50)
    if isinstance(mech, RandomizedResponse):
        assert (many.sum(axis=1) == 300).all()
    if isinstance(mech, RandomizedResponse | FlipComponents):
        assert (many == np.round(many)).all() and many.min() >= 0 and many.max() <= 300
    if isinstance(mech, LaplaceNoise):  # exact: sums of grid points
        assert (many * mech.scale == np.round(many * mech.scale)).all()


# --- noise variances ------------------------------------------------------------------------------


def brute_force_variance(log_weight, width: int) -> float:
    z = range(-width, width + 1)
    weights = [math.exp(log_weight(v)) for v in z]
    return math.fsum(v * v * w for v, w in zip(z, weights, strict=True)) / math.fsum(weights)


@pytest.mark.parametrize("epsilon", [1e-6, 0.1, 1.0, 3.0, 50.0])
@pytest.mark.parametrize("bits", [0, 1, 10, 20])
def test_laplace_noise_variance_is_the_discrete_laplace_variance(epsilon, bits):
    """2r/(1-r)^2 / g^2 with r = exp(-eps / (2g)), written as 1 / (2 sinh^2(eps / 4g)) / g^2 to
    avoid the cancellation in 1 - r."""
    g = 2**bits
    expected = 1 / (2 * math.sinh(epsilon / (4 * g)) ** 2) / g**2
    assert LaplaceNoise(K, epsilon, granularity_bits=bits).noise_variance == pytest.approx(
        expected, rel=1e-12
    )


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0])
def test_laplace_noise_variance_by_summation(epsilon):
    scale_grid = 2 / epsilon  # granularity_bits = 0
    expected = brute_force_variance(lambda z: -abs(z) / scale_grid, int(80 * scale_grid) + 20)
    assert LaplaceNoise(K, epsilon, granularity_bits=0).noise_variance == pytest.approx(
        expected, rel=1e-12
    )


@pytest.mark.parametrize("epsilon", [0.3, 1.0, 4.0])
def test_laplace_noise_variance_tends_to_the_continuous_one(epsilon):
    def gap(bits: int) -> float:
        return LaplaceNoise(K, epsilon, granularity_bits=bits).noise_variance * epsilon**2 / 8 - 1

    gaps = [gap(bits) for bits in range(0, 11, 2)]
    assert all(g < 0 for g in gaps)  # the discrete variance is below 8 / eps^2 ...
    assert all(b > a for a, b in itertools.pairwise(gaps))  # ... and increases to it
    assert abs(gap(20)) < 1e-12


@pytest.mark.parametrize("rho", [0.01, 0.5, 2.0, 8.0])
@pytest.mark.parametrize("bits", [0, 2, 10])
def test_gaussian_noise_variance(rho, bits):
    mech = GaussianNoise(K, rho, granularity_bits=bits)
    g = mech.scale
    assert mech.noise_variance == pytest.approx(
        discrete_gaussian_variance(g * g / rho) / g**2, rel=1e-13
    )
    assert mech.noise_variance <= 1 / rho * (1 + 1e-15)
    if bits == 10:
        assert mech.noise_variance == pytest.approx(1 / rho, rel=1e-12)


def test_gaussian_noise_variance_on_a_tiny_grid_by_summation():
    """granularity_bits = 0, rho = 8: sigma2 = 1/8, far from the continuous 1/8."""
    expected = brute_force_variance(lambda z: -(z * z) * 4.0, 30)
    assert expected == pytest.approx(2 * math.exp(-4) / (1 + 2 * math.exp(-4)), rel=1e-4)
    assert GaussianNoise(K, 8.0, granularity_bits=0).noise_variance == pytest.approx(
        expected, rel=1e-12
    )


@pytest.mark.parametrize("sigma2", [0.01, 0.125, 1.0, 4.0, 37.5, 2499.0, 2500.0, 2501.0, 1e6])
def test_discrete_gaussian_variance_by_summation(sigma2):
    width = int(40 * math.sqrt(sigma2)) + 10
    expected = brute_force_variance(lambda z: -(z * z) / (2 * sigma2), width)
    assert discrete_gaussian_variance(sigma2) == pytest.approx(expected, rel=1e-12)


# --- frozen dataclasses ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_equal_parameters_compare_equal_and_hash_alike(name):
    a, b = make(name, k=4, parameter=1), make(name, k=np.int64(4), parameter=1.0)
    _ = a.cost, a.describe(), getattr(a, "noise_variance", None)  # populate cached properties
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    assert {a: "x"}[b] == "x"


@pytest.mark.parametrize("name", NAMES)
def test_different_parameters_compare_unequal(name):
    base = make(name)
    others = [make(name, k=K + 1), make(name, parameter=DEFAULT_PARAMETER[name] * 2)]
    if name in ADDITIVE:
        others.append(make(name, granularity_bits=8))
    # same k and parameter, other class
    others += [make(other, parameter=DEFAULT_PARAMETER[name]) for other in NAMES if other != name]
    for other in others:
        assert base != other
    assert len({base, *others}) == len(others) + 1


@pytest.mark.parametrize("name", NAMES)
def test_mechanisms_are_frozen(name):
    mech = make(name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        mech.k = 7
    assert mech.k == K


def test_fc_huge_epsilon_is_rejected_or_works():
    try:
        mech = FlipComponents(2, 1e7)
    except ValueError:
        return
    assert mech.realized_epsilon <= 1e7
    assert mech.randomize(0).tolist() == [1, 0]


def test_privacy_cost_refuses_booleans():
    with pytest.raises(ValueError):
        PrivacyCost("pure", True)


def test_the_kind_narrowings_return_their_mechanism_or_refuse():
    """``as_public_coin``/``as_exchangeable`` give the statistics the mechanism its kind names,
    and refuse any other (a TypeError: the dispatch by kind went wrong)."""
    coin, oue = PublicCoinBit(8, 1.0, 3, 4), OptimizedUnaryEncoding(8, 1.0)
    rr = RandomizedResponse(8, 1.0)
    assert as_public_coin(coin) is coin and as_exchangeable(oue) is oue
    for narrow, other in ((as_public_coin, oue), (as_exchangeable, coin), (as_exchangeable, rr)):
        with pytest.raises(TypeError):
            narrow(other)


def test_additive_report_bound_is_the_decoding_range_in_real_units():
    for mech in (GaussianNoise(4, 0.5), LaplaceNoise(4, 1.0)):
        assert mech.report_bound == 1 + mech.noise_bound / mech.scale
    assert RandomizedResponse(4, 1.0).report_bound is None
