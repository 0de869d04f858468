"""Hostile traffic on a real server (loopback): uploads refused on their raw bytes before any
parse, refused requests released at once, and the per-stream limits."""

from __future__ import annotations

import gc
import os
import socket
import threading
import time
import weakref

import grpc
import pytest
from cli_runner import run_cli
from conftest import ServerThread
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.service.collector import wire
from aggregator.service.collector.answers import released, stream_response
from aggregator.service.collector.servicer import MAX_REPORTS_PER_REQUEST
from aggregator.service.collector.streams import ConnectionLimits, StreamLimits
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

RR_PAYLOAD = (1).to_bytes(4, "little")


def rr(report_id: bytes | None = None) -> ldp_pb2.Report:
    return ldp_pb2.Report(
        report_id=report_id or os.urandom(16), survey_id="s1", question_id="rr", payload=RR_PAYLOAD
    )


def empty_reports_flood(size: int = 4 * 1024 * 1024 - 64) -> bytes:
    """An UploadRequest of ``size`` bytes made of empty Report entries (two bytes each), built
    by hand as a hostile client would."""
    return b"\x0a\x00" * (size // 2)


def raw_upload(channel: grpc.Channel, raw: bytes, timeout: float = 10):
    call = channel.unary_unary(
        "/ldp.v1.Collector/Upload",
        request_serializer=None,
        response_deserializer=ldp_pb2.UploadResponse.FromString,
    )
    return call(raw, timeout=timeout)


@pytest.fixture
def channel(server):
    with grpc.insecure_channel(server.target) as channel:
        yield channel


# --- counting on the raw bytes --------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    reports=st.lists(
        st.builds(
            ldp_pb2.Report,
            report_id=st.binary(max_size=40),
            survey_id=st.text(max_size=200),
            payload=st.binary(max_size=300),
        ),
        max_size=30,
    ),
    signature=st.binary(max_size=70),
    limit=st.integers(0, 40),
)
def test_count_reports_agrees_with_protobuf(reports, signature, limit):
    raw = ldp_pb2.UploadRequest(reports=reports, signature=signature).SerializeToString()
    assert wire.count_reports(raw, limit) == min(len(reports), limit + 1)


@pytest.mark.parametrize(
    "raw",
    [b"\x0a", b"\x0a\x05abc", b"\x0a\xff", b"\x0b", b"\x00\x00", b"\x12\x80\x80\x80\x80\x80"],
)
def test_count_reports_refuses_malformed_framing(raw):
    with pytest.raises(wire.WireFormatError):
        wire.count_reports(raw, 10)


def test_count_stops_past_the_limit():
    """Counting a 4 MiB flood is bounded by the limit, not by the size: it stops at limit + 1
    and reads no further (a malformed tail after the flood goes unseen, while a count that reads
    to the end refuses it). Its speed is measured by scripts/bench_hostile.py, not here."""
    flood = id_only_flood() + b"\x00\x00"  # field number 0: malformed if ever reached
    assert wire.count_reports(flood, MAX_REPORTS_PER_REQUEST) == MAX_REPORTS_PER_REQUEST + 1
    with pytest.raises(wire.WireFormatError, match="field number 0"):
        wire.count_reports(flood, len(flood))


# --- refusals before parsing ----------------------------------------------------------------


