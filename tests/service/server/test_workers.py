"""``ldp-aggregator serve --workers 2`` as a user runs it: worker processes sharing one port,
one store writer. Uploads from many connections are stored exactly once, SIGTERM drains
in-flight uploads, a restart keeps everything, a dead worker stops the service cleanly, and a
worker whose writer vanished answers UNAVAILABLE."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from multiprocessing import Pipe
from pathlib import Path

import grpc
import numpy as np
import pytest
from aggregator_process import analyst_port, spawn_serve
from cli_runner import run_cli
from grpc_health.v1 import health_pb2, health_pb2_grpc

from aggregator.service.server.store_link import RemoteStore, serve_link
from aggregator.store.errors import StoreError, StoreUnavailableError
from aggregator.store.model import ReportBatch
from aggregator.store.sqlite.report_store import ReportStore
from aggregator.store.sqlite.statistics import read_statistics
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

START_SECONDS = 90  # spawning two workers that import numpy/scipy/grpc is slow on a busy CI box


def start(survey_file: Path, db: Path, tmp_path: Path, workers: int = 2):
    """The server process, its device target and its analyst target."""
    port_file = tmp_path / f"port-{time.monotonic_ns()}"
    process, port = spawn_serve(
        port_file,
        *("--config", str(survey_file), "--db", str(db), "--insecure"),
        *("--workers", str(workers)),
        timeout=START_SECONDS,
    )
    return process, f"127.0.0.1:{port}", f"127.0.0.1:{analyst_port(port_file)}"


def stop(process: subprocess.Popen) -> tuple[int, str]:
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    return process.returncode, stderr


def connection(target: str) -> grpc.Channel:
    """A channel with its own TCP connection (the kernel balances connections over workers)."""
    return grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


def reports(count: int) -> list[ldp_pb2.Report]:
    return [
        ldp_pb2.Report(
            report_id=os.urandom(16),
            survey_id="big",
            question_id="rr64",
            payload=(i % 8).to_bytes(4, "little"),
        )
        for i in range(count)
    ]


def estimate_n(target: str) -> int:
    with connection(target) as channel:
        analyst = ldp_pb2_grpc.AnalystStub(channel)
        request = ldp_pb2.EstimateRequest(survey_id="big", question_id="rr64")
        return analyst.Estimate(request, timeout=30).n


def children(pid: int) -> list[int]:
    """Live child processes of ``pid`` that are worker processes (spawned by multiprocessing)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid and b"spawn_main" in cmdline:
                out.append(int(entry.name))
    return out


