"""Report-id conflicts and malformed requests (docs/wire.md §6 and §8), on a real aggregator
(grpc.aio on loopback, SQLite file) and a real device state file.

A stored report id resent with another survey, question or payload is CONFLICT: not stored, not
counted, logged and counted by the Collector, dead-lettered by the device. A repeat within one
request must repeat the same report. Bytes that are no request message are INVALID_ARGUMENT on
every RPC, never UNKNOWN.
"""

from __future__ import annotations

import logging
import os

import grpc
import numpy as np
import pytest
from cli_runner import run_cli
from conftest import ServerThread
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from aggregator.store.model import CONFLICT, DUPLICATE, STORED, StoredReport
from aggregator.store.sqlite.report_store import ReportStore
from client.device.keys import DeviceKey
from client.device.ledger import Budget
from client.device.reporter import Reporter
from client.device.transport import Transport
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

SURVEYS = """
[[survey]]
id = "open"
min_batch_size = 1

[[survey.question]]
id = "q"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.question]]
id = "r"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey]]
id = "signed"
min_batch_size = 1
require_device_auth = true

[[survey.question]]
id = "q"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0
"""


def rr(index: int) -> bytes:
    return index.to_bytes(4, "little")


def report(report_id: bytes, survey: str = "open", question: str = "q", value: int = 0):
    return ldp_pb2.Report(
        report_id=report_id, survey_id=survey, question_id=question, payload=rr(value)
    )


@pytest.fixture
def key() -> DeviceKey:
    return DeviceKey(Ed25519PrivateKey.generate())


@pytest.fixture
def aggregator(tmp_path, key):
    config = tmp_path / "surveys.toml"
    config.write_text(SURVEYS)
    running = ServerThread(
        config, tmp_path / "reports.sqlite", device_keys={key.device_id: key._key.public_key()}
    ).start()
    channel = grpc.insecure_channel(running.target)
    analyst = ldp_pb2_grpc.AnalystStub(grpc.insecure_channel(running.analyst_target))
    yield running, ldp_pb2_grpc.CollectorStub(channel), analyst
    channel.close()
    running.stop()


def count(analyst, survey: str = "open", question: str = "q") -> int:
    """Reports stored for the question (none: the release threshold of 1 is not reached)."""
    request = ldp_pb2.EstimateRequest(survey_id=survey, question_id=question)
    try:
        return analyst.Estimate(request).n
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc
        return 0


# --- the store ---------------------------------------------------------------------------------


def stored(report_id: bytes, survey: str, question: str, value: int) -> StoredReport:
    row = np.zeros(4, dtype=np.int64)
    row[value] = 1
    return StoredReport(report_id, survey, question, rr(value), row)


def test_store_tells_duplicates_from_conflicts(tmp_path):
    store = ReportStore(tmp_path / "r.sqlite")
    try:
        for survey, question in (("a", "q"), ("a", "r"), ("b", "q")):
            store.register_question(survey, question, 4)
        rid = os.urandom(16)
        assert store.put([stored(rid, "a", "q", 1)]) == [STORED]
        resends = [
            stored(rid, "a", "q", 1),  # the same report: a resend
            stored(rid, "a", "q", 2),  # other payload
            stored(rid, "a", "r", 1),  # other question
            stored(rid, "b", "q", 1),  # other survey
        ]
        assert [store.put([r]) for r in resends] == [
            [DUPLICATE],
            [CONFLICT],
            [CONFLICT],
            [CONFLICT],
        ]
        # In one transaction the first copy wins, whatever the later ones hold.
        other = os.urandom(16)
        copies = [
            stored(other, "a", "q", 3),
            stored(other, "a", "q", 3),
            stored(other, "a", "q", 0),
        ]
        assert store.put(copies) == [STORED, DUPLICATE, CONFLICT]
        n, sums = store.statistics("a", "q")
        assert (n, sums.tolist()) == (2, [0, 1, 0, 1])
        assert store.statistics("a", "r")[0] == store.statistics("b", "q")[0] == 0
    finally:
        store.close()