def id_only_flood(size: int = 4 * 1024 * 1024 - 64) -> bytes:
    """Reports holding only a 16-byte report_id (20 bytes each): past the short-report check."""
    entry = b"\x0a\x12" + ldp_pb2.Report(report_id=bytes(16)).SerializeToString()
    return entry * (size // len(entry))


@pytest.mark.parametrize(
    ("flood", "code", "needle"),
    [
        (empty_reports_flood(), grpc.StatusCode.INVALID_ARGUMENT, "report[0]: report_id must be"),
        (id_only_flood(), grpc.StatusCode.RESOURCE_EXHAUSTED, "at most 10000 reports"),
    ],
)
def test_floods_are_refused_unparsed(server, channel, flood, code, needle):
    """4 MiB of ~2 M empty reports (refused at the first, too short to be valid) or of ~200,000
    id-only reports (refused when the count passes the limit; parsing used to cost half a second
    of the event loop and 180 MiB each: scripts/bench_hostile.py measures that), and honest
    uploads go through right after."""
    for _ in range(5):
        with pytest.raises(grpc.RpcError) as error:
            raw_upload(channel, flood)
        assert error.value.code() == code
        assert needle in error.value.details()
    response = raw_upload(channel, ldp_pb2.UploadRequest(reports=[rr()]).SerializeToString())
    assert [r.status for r in response.results] == [ldp_pb2.ACCEPTED]


def test_count_refuses_the_first_short_report():
    raw = ldp_pb2.UploadRequest(reports=[rr(), ldp_pb2.Report(survey_id="s1")]).SerializeToString()
    with pytest.raises(wire.ShortReportError) as error:
        wire.count_reports(raw, 10, min_length=wire.MIN_VALID_REPORT_BYTES)
    assert error.value.index == 1
    assert wire.count_reports(raw, 10) == 2


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"", grpc.StatusCode.INVALID_ARGUMENT),  # no reports
        (b"\x0a\x02\x12\x00", grpc.StatusCode.INVALID_ARGUMENT),  # a short report
        (b"\x0a\x40abc", grpc.StatusCode.INVALID_ARGUMENT),  # a field runs past the end
        (b"\x0f", grpc.StatusCode.INVALID_ARGUMENT),  # wire type 7
    ],
)
def test_malformed_uploads_get_specific_codes(channel, raw, code):
    with pytest.raises(grpc.RpcError) as error:
        raw_upload(channel, raw)
    assert error.value.code() == code


def test_small_rpcs_have_small_bounds_and_echo_ids_truncated(channel):
    stub = ldp_pb2_grpc.CollectorStub(channel)
    with pytest.raises(grpc.RpcError) as error:
        stub.GetSurvey(ldp_pb2.GetSurveyRequest(survey_id="x" * 100_000), timeout=10)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(grpc.RpcError) as error:
        stub.GetSurvey(ldp_pb2.GetSurveyRequest(survey_id="y" * 3000), timeout=10)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(error.value.details()) <= 160
    bad = rr()
    bad.survey_id = "z" * 100_000
    with pytest.raises(grpc.RpcError) as error:
        stub.Upload(ldp_pb2.UploadRequest(reports=[bad]), timeout=10)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(error.value.details()) <= 160


def test_a_refused_call_releases_its_frames_without_a_garbage_collection():
    """What an aborted handler built dies with the call: ``released`` cuts the exception loose
    from its traceback, cause and context (with gc off, a cycle would keep it alive)."""

    class Payload:
        pass

    holder: list[weakref.ref] = []

    def handler():
        payload = Payload()
        holder.append(weakref.ref(payload))
        try:
            raise ValueError("invalid report")
        except ValueError:
            raise RuntimeError("abort") from None

    def call(cut: bool):
        try:
            handler()
        except RuntimeError as exc:
            caught = released(exc) if cut else exc
            caught.__self_reference__ = caught  # the kind of cycle that holds a traceback
            return None

    gc.disable()
    try:
        call(cut=False)
        assert holder[-1]() is not None  # the cycle keeps the handler's frame alive
        call(cut=True)
        assert holder[-1]() is None
    finally:
        gc.enable()
        gc.collect()


# --- streams --------------------------------------------------------------------------------


@pytest.fixture
def limited(tmp_path, survey_file):
    limits = StreamLimits(max_messages=3, max_reports=5, max_seconds=1.0, max_rejected=2)
    running = ServerThread(survey_file, tmp_path / "streams.sqlite", streams=limits)
    yield running.start()
    running.stop()


def stream_call(server, messages, timeout=10):
    with grpc.insecure_channel(server.target) as channel:
        stub = ldp_pb2_grpc.CollectorStub(channel)
        return stub.UploadStream(iter(messages), timeout=timeout)


def message(*reports):
    return ldp_pb2.UploadRequest(reports=reports)


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        ([message(rr())] * 4, "at most 3 messages per stream"),
        ([message(rr(), rr(), rr()), message(rr(), rr(), rr())], "at most 5 reports per stream"),
    ],
)
def test_stream_size_limits(limited, messages, needle):
    with pytest.raises(grpc.RpcError) as error:
        stream_call(limited, [ldp_pb2.UploadRequest(reports=m.reports) for m in messages])
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert needle in error.value.details()


def test_stream_within_limits_is_answered_per_report(limited):
    response = stream_call(limited, [message(rr(), rr()), message(rr())])
    assert [r.status for r in response.results] == [ldp_pb2.ACCEPTED] * 3
    assert (response.accepted, response.duplicates, response.summarized) == (3, 0, False)


