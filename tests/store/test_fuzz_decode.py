"""Hostile input through wire decoding and validation (issue 4, item 4).

Random bytes and mutated valid messages go through ``UploadRequest.FromString`` /
``Report.FromString``, ``ingest.validate``, ``ingest.validate_batch`` and every mechanism's
``decode``. The only allowed outcomes are a protobuf ``DecodeError``, a typed rejection whose status
code is the one the wire contract prescribes (``fuzz_support.reference_verdict``, an independent
decoder), or acceptance with exactly the contribution the contract defines. Any other exception
fails the property, and so does an accepted contribution outside the mechanism's range.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import numpy as np
import pytest
from fuzz_support import (
    FUZZ_SETTINGS,
    FUZZ_SURVEYS,
    decode_limit,
    grid_limit,
    hostile_report_bytes,
    hostile_upload_bytes,
    mutated_reports,
    payload_verdict,
    reference_verdict,
)
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from aggregator.service.status import status_of
from aggregator.store import checks, ingest
from aggregator.store.checks import ReportRejectedError
from client.mechanisms import (
    FlipComponents,
    GaussianNoise,
    LaplaceNoise,
    Mechanism,
    RandomizedResponse,
    ReportRangeError,
)
from client.survey import Attribute, QuestionSpec
from protos.ldp.v1 import ldp_pb2

pytestmark = pytest.mark.slow  # hypothesis fuzzing (docs/fuzzing.md)


def check_in_range(mech: Mechanism, contribution: np.ndarray) -> None:
    """An accepted contribution is an int64 vector of length k inside the mechanism's range."""
    assert contribution.dtype == np.int64 and contribution.shape == (mech.k,)
    if isinstance(mech, RandomizedResponse):
        assert set(np.unique(contribution)) <= {0, 1} and contribution.sum() == 1
    elif isinstance(mech, FlipComponents):
        assert set(np.unique(contribution)) <= {0, 1}
    else:
        assert np.abs(contribution).max() <= grid_limit(mech)  # type: ignore[arg-type]


def check_single(report: ldp_pb2.Report) -> ReportRejectedError | None:
    """validate() gives the reference verdict; returns its rejection, if any."""
    expected = reference_verdict(report, FUZZ_SURVEYS)
    try:
        stored = ingest.validate(report, FUZZ_SURVEYS)
    except ReportRejectedError as exc:
        assert status_of(exc.reason) == expected.code, (exc, expected)
        assert exc.message
        return exc
    assert expected.accepted, f"accepted a report the contract rejects with {expected.code}"
    question = FUZZ_SURVEYS[report.survey_id].question(report.question_id)
    check_in_range(question.mechanism, stored.contribution)
    np.testing.assert_array_equal(stored.contribution, expected.contribution)
    assert (stored.report_id, stored.survey_id, stored.question_id, stored.payload) == (
        report.report_id,
        report.survey_id,
        report.question_id,
        report.payload,
    )
    return None


def first_reuse(reports: Sequence[ldp_pb2.Report]) -> int | None:
    """The first report whose id an earlier report has with other content, if any."""
    first: dict[bytes, tuple[str, str, bytes]] = {}
    for i, report in enumerate(reports):
        content = (report.survey_id, report.question_id, report.payload)
        if first.setdefault(report.report_id, content) != content:
            return i
    return None


def check_batch(reports: Sequence[ldp_pb2.Report]) -> None:
    """validate_batch() agrees with validate() report by report, and names the first bad one."""
    verdicts = [check_single(report) for report in reports]
    first_bad = next(((i, exc) for i, exc in enumerate(verdicts) if exc is not None), None)
    reused = first_reuse(reports)
    try:
        batch = ingest.validate_batch(reports, FUZZ_SURVEYS)
    except ReportRejectedError as exc:
        if first_bad is None and reused is not None:  # docs/wire.md §6
            assert status_of(exc.reason) == grpc.StatusCode.INVALID_ARGUMENT
            assert exc.message.startswith(f"report[{reused}]: ")
            return
        assert first_bad is not None, f"batch rejected ({exc}) but every report is valid"
        index, single = first_bad
        assert exc.reason == single.reason
        assert exc.message.startswith(f"report[{index}]: ")
        return
    assert first_bad is None, f"batch accepted but report[{first_bad[0]}] is invalid"
    assert reused is None, f"batch accepted but report[{reused}] reuses an id for other content"
    for report, stored in zip(reports, batch, strict=True):
        expected = ingest.validate(report, FUZZ_SURVEYS)
        assert (stored.report_id, stored.survey_id, stored.question_id, stored.payload) == (
            expected.report_id,
            expected.survey_id,
            expected.question_id,
            expected.payload,
        )
        assert stored.contribution.dtype == np.int64
        np.testing.assert_array_equal(stored.contribution, expected.contribution)


