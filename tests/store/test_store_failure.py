"""A store that can no longer make reports durable is visible: the server stops acknowledging,
answers UNAVAILABLE with a retry hint, turns health NOT_SERVING, and no acknowledged report is
lost (checked after a SIGKILL). Real server processes; a small tmpfs where mounting is allowed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from aggregator_process import AggregatorProcess, free_port
from conftest import SURVEYS_TOML
from grpc_health.v1 import health_pb2, health_pb2_grpc
from storecheck import stored_reports

from client.device.transport import RETRY_AFTER_KEY
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc


def reports(n: int) -> list[ldp_pb2.Report]:
    payload = (2).to_bytes(4, "little")
    return [
        ldp_pb2.Report(report_id=os.urandom(16), survey_id="s1", question_id="rr", payload=payload)
        for _ in range(n)
    ]


def health(target: str) -> int:
    """One probe on a connection of its own (with workers, any of them may answer)."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    with grpc.insecure_channel(target, options=options) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status


def upload_until_refused(target: str, size: int, limit: int = 2000):
    """Upload ``size``-report batches until the server refuses one; the acknowledged report ids
    and the refusal."""
    acked: list[bytes] = []
    with grpc.insecure_channel(target) as channel:
        stub = ldp_pb2_grpc.CollectorStub(channel)
        for _ in range(limit):
            try:
                response = stub.Upload(ldp_pb2.UploadRequest(reports=reports(size)), timeout=10)
            except grpc.RpcError as exc:
                return acked, exc
            acked += [r.report_id for r in response.results]
    pytest.fail("the store never failed")


def upload_times(target: str, size: int, times: int) -> list[bytes]:
    """``times`` uploads of ``size`` reports, all acknowledged; their ids."""
    with grpc.insecure_channel(target) as channel:
        stub = ldp_pb2_grpc.CollectorStub(channel)
        return [
            result.report_id
            for _ in range(times)
            for result in stub.Upload(
                ldp_pb2.UploadRequest(reports=reports(size)), timeout=10
            ).results
        ]


def assert_refused_visibly(server: AggregatorProcess, refusal: grpc.RpcError, needle: str):
    assert refusal.code() == grpc.StatusCode.UNAVAILABLE, refusal.details()
    assert needle in refusal.details()
    assert dict(refusal.trailing_metadata()).get(RETRY_AFTER_KEY) == "5000"
    deadline = time.monotonic() + 60  # finished, not how fast: a generous bound
    while health(server.target) != health_pb2.HealthCheckResponse.NOT_SERVING:
        assert time.monotonic() < deadline, "health still SERVING"
        time.sleep(0.05)
    with pytest.raises(grpc.RpcError) as again:  # and it stays refused
        upload_times(server.target, 1, 1)
    assert again.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.fixture
def process(tmp_path):
    config = tmp_path / "surveys.toml"
    config.write_text(SURVEYS_TOML)

    def start(db: Path, *options: str) -> AggregatorProcess:
        server = AggregatorProcess(config, db, free_port(), tmp_path / "server.log", options)
        server.start(timeout=90)
        started.append(server)
        return server

    started: list[AggregatorProcess] = []
    yield start
    for server in started:
        if server._process is not None:
            server.kill()


@pytest.mark.parametrize("options", [(), ("--workers", "2")], ids=["one", "workers"])
def test_unlinked_wal_stops_acknowledging_and_loses_nothing(tmp_path, process, options):
    db = tmp_path / "reports.sqlite"
    server = process(db, *options)
    acked = upload_times(server.target, 100, 5)
    Path(f"{db}-wal").unlink()
    more, refusal = upload_until_refused(server.target, 100)
    acked += more
    assert_refused_visibly(server, refusal, "WAL file")
    server.kill()
    stored = stored_reports(db)
    assert all(report_id in stored for report_id in acked), "an acknowledged report was lost"


@pytest.fixture
def tmpfs(tmp_path):
    """A 1 MiB tmpfs (root only; skipped where mounting is not allowed)."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_stops_acknowledging_and_loses_nothing(tmpfs, process):
    db = tmpfs / "reports.sqlite"
    server = process(db)
    acked, refusal = upload_until_refused(server.target, 200)
    assert len(acked) > 0
    assert_refused_visibly(server, refusal, "full")
    server.kill()
    stored = stored_reports(db)
    assert all(report_id in stored for report_id in acked), "an acknowledged report was lost"


def test_a_read_only_store_fails_to_start_with_one_line(tmpfs, tmp_path):
    """(File modes do not stop root, who runs this suite in CI containers: a read-only mount
    does.)"""
    config = tmp_path / "surveys.toml"
    config.write_text(SURVEYS_TOML)
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    result = subprocess.run(
        [
            *(sys.executable, "-m", "aggregator.cli", "serve", "--insecure", "--port", "0"),
            *("--config", str(config), "--db", str(tmpfs / "reports.sqlite")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("options", [(), ("--workers", "2")], ids=["one", "workers"])
def test_a_wal_deleted_while_idle_turns_health_not_serving(tmp_path, process, options):
    """No upload needed: the server's own probe notices (in every worker), and rescues what was
    acknowledged."""
    db = tmp_path / "reports.sqlite"
    server = process(db, *options)
    acked = upload_times(server.target, 100, 3)
    Path(f"{db}-wal").unlink()
    time.sleep(2.5)  # two probe rounds
    for _ in range(10):  # fresh connections: with workers, the kernel spreads them over both
        assert health(server.target) == health_pb2.HealthCheckResponse.NOT_SERVING
    server.kill()
    stored = stored_reports(db)
    assert all(report_id in stored for report_id in acked), "an acknowledged report was lost"