@pytest.mark.slow
def test_many_connections_store_each_report_once_and_restart_keeps_them(survey_file, tmp_path):
    db = tmp_path / "w.sqlite"
    process, target, analyst = start(survey_file, db, tmp_path)
    assert len(children(process.pid)) == 2
    sent = [reports(40) for _ in range(48)]  # 48 uploads over 12 connections
    statuses: list[list[int]] = [[] for _ in sent]

    def uploader(index: int) -> None:
        with connection(target) as channel:
            collector = ldp_pb2_grpc.CollectorStub(channel)
            for i in range(index, len(sent), 12):
                batch = sent[i] + sent[i][:5]  # five resent within the same request
                response = collector.Upload(ldp_pb2.UploadRequest(reports=batch), timeout=60)
                assert [r.report_id for r in response.results] == [r.report_id for r in batch]
                statuses[i] = [r.status for r in response.results]

    threads = [threading.Thread(target=uploader, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(s == [ldp_pb2.ACCEPTED] * 40 + [ldp_pb2.DUPLICATE] * 5 for s in statuses)
    assert estimate_n(analyst) == 48 * 40
    returncode, stderr = stop(process)
    assert returncode == 0, stderr

    process, target, analyst = start(survey_file, db, tmp_path)
    try:
        with connection(target) as channel:
            collector = ldp_pb2_grpc.CollectorStub(channel)
            again = collector.Upload(ldp_pb2.UploadRequest(reports=sent[0]), timeout=60)
        assert {r.status for r in again.results} == {ldp_pb2.DUPLICATE}
        assert estimate_n(analyst) == 48 * 40
    finally:
        stop(process)


@pytest.mark.slow
def test_sigterm_drains_in_flight_uploads(survey_file, tmp_path):
    db = tmp_path / "d.sqlite"
    process, target, analyst = start(survey_file, db, tmp_path)
    acked: list[bytes] = []
    errors: list[grpc.StatusCode] = []
    lock = threading.Lock()

    def upload_loop() -> None:
        with connection(target) as channel:
            collector = ldp_pb2_grpc.CollectorStub(channel)
            for _ in range(400):
                batch = reports(50)
                try:
                    collector.Upload(ldp_pb2.UploadRequest(reports=batch), timeout=30)
                except grpc.RpcError as exc:
                    errors.append(exc.code())
                    return
                with lock:
                    acked.extend(r.report_id for r in batch)

    threads = [threading.Thread(target=upload_loop) for _ in range(6)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while len(acked) < 3000:
        assert time.monotonic() < deadline and any(t.is_alive() for t in threads), errors
        time.sleep(0.01)
    returncode, stderr = stop(process)  # while uploads are in flight
    for thread in threads:
        thread.join()
    assert returncode == 0, stderr
    assert "Traceback" not in stderr
    # A call arriving while a worker stops is refused with UNAVAILABLE or, in a race inside grpc,
    # CANCELLED (as in test_service.py); devices retry both. Such a call never ran, so the count
    # below must still be exactly the acknowledged reports.
    assert set(errors) <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
    process, target, analyst = start(survey_file, db, tmp_path)
    try:
        assert estimate_n(analyst) == len(acked)  # every acknowledged report, nothing more
        with connection(target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            check = health.Check(health_pb2.HealthCheckRequest(service="ldp.v1.Collector"))
            assert check.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        stop(process)


@pytest.mark.slow
def test_a_dead_worker_stops_the_service_with_an_error(survey_file, tmp_path):
    db = tmp_path / "k.sqlite"
    process, target, analyst = start(survey_file, db, tmp_path)
    batch = reports(100)
    with connection(target) as channel:
        collector = ldp_pb2_grpc.CollectorStub(channel)
        collector.Upload(ldp_pb2.UploadRequest(reports=batch), timeout=60)
    os.kill(children(process.pid)[0], signal.SIGKILL)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    lines = stderr.strip().splitlines()
    assert lines[-1].startswith("ldp-aggregator: error: worker process ldp-worker-")
    assert "Traceback" not in stderr
    process, target, analyst = start(survey_file, db, tmp_path, workers=1)
    try:
        assert estimate_n(analyst) == 100
    finally:
        stop(process)


def test_bad_worker_count_is_a_user_error(survey_file, tmp_path):
    command = ["serve", "--config", str(survey_file)]
    command += ["--db", str(tmp_path / "x.sqlite"), "--insecure", "--workers", "0"]
    done = run_cli("agg", *command)

    assert done.returncode == 2
    assert done.stderr.strip() == "ldp-aggregator: error: --workers must be at least 1"


def test_remote_store_without_its_writer_is_unavailable(tmp_path):
    """The writer's end of the pipe closes with a submit pending: the pending submit and every
    later one fail with StoreUnavailableError, and the worker is told to shut down."""

    async def scenario() -> None:
        ours, writers = Pipe()
        lost = asyncio.Event()
        store = await RemoteStore.connect(ours, tmp_path / "unused.sqlite", on_lost=lost.set)
        batch = ReportBatch("s", "q", [bytes(16)], [b"x"], np.ones((1, 1), dtype=np.int64))
        pending = store.submit_batches([batch])
        await asyncio.sleep(0.05)  # the loop sends the submit on its next turn
        [(_, batches)] = writers.recv()
        assert batches[0].report_ids == [bytes(16)]
        writers.close()
        with pytest.raises(StoreUnavailableError):
            await asyncio.wait_for(asyncio.wrap_future(pending), 10)
        await asyncio.wait_for(lost.wait(), 10)
        with pytest.raises(StoreUnavailableError):
            store.submit_batches([batch])
        await asyncio.to_thread(store.close)
        store.close()  # idempotent, even on the loop's thread once closed

    asyncio.run(scenario())


def test_remote_store_answers_each_upload_of_a_shared_message(tmp_path):
    """Uploads submitted in one turn of the worker's loop travel as one message and one store
    submit, yet each gets its own flags, in its own order; a malformed one fails alone."""
    db = tmp_path / "link.sqlite"
    store = ReportStore(db)
    store.register_question("s", "q", 2)
    ours, writers = Pipe()
    link = threading.Thread(target=serve_link, args=(store, writers), daemon=True)
    link.start()

    def batch(*ids: int) -> ReportBatch:
        rows = np.tile(np.array([[1, 0]], dtype=np.int64), (len(ids), 1))
        return ReportBatch("s", "q", [bytes([i]) * 16 for i in ids], [b"x"] * len(ids), rows)

    async def scenario() -> tuple[list, list]:
        remote = await RemoteStore.connect(ours, db)
        with pytest.raises(RuntimeError, match="another thread"):
            remote.close()  # on the loop's own thread it would wait for itself
        together = [
            remote.submit_batches([batch(1, 2)]),
            remote.submit_batches([batch(2, 3), batch(4)]),
            remote.submit_batches([batch(1)]),
        ]
        first_turn = await asyncio.gather(*(asyncio.wrap_future(f) for f in together))
        malformed = ReportBatch("s", "q", [b"short"], [b"x"], np.ones((1, 2)))
        apart = [remote.submit_batches([malformed]), remote.submit_batches([batch(5)])]
        second_turn = await asyncio.gather(
            *(asyncio.wrap_future(f) for f in apart), return_exceptions=True
        )
        await asyncio.to_thread(remote.close)
        return first_turn, second_turn

    try:
        (first, second, resent), (malformed, fifth) = asyncio.run(scenario())
        link.join(10)
    finally:
        store.close()
    assert first == [True, True]
    assert second == [False, True, True]
    assert resent == [False]
    assert isinstance(malformed, StoreError) and "report_id" in str(malformed)
    assert fifth == [True]
    assert read_statistics(db, "s", "q")[0] == 5


def test_workers_refuse_per_device_limits(tmp_path, survey_file):
    """Per-device limit state lives in one process: several workers would each enforce it."""
    limited = tmp_path / "limited.toml"
    limited.write_text(
        survey_file.read_text().replace(
            "min_batch_size = 5", "min_batch_size = 5\nburst = 3\nrate_per_minute = 60", 1
        )
    )
    command = ["serve", "--config", str(limited)]
    command += ["--db", str(tmp_path / "w.sqlite"), "--insecure", "--port", "0", "--workers", "2"]
    done = run_cli("agg", *command)

    assert done.returncode == 2
    assert "--workers 1" in done.stderr and "Traceback" not in done.stderr


def test_uploads_given_up_by_their_clients_do_not_break_the_link(survey_file, tmp_path):
    """Calls whose deadline passes while the writer holds their reports are cancelled in the
    worker; the writer's late answers must not take the worker's store link (and with it the
    service) down. Every report the store then holds was either acknowledged or given up."""
    db = tmp_path / "w.sqlite"
    process, target, _analyst = start(survey_file, db, tmp_path)
    given_up = 0
    try:
        with connection(target) as channel:
            collector = ldp_pb2_grpc.CollectorStub(channel)
            calls = [
                collector.Upload.future(ldp_pb2.UploadRequest(reports=reports(150)), timeout=0.005)
                for _ in range(100)
            ]
            for call in calls:
                try:
                    call.result()
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                    given_up += 1
            after = collector.Upload(ldp_pb2.UploadRequest(reports=reports(10)), timeout=30)
        assert given_up > 0
        assert [r.status for r in after.results] == [ldp_pb2.ACCEPTED] * 10
        assert process.poll() is None
    finally:
        returncode, stderr = stop(process)
    assert returncode == 0, stderr
    assert "lost the connection" not in stderr
