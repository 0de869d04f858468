"""Hostile uploads end to end (issue 4, item 4): random and mutated requests against a real
aggregator (grpc.aio on loopback, SQLite WAL store).

Every call must end with OK or the specific status code the wire contract prescribes, and after
every example the store must hold exactly the reports a model of the contract accepted: no
garbage, statistics equal to an independent recount of the stored payloads. At the end, a rebuild
from the log reproduces the same statistics and ``PRAGMA integrity_check`` is ok.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest
from conftest import ServerThread
from fuzz_support import (
    FUZZ_SETTINGS,
    FUZZ_SURVEYS,
    hostile_upload_bytes,
    mutated_reports,
    reference_verdict,
    valid_reports,
    write_fuzz_surveys,
)
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from aggregator.store import ingest
from aggregator.store.sqlite.report_store import ReportStore
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

pytestmark = pytest.mark.slow  # hypothesis fuzzing (docs/fuzzing.md)

#: A request that does not parse as an UploadRequest: the server parses uploads itself and answers
#: INVALID_ARGUMENT (grpc's own deserializer would have answered UNKNOWN; found by this fuzzing).
UNPARSEABLE_CODES = {grpc.StatusCode.INVALID_ARGUMENT}
#: A few report ids shared across examples, so resends and cross-request duplicates happen.
SHARED_IDS = [bytes([i]) * 16 for i in range(12)]
UPLOAD = "/ldp.v1.Collector/Upload"


@dataclass
class Model:
    """What the store must hold: report id -> (survey, question, payload) of its first upload."""

    stored: dict[bytes, tuple[str, str, bytes]] = field(default_factory=dict)

    def expected_results(self, reports: list[ldp_pb2.Report]) -> list[int]:
        """ACCEPTED, DUPLICATE (same content stored) or CONFLICT (the id is stored with other
        content) for valid reports stored in this order (first occurrence wins); records the
        accepted ones."""
        statuses = []
        for report in reports:
            content = (report.survey_id, report.question_id, report.payload)
            known = self.stored.setdefault(report.report_id, content)
            if known is content:
                statuses.append(ldp_pb2.ACCEPTED)
            else:
                statuses.append(ldp_pb2.DUPLICATE if known == content else ldp_pb2.CONFLICT)
        return statuses


def reuses_an_id(reports: list[ldp_pb2.Report]) -> list[bool]:
    """Per report: whether an earlier report of the list has its id with other content."""
    first: dict[bytes, tuple[str, str, bytes]] = {}
    out = []
    for report in reports:
        content = (report.survey_id, report.question_id, report.payload)
        out.append(first.setdefault(report.report_id, content) != content)
    return out


@dataclass
class Service:
    server: ServerThread
    surveys: dict[str, SurveySpec]
    channel: grpc.Channel
    stub: ldp_pb2_grpc.CollectorStub
    raw_upload: grpc.UnaryUnaryMultiCallable
    model: Model


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> Iterator[Service]:
    directory = tmp_path_factory.mktemp("fuzz-service")
    config, surveys = write_fuzz_surveys(directory)
    server = ServerThread(config, directory / "reports.sqlite").start()
    channel = grpc.insecure_channel(server.target)
    raw = channel.unary_unary(UPLOAD, request_serializer=bytes, response_deserializer=bytes)
    yield Service(server, surveys, channel, ldp_pb2_grpc.CollectorStub(channel), raw, Model())
    channel.close()
    server.stop()


def upload(service: Service, reports: list[ldp_pb2.Report]) -> None:
    """A unary upload is all-or-nothing: the first invalid report's code, or every report's
    ACCEPTED/DUPLICATE status."""
    try:
        response = service.stub.Upload(ldp_pb2.UploadRequest(reports=reports), timeout=30)
    except grpc.RpcError as exc:
        check_refused(service, reports, exc.code())
        return
    check_accepted(service, reports, response)


def check_refused(service: Service, reports: list[ldp_pb2.Report], code: grpc.StatusCode):
    verdicts = [reference_verdict(r, service.surveys) for r in reports]
    first_bad = next((v.code for v in verdicts if not v.accepted), None)
    if first_bad is None and any(reuses_an_id(reports)):
        first_bad = grpc.StatusCode.INVALID_ARGUMENT  # an id reused with other content
    expected = grpc.StatusCode.INVALID_ARGUMENT if not reports else first_bad
    assert code == expected, f"refused with {code}, the contract says {expected}"


def check_accepted(service: Service, reports: list[ldp_pb2.Report], response) -> None:
    assert reports, "an empty upload was accepted"
    for report in reports:
        verdict = reference_verdict(report, service.surveys)
        assert verdict.accepted, f"accepted a report the contract rejects with {verdict.code}"
    expected = service.model.expected_results(reports)
    assert [r.status for r in response.results] == expected
    assert [r.report_id for r in response.results] == [r.report_id for r in reports]


def upload_stream(service: Service, messages: list[list[ldp_pb2.Report]]) -> None:
    """A streamed upload rejects invalid reports one by one and stores the valid ones."""
    requests = [ldp_pb2.UploadRequest(reports=m) for m in messages]
    response = service.stub.UploadStream(iter(requests), timeout=30)
    reports = [r for m in messages for r in m]
    reused = [flag for m in messages for flag in reuses_an_id(m)]
    assert len(response.results) == len(reports)
    for report, result, reuse in zip(reports, response.results, reused, strict=True):
        assert result.report_id == report.report_id
        verdict = reference_verdict(report, service.surveys)
        if reuse:
            assert result.status == ldp_pb2.REJECTED and result.code == "INVALID_ARGUMENT"
        elif verdict.accepted:
            assert result.status == service.model.expected_results([report])[0]
        else:
            assert result.status == ldp_pb2.REJECTED
            assert result.code == verdict.code.name and result.reason


def upload_raw(service: Service, data: bytes) -> None:
    """Raw bytes: what parses is judged as a unary upload; what does not is refused."""
    try:
        request = ldp_pb2.UploadRequest.FromString(data)
    except DecodeError:
        request = None
    try:
        answer = service.raw_upload(data, timeout=30)
    except grpc.RpcError as exc:
        if request is None:
            assert exc.code() in UNPARSEABLE_CODES, exc
        else:
            check_refused(service, list(request.reports), exc.code())
        return
    assert request is not None, "the server accepted bytes that are not an UploadRequest"
    check_accepted(service, list(request.reports), ldp_pb2.UploadResponse.FromString(answer))


def recount(service: Service) -> dict[tuple[str, str], tuple[int, list[int]]]:
    """Statistics recomputed from the model with the reference decoder."""
    totals = {(s.id, q.id): (0, [0] * q.k) for s in service.surveys.values() for q in s.questions}
    for survey_id, question_id, payload in service.model.stored.values():
        report = ldp_pb2.Report(
            report_id=bytes(16), survey_id=survey_id, question_id=question_id, payload=payload
        )
        contribution = reference_verdict(report, service.surveys).contribution
        n, sums = totals[(survey_id, question_id)]
        sums = [a + int(b) for a, b in zip(sums, contribution, strict=True)]
        totals[(survey_id, question_id)] = (n + 1, sums)
    return totals


def check_store(service: Service) -> None:
    """The store holds exactly the model's reports, and statistics equal the recount."""
    uri = f"file:{service.server.db}?mode=ro"
    with closing(sqlite3.connect(uri, uri=True)) as conn:
        rows = conn.execute("SELECT report_id, survey_id, question_id, payload FROM reports")
        stored = {row[0]: (row[1], row[2], row[3]) for row in rows}
        rows = conn.execute("SELECT survey_id, question_id, n, sums FROM statistics")
        statistics = {(s, q): (n, np.frombuffer(b, "<i8").tolist()) for s, q, n, b in rows}
    assert stored == service.model.stored
    assert statistics == recount(service)


