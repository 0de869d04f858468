"""Optimized unary encoding and Hadamard response (issue 17): validation, privacy cost, the exact
channel against simulation and against the secure randomizer, encodings, the fast Walsh-Hadamard
decode, and the support-count statistics (coverage of the intervals, level of the tests)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats import estimate, goodness_of_fit, independence
from aggregator.stats.calibration import MAX_SUPPORT_IMHOF, choose
from aggregator.stats.power import power
from aggregator.survey_file.config import load_surveys
from client.mechanisms import (
    HadamardResponse,
    LocalHashing,
    OptimizedUnaryEncoding,
    PublicCoinBit,
    ReportRangeError,
    SubsetSelection,
    SupportMechanism,
)
from client.mechanisms.hadamard import fwht
from client.mechanisms.local_hashing import hash_coefficients, hash_values
from client.mechanisms.secure_random import SYSTEM_RANDOM
from client.survey import Attribute, build_question
from protos.ldp.v1 import ldp_pb2

KINDS = [OptimizedUnaryEncoding, HadamardResponse, SubsetSelection, LocalHashing]
CASES = [
    OptimizedUnaryEncoding(7, 1.0),
    HadamardResponse(7, 1.0),
    SubsetSelection(7, 1.0),
    LocalHashing(7, 1.0),
    HadamardResponse(12, 0.5),
    SubsetSelection(12, 0.5),
    LocalHashing(12, 2.0),
]
STATS_CASES = CASES[:4]
SIMULATED = (SubsetSelection, LocalHashing)  # slower aggregate samplers (not O(k) per draw)


def ids(mech) -> str:
    return mech.describe()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k, epsilon", [(1, 1.0), (True, 1.0), (4, 0.0), (4, -1.0), (4, math.inf)])
def test_bad_parameters_are_refused(kind, k, epsilon) -> None:
    with pytest.raises(ValueError):
        kind(k, epsilon)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("epsilon", [0.01, 1.0, 8.0, 40.0])
def test_cost_is_pure_epsilon_and_never_exceeded(kind, epsilon: float) -> None:
    if kind is LocalHashing and epsilon > 21:  # g = ceil(e^eps) + 1 must stay below 2^31
        with pytest.raises(ValueError, match="too large"):
            kind(9, epsilon)
        return
    mech = kind(9, epsilon)
    assert mech.cost.kind == "pure" and mech.cost.epsilon == epsilon
    assert 0 <= mech.realized_epsilon <= epsilon
    if epsilon <= 8:  # beyond, q or 1 - rho is a few units of the 2^-64 grid
        assert mech.realized_epsilon == pytest.approx(epsilon, rel=1e-6)


def test_channel_constants() -> None:
    oue = OptimizedUnaryEncoding(5, 1.0)
    q = 1 / (math.e + 1)
    assert oue.offset == pytest.approx(q) and oue.slope == pytest.approx(0.5 - q)
    hr = HadamardResponse(5, 1.0)
    assert hr.columns == 8 and HadamardResponse(8, 1.0).columns == 16
    assert hr.offset == 0.5 and hr.slope == pytest.approx(math.e / (math.e + 1) - 0.5)


def test_fwht_is_the_sylvester_hadamard_transform() -> None:
    size = 32
    matrix = np.array([[(-1) ** (r & c).bit_count() for c in range(size)] for r in range(size)])
    values = np.random.default_rng(0).integers(-50, 50, size=(3, size))
    np.testing.assert_array_equal(fwht(values), values @ matrix.T)


@pytest.mark.slow
@pytest.mark.parametrize("mech", CASES, ids=ids)
def test_support_counts_follow_the_exact_channel(mech: SupportMechanism) -> None:
    """Mean and covariance of one report's support vector (simulate), and of the aggregate
    (simulate_histogram), equal report_mean / report_covariance within sampling error."""
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(mech.k))
    n = 200_000
    support = mech.support(mech.simulate(rng.choice(mech.k, size=n, p=p), rng)).astype(float)
    cov = mech.report_covariance(p)
    se = np.sqrt(np.diag(cov) / n)
    assert (np.abs(support.mean(axis=0) - mech.report_mean(p)) < 5 * se).all()
    assert np.abs(np.cov(support.T) - cov).max() < 5 * 0.25 * math.sqrt(2 / n)
    size = 2_000 if isinstance(mech, SIMULATED) else 20_000
    draws = mech.simulate_histogram(500, p, rng, size=size)
    assert (np.abs(draws.mean(axis=0) / 500 - mech.report_mean(p)) < 5 * se * math.sqrt(10)).all()
    assert np.abs(np.cov(draws.T) / 500 - cov).max() < 5 * 0.25 * math.sqrt(2 / size)


@pytest.mark.parametrize("mech", CASES, ids=ids)
def test_secure_randomize_follows_the_channel(mech: SupportMechanism) -> None:
    """Per true answer, each category's support frequency from the real secure randomizer is
    rho (or 1/2) for the answer and q (or 1/2) for the others: a binomial band at 1 - 1e-7 per
    answer (the secure source cannot be seeded: a false alarm once in millions of CI runs)."""
    trials = 3000
    for x in (0, mech.k - 1):
        reports = np.array([mech.randomize(x, SYSTEM_RANDOM) for _ in range(trials)])
        counts = mech.support(reports).sum(axis=0)
        expected = mech.report_mean(np.eye(mech.k)[x])
        low, high = stats.binom.interval(1 - 1e-7 / mech.k, trials, expected)
        assert ((counts >= low) & (counts <= high)).all(), (x, counts / trials, expected)


@pytest.mark.parametrize("mech", CASES, ids=ids)
def test_encode_decode_round_trip_and_bulk_decode(mech: SupportMechanism) -> None:
    reports = [mech.randomize(x) for x in range(mech.k)]
    payloads = [mech.encode(r) for r in reports]
    assert {len(p) for p in payloads} == {mech.payload_size}
    for report, payload in zip(reports, payloads, strict=True):
        np.testing.assert_array_equal(mech.decode(payload), report)
    packed = np.frombuffer(b"".join(payloads), dtype=np.uint8).reshape(len(payloads), -1)
    np.testing.assert_array_equal(mech.decode_many(packed), np.array(reports))
    np.testing.assert_array_equal(
        mech.support_counts(np.array(reports)), mech.support(np.array(reports)).sum(axis=0)
    )


def test_malformed_payloads_are_refused() -> None:
    oue, hr = OptimizedUnaryEncoding(10, 1.0), HadamardResponse(10, 1.0)
    ss = SubsetSelection(10, 1.0)
    assert ss.subset_size == 3  # ceil(10 / (e + 1))
    with pytest.raises(ReportRangeError):
        ss.decode(b"\x03\x00")  # two categories, not three
    with pytest.raises(ValueError, match="padding"):
        ss.decode(b"\x03\x04")
    with pytest.raises(ValueError):
        ss.encode(np.ones(10))
    olh = LocalHashing(10, 1.0)
    assert olh.buckets == 4  # ceil(e) + 1
    with pytest.raises(ReportRangeError):
        olh.decode(bytes(8) + (4).to_bytes(4, "little"))
    with pytest.raises(ValueError):
        olh.decode(bytes(11))
    with pytest.raises(ValueError, match="too large"):
        LocalHashing(10, 30.0)
    with pytest.raises(ValueError):
        oue.decode(b"\x00")
    with pytest.raises(ValueError, match="padding"):
        oue.decode(b"\x00\x04")  # bit 10 set
    with pytest.raises(ReportRangeError):
        hr.decode((16).to_bytes(4, "little"))
    with pytest.raises(ValueError):
        hr.decode(b"\x00\x00")
    with pytest.raises(ValueError):
        hr.encode(16)
    with pytest.raises(ValueError):
        oue.encode(np.zeros(9))


def test_local_hashing_collisions_are_exact() -> None:
    """kappa and kappa3 equal the collision rates of the hashed categories over many seeds,
    and the hash family is the documented polynomial over GF(2^31 - 1)."""
    mech = LocalHashing(6, 1.0)
    coefficients = hash_coefficients(np.arange(40_000))
    hashed = hash_values(coefficients, np.arange(3), mech.buckets)
    kappa, kappa3 = mech.collisions
    pair = np.mean(hashed[:, 0] == hashed[:, 1])
    triple = np.mean((hashed[:, 0] == hashed[:, 1]) & (hashed[:, 1] == hashed[:, 2]))
    assert abs(pair - kappa) < 5 * math.sqrt(kappa / 40_000)
    assert abs(triple - kappa3) < 5 * math.sqrt(kappa3 / 40_000)
    c2, c1, c0 = (int(v) for v in coefficients[7])
    expected = [((c2 * x * x + c1 * x + c0) % (2**31 - 1)) % mech.buckets for x in range(3)]
    assert hashed[7].tolist() == expected


def test_hadamard_decode_is_fast_at_large_k() -> None:
    """The FWHT decode equals the direct support sum, and stays fast at k = 2^16 - 1."""
    mech = HadamardResponse(300, 1.0)
    reports = mech.simulate(np.arange(3000) % 300, np.random.default_rng(2))
    np.testing.assert_array_equal(mech.support_counts(reports), mech.support(reports).sum(axis=0))
    big = HadamardResponse(2**16 - 1, 1.0)
    reports = np.random.default_rng(3).integers(0, big.columns, size=100_000)
    counts = big.support_counts(reports)
    assert counts.shape == (big.k,) and counts.min() >= 0 and counts.max() <= reports.size


@pytest.mark.parametrize(
    "name, kind",
    [
        ("optimized_unary", OptimizedUnaryEncoding),
        ("hadamard_response", HadamardResponse),
        ("subset_selection", SubsetSelection),
        ("local_hashing", LocalHashing),
    ],
)
def test_survey_definition_round_trips(name: str, kind) -> None:
    question = build_question("q", "", [Attribute("q", ("a", "b", "c"))], name, 1.5)
    assert isinstance(question.mechanism, kind) and question.mechanism.epsilon == 1.5
    message = question.to_proto()
    assert message.mechanism in (
        ldp_pb2.OPTIMIZED_UNARY,
        ldp_pb2.HADAMARD_RESPONSE,
        ldp_pb2.SUBSET_SELECTION,
        ldp_pb2.LOCAL_HASHING,
    )
    assert type(question).from_proto(message) == question


@pytest.mark.parametrize("mech", STATS_CASES, ids=ids)
def test_intervals_cover(mech: SupportMechanism) -> None:
    """Per-coordinate 90% intervals cover at least nominally (Clopper-Pearson through the
    channel), estimates are unbiased: 400 replicates, lower 99.9% binomial bound."""
    rng = np.random.default_rng(4)
    p = np.array([0.4, 0.2, 0.15, 0.1, 0.1, 0.05, 0.0])
    n, reps = 300, 400
    covered = np.zeros(mech.k)
    freqs = np.zeros(mech.k)
    for values in mech.simulate_histogram(n, p, rng, size=reps):
        est = estimate(Histogram(mech, n, values), 0.9)
        covered += (est.ci_low <= p) & (p <= est.ci_high)
        freqs += est.frequencies
    assert (covered >= stats.binom.ppf(0.001, reps, 0.9)).all(), covered / reps
    se = np.sqrt(np.diag(mech.report_covariance(p)) / (n * reps)) / mech.slope
    assert (np.abs(freqs / reps - p) < 4 * se).all()


@pytest.mark.slow
@pytest.mark.parametrize("mech", STATS_CASES, ids=ids)
@pytest.mark.parametrize("calibration", ["asymptotic", "monte-carlo"])
def test_goodness_of_fit_level(mech: SupportMechanism, calibration: str) -> None:
    """Type I at alpha = 0.1 inside the 99% binomial band (200 null replicates)."""
    rng = np.random.default_rng(5)
    p0 = np.array([0.3, 0.2, 0.2, 0.1, 0.1, 0.05, 0.05])
    reps = 200
    rejections = sum(
        goodness_of_fit(
            Histogram(mech, 400, values), p0, 0.1, calibration=calibration, rng=i, n_draws=99
        ).reject
        for i, values in enumerate(mech.simulate_histogram(400, p0, rng, size=reps))
    )
    low, high = stats.binom.interval(0.99, reps, 0.1)
    assert low <= rejections <= high, rejections


@pytest.mark.parametrize("mech", STATS_CASES, ids=ids)
def test_goodness_of_fit_power_and_planning(mech: SupportMechanism) -> None:
    """Far from p0 the test rejects, and planning (weighted noncentral law) agrees."""
    rng = np.random.default_rng(6)
    p0 = np.full(mech.k, 1 / mech.k)
    p1 = np.array([0.4, 0.3, 0.1, 0.1, 0.05, 0.05, 0.0])
    hist = Histogram(mech, 2000, mech.simulate_histogram(2000, p1, rng))
    assert goodness_of_fit(hist, p0, rng=1).pvalue < 1e-3
    assert power(mech, p1, 2000, null=p0) > 0.99
    assert 0.05 < power(mech, p1, 60, null=p0) < power(mech, p1, 120, null=p0) < 1


@pytest.mark.slow
def test_planning_above_the_imhof_limit_uses_the_weighted_law() -> None:
    """Above MAX_SUPPORT_IMHOF categories Hadamard response's test simulates its null for cost
    alone, so its plan is the analytic law; small n, where the effective counts fail, is still
    simulated."""
    k = MAX_SUPPORT_IMHOF + 52
    mech = HadamardResponse(k, 1.0)
    p0 = np.full(k, 1 / k)
    p1 = p0.copy()
    p1[: k // 2] -= 0.1 / (k // 2)
    p1[k // 2 :] += 0.1 / (k - k // 2)
    n = 200_000
    assert choose("auto", mech, n, p0, composite=False).simulated  # the test as run
    assert not choose("auto", mech, n, p0, composite=False, planning=True).simulated
    assert power(mech, p1, n, null=p0) == power(mech, p1, n, null=p0, calibration="asymptotic")
    assert choose("auto", mech, 10, p0, composite=False, planning=True).simulated


@pytest.mark.parametrize("kind", KINDS)
def test_independence_is_bootstrapped(kind) -> None:
    mech = kind(6, 1.0)
    rng = np.random.default_rng(7)
    p = np.outer([0.5, 0.5], [0.2, 0.3, 0.5]).ravel()
    result = independence(Histogram(mech, 800, mech.simulate_histogram(800, p, rng)), (2, 3), rng=1)
    assert result.calibration == "monte-carlo" and result.pvalue > 0.001
    with pytest.raises(InvalidInputError, match="bootstrap"):
        independence(Histogram(mech, 10, np.zeros(6)), (2, 3), calibration="asymptotic")


def test_histogram_checks_support_counts() -> None:
    mech = HadamardResponse(3, 1.0)
    with pytest.raises(InvalidInputError):
        Histogram(mech, 2, [3, 0, 0])
    with pytest.raises(InvalidInputError):
        Histogram(mech, 2, [0.5, 0, 0])


def test_config_reference_large_domain_example_loads(tmp_path) -> None:
    """docs/config.md's large-domain example is a valid survey file."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "config.md").read_text()
    block = text[text.index("## Large domains") :]
    example = re.search(r"```toml\n(.*?)```", block, re.DOTALL).group(1)
    path = tmp_path / "large.toml"
    path.write_text(example)
    survey = load_surveys(path)["field-2026"]
    kinds = [type(q.mechanism) for q in survey.questions]
    assert kinds == [
        OptimizedUnaryEncoding, HadamardResponse, SubsetSelection, LocalHashing, PublicCoinBit
    ]  # fmt: skip
