"""Each mechanism's bulk wire methods (``decode_many``, ``check_accepted``, ``statistic_rows``,
``statistic_sums``, ``statistic_values``) agree with its single-report ``decode`` and with the
store's verdicts: the same reason for every bad payload, the same row for every good one, and
for the mechanisms the fuzz oracle covers the same verdict as the wire contract's reference."""

from __future__ import annotations

import numpy as np
import pytest
from fuzz_support import FUZZ_SURVEYS, payload_verdict

from aggregator.histogram import Histogram
from aggregator.service.status import status_of
from aggregator.store import ingest
from aggregator.store.checks import ReportRejectedError
from client import mechanisms as m
from client.survey import Attribute, QuestionSpec

MECHANISMS = [
    m.RandomizedResponse(5, 1.0),
    m.FlipComponents(9, 1.0),
    m.FlipComponents(8, 2.0),
    m.GaussianNoise(3, 0.5),
    m.GaussianNoise(2, 2.0, granularity_bits=0),
    m.LaplaceNoise(4, 1.0),
    m.OptimizedUnaryEncoding(9, 1.0),
    m.HadamardResponse(6, 1.0),
    m.SubsetSelection(7, 1.0),
    m.SubsetSelection(5, 3.0),  # d = 1
    m.LocalHashing(6, 1.0),
    m.PublicCoinBit(6, 1.0, public_seed=3, groups=4),
]


def question_of(mech: m.Mechanism) -> QuestionSpec:
    return QuestionSpec("q", "", (Attribute("q", tuple(f"c{j}" for j in range(mech.k))),), mech)


def payloads(mech: m.Mechanism, rng: np.random.Generator) -> tuple[np.ndarray, list[bytes]]:
    """Reports of a simulated population with their payloads, then hostile payloads of the
    right length: random bytes, and for additive noise coordinates at the accepted edge."""
    reports = mech.simulate(rng.integers(0, mech.k, size=40), rng)
    good = [mech.encode(report) for report in reports]
    size = mech.payload_size
    hostile = [rng.integers(0, 256, size=size, dtype=np.uint8).tobytes() for _ in range(40)]
    if mech.statistic_kind == "noise":  # Gaussian, Laplace
        for edge in (mech.accepted_bound, mech.scale + mech.noise_bound):
            for step in (-1, 0, 1):
                grid = np.zeros(mech.k, dtype="<i8")
                grid[rng.integers(mech.k)] = (edge + step) * rng.choice([-1, 1])
                hostile.append(grid.tobytes())
    return reports, good + hostile


def single(question: QuestionSpec, payload: bytes) -> tuple[object, np.ndarray | None]:
    try:
        return None, ingest.contribution(question, payload)
    except ReportRejectedError as exc:
        return exc.reason, None


def bulk(question: QuestionSpec, payload: bytes) -> tuple[object, np.ndarray | None]:
    mech = question.mechanism
    packed = np.frombuffer(payload, dtype=np.uint8)[None, :]
    try:
        decoded = ingest.decode_payloads(question, packed)
    except ReportRejectedError as exc:
        return exc.reason, None
    return None, mech.statistic_rows(decoded)[0]


@pytest.mark.parametrize("mech", MECHANISMS, ids=lambda m: m.describe())
def test_bulk_methods_agree_with_single_reports(mech: m.Mechanism) -> None:
    rng = np.random.default_rng(23)
    question = question_of(mech)
    reports, wire = payloads(mech, rng)
    verdicts = [single(question, payload) for payload in wire]
    for payload, (reason, row) in zip(wire, verdicts, strict=True):
        bulk_reason, bulk_row = bulk(question, payload)
        assert bulk_reason == reason, payload.hex()
        if reason is None:
            assert row.dtype == np.int64 and row.shape == (mech.statistic_size,)
            np.testing.assert_array_equal(bulk_row, row)
    # The honest reports, in one matrix: the rows, their exact sums and the histogram's values.
    honest = len(reports)
    assert all(reason is None for reason, _ in verdicts[:honest])
    packed = np.frombuffer(b"".join(wire[:honest]), dtype=np.uint8).reshape(honest, -1)
    decoded = ingest.decode_payloads(question, packed)
    rows = mech.statistic_rows(decoded)
    np.testing.assert_array_equal(rows, np.stack([row for _, row in verdicts[:honest]]))
    sums = ingest.sum_decoded(question, decoded)
    assert sums.dtype == np.int64
    np.testing.assert_array_equal(sums, rows.sum(axis=0))
    np.testing.assert_array_equal(mech.statistic_values(sums), mech.aggregate(reports))
    assert ingest.histogram(question, honest, sums) == Histogram.from_reports(mech, reports)


@pytest.mark.parametrize("mech", MECHANISMS, ids=lambda m: m.describe())
def test_decode_many_matches_decode(mech: m.Mechanism) -> None:
    """The mechanism alone: ``decode_many`` raises what ``decode`` raises, row by row."""
    rng = np.random.default_rng(5)
    for payload in payloads(mech, rng)[1]:
        try:
            expected = np.asarray([mech.decode(payload)])
        except ValueError as exc:
            with pytest.raises(type(exc)):
                mech.decode_many(np.frombuffer(payload, dtype=np.uint8)[None, :])
            continue
        got = mech.decode_many(np.frombuffer(payload, dtype=np.uint8)[None, :])
        np.testing.assert_array_equal(got.astype(np.int64), expected.astype(np.int64))
    with pytest.raises(ValueError):
        mech.decode_many(np.zeros((1, mech.payload_size + 1), dtype=np.uint8))


def test_bulk_verdicts_match_the_wire_contract() -> None:
    """The fuzz surveys' questions (randomized response, flip components, Gaussian, Laplace):
    the bulk path gives the reference verdict of tests/fuzz_support.py (status and row)."""
    rng = np.random.default_rng(11)
    for survey in FUZZ_SURVEYS.values():
        for question in survey.questions:
            for payload in payloads(question.mechanism, rng)[1]:
                expected = payload_verdict(question.mechanism, payload)
                reason, row = bulk(question, payload)
                if expected.accepted:
                    assert reason is None, payload.hex()
                    np.testing.assert_array_equal(row, expected.contribution)
                else:
                    assert reason is not None and status_of(reason) == expected.code


def test_additive_sums_refuse_to_wrap() -> None:
    mech = m.LaplaceNoise(2, 0.1, granularity_bits=20)
    many = int(2.0**62 / mech.accepted_bound) + 1
    decoded = np.broadcast_to(np.zeros((1, 2), dtype=np.int64), (many, 2))
    with pytest.raises(OverflowError, match=f"sums of {many} reports of q may overflow int64"):
        ingest.sum_decoded(question_of(mech), decoded)