_counter = itertools.count(1)
# Hypothesis favours simple bytes (all zeros), which would make "fresh" ids collide.
fresh_ids = st.builds(lambda: b"fresh-id" + next(_counter).to_bytes(8, "big"))
report_ids = st.one_of(fresh_ids, fresh_ids, st.sampled_from(SHARED_IDS))
clean = valid_reports(FUZZ_SURVEYS, report_ids)
mixed = st.one_of(clean, mutated_reports(FUZZ_SURVEYS, report_ids))
operations = st.lists(
    st.one_of(
        st.tuples(st.just("unary"), st.lists(clean, min_size=1, max_size=8)),
        st.tuples(st.just("unary"), st.lists(mixed, max_size=6)),
        st.tuples(st.just("stream"), st.lists(st.lists(mixed, max_size=4), max_size=3)),
        st.tuples(st.just("raw"), hostile_upload_bytes(FUZZ_SURVEYS)),
    ),
    min_size=1,
    max_size=4,
)
RUN = {"unary": upload, "stream": upload_stream, "raw": upload_raw}


def test_hostile_uploads_store_only_valid_reports(service: Service) -> None:
    # No shrinking: the server keeps its state between examples, so a shrunk replay would not
    # reproduce the failure anyway; the failing example is reported as generated.
    @settings(FUZZ_SETTINGS, max_examples=200, phases=[Phase.explicit, Phase.generate])
    @given(operations)
    def property(ops) -> None:
        for kind, argument in ops:
            RUN[kind](service, argument)
        check_store(service)

    property()
    assert len(service.model.stored) > 100, "too few accepted reports to mean anything"
    health = health_pb2_grpc.HealthStub(service.channel)
    status = health.Check(health_pb2.HealthCheckRequest(service="ldp.v1.Collector"), timeout=10)
    assert status.status == health_pb2.HealthCheckResponse.SERVING
    service.server.stop()
    store = ReportStore(service.server.db)
    try:
        assert store.integrity_check() == "ok"
        questions = {(s.id, q.id): q for s in service.surveys.values() for q in s.questions}
        rebuilt = store.rebuild(lambda s, q, payload: ingest.contribution(questions[s, q], payload))
    finally:
        store.close()
    expected = recount(service)
    assert {key: (n, sums.tolist()) for key, (n, sums) in rebuilt.items()} == expected