@FUZZ_SETTINGS
@given(hostile_upload_bytes(FUZZ_SURVEYS))
def test_random_bytes_as_upload_request(data: bytes) -> None:
    try:
        request = ldp_pb2.UploadRequest.FromString(data)
    except DecodeError:
        return
    check_batch(request.reports)


@FUZZ_SETTINGS
@given(hostile_report_bytes(FUZZ_SURVEYS))
def test_random_bytes_as_report(data: bytes) -> None:
    try:
        report = ldp_pb2.Report.FromString(data)
    except DecodeError:
        return
    check_single(report)


@FUZZ_SETTINGS
@given(mutated_reports(FUZZ_SURVEYS))
def test_mutated_report(report: ldp_pb2.Report) -> None:
    check_single(report)
    # The same report after a wire round trip is judged the same way.
    check_single(ldp_pb2.Report.FromString(report.SerializeToString()))


@FUZZ_SETTINGS
@given(st.lists(mutated_reports(FUZZ_SURVEYS), max_size=8))
def test_mutated_batch(reports: list[ldp_pb2.Report]) -> None:
    check_batch(reports)


finite_epsilon = st.one_of(
    st.sampled_from([1e-6, 0.1, 1.0, 50.0]), st.floats(1e-4, 60.0, allow_subnormal=False)
)
mechanisms = st.one_of(
    st.builds(RandomizedResponse, st.one_of(st.integers(2, 300), st.just(2**31)), finite_epsilon),
    st.builds(FlipComponents, st.integers(2, 80), finite_epsilon),
    st.builds(
        GaussianNoise,
        st.integers(2, 12),
        st.one_of(st.sampled_from([1e-9, 0.5, 1e6]), st.floats(1e-6, 1e3)),
        granularity_bits=st.integers(0, 20),
    ),
    st.builds(
        LaplaceNoise, st.integers(2, 12), finite_epsilon, granularity_bits=st.integers(0, 20)
    ),
)


@st.composite
def mechanism_and_payload(draw) -> tuple[Mechanism, bytes]:
    mech = draw(mechanisms)
    size = mech.payload_size
    length = draw(st.one_of(st.just(size), st.integers(max(size - 9, 0), size + 9)))
    payload = draw(st.binary(min_size=length, max_size=length))
    if draw(st.booleans()) and isinstance(mech, GaussianNoise | LaplaceNoise) and length == size:
        # Move one coordinate onto the edge of the valid range, where off-by-one bugs live.
        edge = draw(st.sampled_from([grid_limit(mech), decode_limit(mech)]))
        edge += draw(st.sampled_from([-1, 0, 1]))
        edge *= draw(st.sampled_from([-1, 1]))
        coordinate = draw(st.integers(0, mech.k - 1))
        raw = bytearray(payload)
        if abs(edge) < 2**63:
            raw[8 * coordinate : 8 * coordinate + 8] = edge.to_bytes(8, "little", signed=True)
        payload = bytes(raw)
    return mech, payload


@FUZZ_SETTINGS
@given(mechanism_and_payload())
def test_mechanism_decode(case: tuple[Mechanism, bytes]) -> None:
    mech, payload = case
    expected = payload_verdict(mech, payload, decoding=True)
    try:
        decoded = mech.decode(payload)
    except ReportRangeError:
        assert expected.code is not None and expected.code.name == "OUT_OF_RANGE"
        return
    except ValueError:
        assert expected.code is not None and expected.code.name == "INVALID_ARGUMENT"
        return
    assert expected.accepted, f"decoded a payload the contract rejects with {expected.code}"
    if isinstance(mech, RandomizedResponse):
        assert isinstance(decoded, int) and expected.contribution[decoded] == 1
    else:
        np.testing.assert_array_equal(np.asarray(decoded, dtype=np.int64), expected.contribution)
    assert mech.encode(decoded) == payload  # one canonical payload per report
    if mech.k <= 4096:  # a one-hot vector of k = 2**31 would need 16 GiB
        question = QuestionSpec("q", "", (Attribute("q", ("a", "b")),), mech)
        accepted = payload_verdict(mech, payload)  # the service's range is narrower
        if not accepted.accepted:
            with pytest.raises(checks.ReportRejectedError) as error:
                ingest.contribution(question, payload)
            assert status_of(error.value.reason) == accepted.code
            return
        contribution = ingest.contribution(question, payload)
        check_in_range(mech, contribution)
        np.testing.assert_array_equal(contribution, expected.contribution)
