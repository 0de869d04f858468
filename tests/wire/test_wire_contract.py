"""Statements of docs/wire.md checked against the code and a real server: the limits it quotes,
the 4 MiB arithmetic of §5, the empty stream of §8.3, and the device's handling of a result status
it does not know (§10)."""

from __future__ import annotations

import os
import re
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from aggregator.service.collector.device_auth import DEFAULT_WINDOW_SECONDS
from aggregator.service.collector.servicer import MAX_REPORTS_PER_REQUEST
from aggregator.service.collector.streams import ConnectionLimits, StreamLimits
from client.device.ledger import Budget
from client.device.reporter import Reporter
from client.device.transport import MAX_MESSAGE_BYTES, Transport
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

WIRE = (Path(__file__).resolve().parents[2] / "docs" / "wire.md").read_text()


def test_quoted_limits_are_the_codes():
    assert MAX_REPORTS_PER_REQUEST == 10_000 and "1 … 10,000" in WIRE
    assert MAX_MESSAGE_BYTES == 4 * 1024 * 1024 and "4,194,304 bytes" in WIRE
    assert DEFAULT_WINDOW_SECONDS == 300 and "±300 s" in WIRE
    streams, connections = StreamLimits(), ConnectionLimits()
    quoted = (
        f"at most {streams.max_messages:,} messages, {streams.max_reports:,} reports,\n"
        f"{streams.max_bytes // 2**20} MiB and {streams.max_seconds:g} s, and at most "
        f"{streams.max_rejected:,} REJECTED results"
    )
    assert quoted in WIRE
    assert f"at most {connections.max_concurrent_streams} concurrent calls" in WIRE
    assert f"closed after {connections.max_connection_idle_seconds:g} s" in WIRE
    assert f"reconnect after {connections.max_connection_age_seconds:g} s" in WIRE


def _request(k: int) -> ldp_pb2.UploadRequest:
    report = ldp_pb2.Report(
        report_id=bytes(16), survey_id="s" * 10, question_id="q" * 10, payload=bytes(8 * k)
    )
    return ldp_pb2.UploadRequest(reports=[report] * MAX_REPORTS_PER_REQUEST)


def test_the_4_mib_limit_binds_from_k_47_with_ten_character_ids():
    assert re.search(r"only for `k ≤ 46`", WIRE)
    assert _request(46).ByteSize() <= MAX_MESSAGE_BYTES < _request(47).ByteSize()


def test_an_empty_stream_is_ok_with_no_results(server):
    with grpc.insecure_channel(server.target) as channel:
        stub = ldp_pb2_grpc.CollectorStub(channel)
        assert list(stub.UploadStream(iter([]), timeout=10).results) == []
        with pytest.raises(grpc.RpcError) as refused:
            stub.Upload(ldp_pb2.UploadRequest(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


class _FutureCollector(ldp_pb2_grpc.CollectorServicer):
    """A server of a later contract version: answers every report with a status this client
    does not know (real gRPC on loopback; only the status value is new)."""

    def __init__(self, survey: ldp_pb2.Survey) -> None:
        self.survey = survey
        self.uploads = 0

    def GetSurvey(self, request, context):  # noqa: N802 (gRPC method name)
        return self.survey

    def Upload(self, request, context):  # noqa: N802 (gRPC method name)
        self.uploads += 1
        return ldp_pb2.UploadResponse(
            results=[
                ldp_pb2.ReportResult(report_id=r.report_id, status=99) for r in request.reports
            ]
        )


def test_device_keeps_reports_with_an_unknown_status_pending(tmp_path, server):
    survey = server.surveys["s1"].to_proto()
    servicer = _FutureCollector(survey)
    future_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    ldp_pb2_grpc.add_CollectorServicer_to_server(servicer, future_server)
    port = future_server.add_insecure_port("127.0.0.1:0")
    future_server.start()
    try:
        with Transport(f"127.0.0.1:{port}", max_attempts=1) as transport:
            reporter = Reporter(transport, tmp_path / "device.sqlite", Budget(10.0))
            try:
                reporter.outbox.add(os.urandom(16), "s1", "rr", bytes(4))
                result = reporter.flush()
                assert result.pending == 1 and result.accepted == result.duplicate == 0
                assert "settled 0 of 1" in result.error
                assert servicer.uploads == 1  # the flush stopped instead of looping
                assert reporter.outbox.rejected() == []
            finally:
                reporter.close()
    finally:
        future_server.stop(None)


def test_a_message_over_4_mib_is_resource_exhausted_without_a_hint(server):
    report = ldp_pb2.Report(
        report_id=bytes(16), survey_id="s1", question_id="gauss", payload=bytes(MAX_MESSAGE_BYTES)
    )
    with grpc.insecure_channel(server.target) as channel:
        stub = ldp_pb2_grpc.CollectorStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Upload(ldp_pb2.UploadRequest(reports=[report]), timeout=30)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert all(key != "retry-after-ms" for key, _ in refused.value.trailing_metadata() or ())


def test_the_mechanism_table_names_every_enum_value():
    """§2.2 lists every Mechanism value with its number and the name survey files and the digest
    use (an independent device found five of nine missing from §2 in wire document 1)."""
    from client.survey import MECHANISM_NAMES

    rows = re.findall(r"^\| `([A-Z_]+)` \((\d+)\) \| `([a-z_]+)` \|", WIRE, re.MULTILINE)
    named = {
        ldp_pb2.Mechanism.Name(value): str(value)
        for value in ldp_pb2.Mechanism.values()
        if value != ldp_pb2.MECHANISM_UNSPECIFIED
    }
    assert {enum: number for enum, number, _ in rows} == named
    for enum, _, name in rows:
        assert MECHANISM_NAMES[name] == ldp_pb2.Mechanism.Value(enum)


def test_the_public_coin_cap_is_the_quoted_one():
    """§5: the per-request cap of a public-coin question is floor(2^25 / 2L) reports."""
    from aggregator.store.ingest import MAX_SUPPORT_CELLS
    from client.mechanisms import PublicCoinBit

    assert MAX_SUPPORT_CELLS == 2**25 and "`floor(2^25 / (2L))`" in WIRE
    mech = PublicCoinBit(12, 1.0, public_seed=1, groups=65_536)
    assert mech.statistic_size == 2 * 65_536 and MAX_SUPPORT_CELLS // mech.statistic_size == 256