# --- the service -------------------------------------------------------------------------------


def test_unary_conflict_is_its_own_result_and_not_counted(aggregator, caplog):
    _, collector, analyst = aggregator
    a, b, c, new = (os.urandom(16) for _ in range(4))
    earlier = [report(a, value=1), report(b, value=1), report(c, value=1)]
    collector.Upload(ldp_pb2.UploadRequest(reports=earlier))
    caplog.set_level(logging.WARNING, logger="aggregator.service.collector.servicer")
    reports = [
        report(a, value=2),  # other payload
        report(new, value=3),
        report(b, question="r", value=1),  # other question
        report(c, value=1),  # the resend
    ]
    response = collector.Upload(ldp_pb2.UploadRequest(reports=reports))
    statuses = [r.status for r in response.results]
    assert statuses == [ldp_pb2.CONFLICT, ldp_pb2.ACCEPTED, ldp_pb2.CONFLICT, ldp_pb2.DUPLICATE]
    assert [r.report_id for r in response.results] == [r.report_id for r in reports]
    assert "another survey, question or payload" in response.results[0].reason
    assert count(analyst) == 4
    assert count(analyst, question="r") == 0
    assert any("2 report(s) refused as CONFLICT" in r.getMessage() for r in caplog.records)


def test_an_unsigned_report_cannot_take_a_signed_surveys_id_silently(aggregator, key):
    """Ids are global: an unsigned report holding an id first makes the signed survey's report
    with that id a CONFLICT, never a silent DUPLICATE."""
    _, collector, analyst = aggregator
    rid = os.urandom(16)
    collector.Upload(ldp_pb2.UploadRequest(reports=[report(rid, survey="open", value=1)]))
    signed = [report(rid, survey="signed", value=1)]
    response = collector.Upload(
        ldp_pb2.UploadRequest(reports=signed), metadata=key.sign_upload(signed)
    )
    assert [r.status for r in response.results] == [ldp_pb2.CONFLICT]
    assert count(analyst, survey="signed") == 0


def test_a_repeat_within_a_request_must_repeat_the_same_report(aggregator):
    _, collector, analyst = aggregator
    rid, other = os.urandom(16), os.urandom(16)
    same = [report(rid, value=1), report(other, value=2), report(rid, value=1)]
    response = collector.Upload(ldp_pb2.UploadRequest(reports=same))
    assert [r.status for r in response.results] == [
        ldp_pb2.ACCEPTED,
        ldp_pb2.ACCEPTED,
        ldp_pb2.DUPLICATE,
    ]
    fresh = os.urandom(16)
    reused = [report(fresh, value=1), report(os.urandom(16)), report(fresh, value=3)]
    with pytest.raises(grpc.RpcError) as refused:
        collector.Upload(ldp_pb2.UploadRequest(reports=reused))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "report[2]" in refused.value.details() and "report[0]" in refused.value.details()
    assert count(analyst) == 2  # nothing of the refused request was stored


def test_stream_answers_conflicts_and_rejects_reuse_within_a_message(aggregator):
    _, collector, analyst = aggregator
    stored_id, reused, fresh = os.urandom(16), os.urandom(16), os.urandom(16)
    collector.Upload(ldp_pb2.UploadRequest(reports=[report(stored_id, value=0)]))
    messages = [
        ldp_pb2.UploadRequest(reports=[report(stored_id, value=3), report(reused, value=1)]),
        ldp_pb2.UploadRequest(
            reports=[report(fresh, value=2), report(fresh, value=1), report(fresh, value=2)]
        ),
        ldp_pb2.UploadRequest(reports=[report(reused, value=2)]),  # a later message
    ]
    response = collector.UploadStream(iter(messages))
    assert [(r.status, r.code) for r in response.results] == [
        (ldp_pb2.CONFLICT, ""),
        (ldp_pb2.ACCEPTED, ""),
        (ldp_pb2.ACCEPTED, ""),
        (ldp_pb2.REJECTED, "INVALID_ARGUMENT"),
        (ldp_pb2.DUPLICATE, ""),
        (ldp_pb2.CONFLICT, ""),
    ]
    assert count(analyst) == 3