def test_too_many_invalid_reports_end_the_stream(limited):
    bad = [rr(os.urandom(5)) for _ in range(3)]
    with pytest.raises(grpc.RpcError) as error:
        stream_call(limited, [message(*bad)])
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "more than 2 invalid reports" in error.value.details()


def test_a_silent_stream_is_ended_at_its_duration_limit(limited):
    """A stream that opens and never sends (slow loris) is ended after max_seconds: by the
    server, while the client is still silent (not when its next message comes)."""
    ended = threading.Event()
    second_sent = []

    def silent():
        yield message(rr())
        if ended.wait(60):  # the call is over: the client never spoke again
            return
        second_sent.append(True)
        yield message(rr())

    try:
        with pytest.raises(grpc.RpcError) as error:
            stream_call(limited, silent(), timeout=90)
    finally:
        ended.set()
    assert second_sent == []
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "longer than 1 s" in error.value.details()


def test_stream_results_are_summarized_past_the_message_limit():
    accepted = [ldp_pb2.ReportResult(report_id=os.urandom(16), status=ldp_pb2.ACCEPTED)] * 50
    rejected = ldp_pb2.ReportResult(
        report_id=os.urandom(16), status=ldp_pb2.REJECTED, code="NOT_FOUND", reason="no"
    )
    full = stream_response([*accepted, rejected], max_bytes=10_000)
    assert len(full.results) == 51 and not full.summarized
    short = stream_response([*accepted, rejected], max_bytes=500)
    assert list(short.results) == [rejected]
    assert (short.accepted, short.duplicates, short.summarized) == (50, 0, True)


# --- connections ----------------------------------------------------------------------------


def test_idle_connections_are_closed(tmp_path, survey_file):
    """A connection that opens HTTP/2 and then sends nothing is closed after the idle limit."""
    limits = ConnectionLimits(max_connection_idle_seconds=1.0)
    running = ServerThread(survey_file, tmp_path / "idle.sqlite", connections=limits).start()
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    try:
        # The server closes it (1 s); a connection still open after 30 s fails with a timeout.
        with socket.create_connection(("127.0.0.1", running.port), timeout=30) as sock:
            sock.sendall(preface)
            while sock.recv(65536):  # the server's SETTINGS, then GOAWAY, then the close
                pass
    finally:
        running.stop()


def test_connection_limits_become_grpc_options():
    options = dict(ConnectionLimits(max_concurrent_streams=7).options())
    assert options["grpc.max_concurrent_streams"] == 7
    assert options["grpc.max_connection_idle_ms"] == 60_000
    with pytest.raises(ValueError, match="max_connection_age_seconds must be positive"):
        ConnectionLimits(max_connection_age_seconds=0)


def test_serve_refuses_a_non_positive_limit_in_one_line(survey_file, tmp_path):
    result = run_cli(
        "agg",
        *("serve", "--insecure", "--port", "0"),
        *("--config", str(survey_file), "--db", str(tmp_path / "db.sqlite")),
        *("--max-stream-seconds", "0"),
    )

    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "ldp-aggregator: error: max_seconds must be positive"
    ]


def test_concurrent_streams_per_connection_are_bounded(tmp_path, survey_file):
    """With MAX_CONCURRENT_STREAMS 2, a third call on the same connection waits for a free
    stream (here: until its deadline) while two open streams hold theirs."""
    limits = ConnectionLimits(max_concurrent_streams=2)
    running = ServerThread(survey_file, tmp_path / "streams.sqlite", connections=limits).start()
    release = threading.Event()

    def held():
        yield message(rr())
        release.wait(10)

    try:
        with grpc.insecure_channel(running.target) as channel:
            stub = ldp_pb2_grpc.CollectorStub(channel)
            stub.Upload(ldp_pb2.UploadRequest(reports=[rr()]), timeout=10)  # connected
            calls = [stub.UploadStream.future(held(), timeout=20) for _ in range(2)]
            time.sleep(0.5)
            with pytest.raises(grpc.RpcError) as error:
                stub.Upload(ldp_pb2.UploadRequest(reports=[rr()]), timeout=1)
            assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            release.set()
            assert [call.result().accepted for call in calls] == [1, 1]
            stub.Upload(ldp_pb2.UploadRequest(reports=[rr()]), timeout=10)
    finally:
        release.set()
        running.stop()