# --- the device --------------------------------------------------------------------------------


def test_device_dead_letters_a_conflict(aggregator, tmp_path):
    running, collector, _ = aggregator
    with Transport(running.target) as transport:
        reporter = Reporter(transport, tmp_path / "device.sqlite", Budget(10.0))
        try:
            taken = os.urandom(16)
            collector.Upload(ldp_pb2.UploadRequest(reports=[report(taken, value=0)]))
            reporter.outbox.add(taken, "open", "q", rr(3))  # an id bug: reused for other content
            reporter.outbox.add(os.urandom(16), "open", "q", rr(1))
            result = reporter.flush()
            assert (result.accepted, result.duplicate, result.rejected, result.pending) == (
                1,
                0,
                1,
                0,
            )
            [(item, code, reason)] = reporter.outbox.rejected()
            assert (item.report_id, item.payload, code) == (taken, rr(3), "CONFLICT")
            assert reason
        finally:
            reporter.close()


# --- malformed requests ------------------------------------------------------------------------

METHODS = [
    "/ldp.v1.Collector/GetSurvey",
    "/ldp.v1.Collector/ListSurveys",
    "/ldp.v1.Collector/Upload",
    "/ldp.v1.Analyst/Estimate",
    "/ldp.v1.Analyst/GoodnessOfFit",
    "/ldp.v1.Analyst/Independence",
]
NOT_A_MESSAGE = b"\x0a\xff\xff\xff\xff\x0f"  # field 1, length 2**32 - 1: truncated


@pytest.mark.parametrize("method", METHODS)
def test_unparseable_unary_request_is_invalid_argument(aggregator, method):
    running, _, _ = aggregator
    target = running.analyst_target if "/ldp.v1.Analyst/" in method else running.target
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(method, request_serializer=bytes, response_deserializer=bytes)
        with pytest.raises(grpc.RpcError) as refused:
            call(NOT_A_MESSAGE, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the request is not a valid ldp.v1." in refused.value.details()


def test_unparseable_stream_message_is_invalid_argument(aggregator):
    running, _, _ = aggregator
    with grpc.insecure_channel(running.target) as channel:
        call = channel.stream_unary(
            "/ldp.v1.Collector/UploadStream", request_serializer=bytes, response_deserializer=bytes
        )
        with pytest.raises(grpc.RpcError) as refused:
            call(iter([NOT_A_MESSAGE]), timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# --- shard import --------------------------------------------------------------------------


def test_import_reports_conflicting_ids_and_skips_them(tmp_path, survey_file):
    from aggregator.store import ingest, shards
    from aggregator.survey_file.config import load_surveys

    surveys = load_surveys(survey_file)
    question = surveys["s1"].question("rr")
    messages = [
        ldp_pb2.Report(
            report_id=os.urandom(16), survey_id="s1", question_id="rr", payload=rr(i % 4)
        )
        for i in range(40)
    ]
    source = ReportStore(tmp_path / "a.sqlite")
    target = ReportStore(tmp_path / "b.sqlite")
    for store in (source, target):
        for q in surveys["s1"].questions:
            store.register_question("s1", q.id, q.k)
    source.put([ingest.validate(m, surveys) for m in messages])
    shards.export_survey(source, surveys["s1"], tmp_path / "out", 2)
    source.close()
    taken = ldp_pb2.Report()
    taken.CopyFrom(messages[0])
    taken.payload = rr((0 + 1) % question.k)  # the same id, another payload
    target.put([ingest.validate(taken, surveys)])
    target.close()
    done = run_cli(
        "agg", "import", "--config", str(survey_file),
        "--db", str(tmp_path / "b.sqlite"), "--from", str(tmp_path / "out"),
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert "imported 39 new reports (0 already present)" in done.stdout
    assert "1 report ids are stored with other content" in done.stderr
