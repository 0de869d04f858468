"""Hostile traffic against a real ``ldp-aggregator serve`` process on loopback, measured.

Scenarios (``--scenario``):

* ``flood``: ``--flooders`` processes each keep ``--inflight`` Upload calls of 4 MiB hand-built
  UploadRequests going for ``--seconds`` (``--flood empty``: ~2 M empty Report messages;
  ``--flood ids``: ~210,000 reports holding only a report id), while one client probes
  health every 50 ms and another sends honest 10-report uploads every 100 ms. Reports the server's
  peak RSS, health and honest latency percentiles, and the flood calls' status codes.
* ``stream``: ``--flooders`` pairs of client streams that never close (one sending messages of
  5,000 invalid reports as fast as it can, one an empty message a second), plus 200 idle HTTP/2
  connections; reports the peak RSS, how each stream ended, and how many idle connections the
  server still holds after ``--seconds``.
* ``store``: acknowledged uploads, then the WAL is unlinked under the running server, uploads go
  on for 3 s, the server is SIGKILLed and restarted: acknowledged vs stored reports, and what the
  clients and health saw after the unlink.

``--tree`` picks the source tree the server runs from (its own PYTHONPATH), so the same script
measures an older commit checked out elsewhere. Traffic goes to 127.0.0.1 only; every loop is
bounded in time. Run under ``flock /tmp/heavy.lock`` on a shared machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

SURVEYS = """
[[survey]]
id = "s"
title = "bench"
min_batch_size = 1

[[survey.question]]
id = "q"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0
"""
FLOOD_BYTES = 4 * 1024 * 1024 - 64
FLOODS = {
    # ~2.1 M empty Report entries
    "empty": b"\x0a\x00" * (FLOOD_BYTES // 2),
    # ~210,000 reports holding only a 16-byte report id (past any "too short" check)
    "ids": (b"\x0a\x12\x0a\x10" + bytes(16)) * (FLOOD_BYTES // 20),
}
OPTIONS = [("grpc.max_send_message_length", 8 * 1024 * 1024)]


def report() -> ldp_pb2.Report:
    payload = int(np.random.default_rng().integers(4)).to_bytes(4, "little")
    return ldp_pb2.Report(report_id=os.urandom(16), survey_id="s", question_id="q", payload=payload)


class Server:
    """``python -m aggregator.cli serve`` from ``tree`` on a free loopback port."""

    def __init__(self, tree: Path, workdir: Path, *extra: str) -> None:
        self.tree, self.workdir, self.extra = tree, workdir, extra
        (workdir / "surveys.toml").write_text(SURVEYS)
        self.db = workdir / "reports.sqlite"
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.started_at = 0.0
        self.killed_at: float | None = None

    def start(self) -> Server:
        port_file = self.workdir / "port"
        port_file.unlink(missing_ok=True)
        env = {**os.environ, "PYTHONPATH": str(self.tree)}
        command = [sys.executable, "-m", "aggregator.cli", "serve", "--insecure", "--port", "0"]
        command += ["--config", str(self.workdir / "surveys.toml"), "--db", str(self.db)]
        command += ["--port-file", str(port_file), *self.extra]
        self.process = subprocess.Popen(
            command, env=env, cwd=self.tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {self.process.stderr.read()!r}")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        self.started_at = time.monotonic()
        return self

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def rss_mib(self) -> float:
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return 0.0
        line = next(x for x in status.splitlines() if x.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024

    def stop(self, kill: bool = False) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {"n": 0}
    values = np.array(samples) * 1000
    return {
        "n": len(samples),
        "p50_ms": round(float(np.percentile(values, 50)), 1),
        "p99_ms": round(float(np.percentile(values, 99)), 1),
        "max_ms": round(float(values.max()), 1),
    }


def _flooder(target: str, seconds: float, inflight: int, kind: str, out) -> None:
    """One flooding process: ``inflight`` threads each sending the flood back to back."""
    codes: dict[str, int] = {}
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def loop() -> None:
        with grpc.insecure_channel(target, options=OPTIONS) as channel:
            call = channel.unary_unary("/ldp.v1.Collector/Upload")
            while time.monotonic() < stop_at:
                try:
                    call(FLOODS[kind], timeout=10)
                    code = "OK"
                except grpc.RpcError as exc:
                    code = exc.code().name
                with lock:
                    codes[code] = codes.get(code, 0) + 1

    threads = [threading.Thread(target=loop) for _ in range(inflight)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put(codes)


def _probe(target: str, stop: threading.Event, latencies: list[float], errors: list[str], send):
    with grpc.insecure_channel(target) as channel:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                send(channel)
                latencies.append(time.perf_counter() - started)
            except grpc.RpcError as exc:
                errors.append(exc.code().name)
            stop.wait(0.05)


def _health(channel: grpc.Channel) -> None:
    health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)


def _honest(channel: grpc.Channel) -> None:
    request = ldp_pb2.UploadRequest(reports=[report() for _ in range(10)])
    ldp_pb2_grpc.CollectorStub(channel).Upload(request, timeout=10)


RSS_LIMIT_MIB = 2048  # a server past this is killed, to spare the (shared) machine


def _watch_rss(server: Server, stop: threading.Event, peak: list[float]) -> None:
    """Track the server's peak RSS; kill it past RSS_LIMIT_MIB (recorded as peak = the limit)."""
    while not stop.is_set():
        peak[0] = max(peak[0], server.rss_mib())
        if peak[0] > RSS_LIMIT_MIB:
            server.killed_at = time.monotonic() - server.started_at
            server.stop(kill=True)
            return
        stop.wait(0.2)


def flood(server: Server, args: argparse.Namespace) -> dict:
    stop = threading.Event()
    peak = [server.rss_mib()]
    idle_rss = peak[0]
    health_ms: list[float] = []
    honest_ms: list[float] = []
    errors: dict[str, list[str]] = {"health": [], "honest": []}
    threads = [
        threading.Thread(target=_watch_rss, args=(server, stop, peak)),
        threading.Thread(
            target=_probe, args=(server.target, stop, health_ms, errors["health"], _health)
        ),
        threading.Thread(
            target=_probe, args=(server.target, stop, honest_ms, errors["honest"], _honest)
        ),
    ]
    for thread in threads:
        thread.start()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    flooders = [
        ctx.Process(
            target=_flooder, args=(server.target, args.seconds, args.inflight, args.flood, out)
        )
        for _ in range(args.flooders)
    ]
    for proc in flooders:
        proc.start()
    codes: dict[str, int] = {}
    for _ in flooders:
        for code, n in out.get(timeout=args.seconds + 120).items():
            codes[code] = codes.get(code, 0) + n
    for proc in flooders:
        proc.join()
    stop.set()
    for thread in threads:
        thread.join()
    return {
        "rss_idle_mib": round(idle_rss),
        "rss_peak_mib": round(peak[0]),
        "killed_past_rss_limit_after_s": server.killed_at and round(server.killed_at, 1),
        "health": percentiles(health_ms),
        "honest_upload": percentiles(honest_ms),
        "probe_errors": {k: len(v) for k, v in errors.items()},
        "flood_calls": codes,
    }


def _endless_stream(target: str, seconds: float, slow: bool, out) -> None:
    """One never-closing stream (bounded here by ``seconds``): messages of 5,000 invalid reports
    as fast as it can, or (``slow``) an empty message every second, slow-loris style."""
    stop_at = time.monotonic() + seconds

    def messages():
        bad = ldp_pb2.Report(report_id=b"x", survey_id="s", question_id="q", payload=b"")
        request = ldp_pb2.UploadRequest(reports=[] if slow else [bad] * 5000)
        while time.monotonic() < stop_at:
            yield request
            if slow:
                time.sleep(1)

    started = time.monotonic()
    with grpc.insecure_channel(target, options=OPTIONS) as channel:
        stub = ldp_pb2_grpc.CollectorStub(channel)
        try:
            stub.UploadStream(messages(), timeout=seconds + 30)
            outcome = "OK"
        except grpc.RpcError as exc:
            outcome = f"{exc.code().name}: {exc.details()[:80]}"
    kind = "slow" if slow else "fast"
    out.put({"stream": kind, "outcome": outcome, "after_s": round(time.monotonic() - started, 1)})


def _idle_connections(port: int, count: int) -> list[socket.socket]:
    """``count`` HTTP/2 connections that send the preface and an empty SETTINGS frame, then
    nothing."""
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(preface)
        sockets.append(sock)
    return sockets


def _still_open(sock: socket.socket) -> bool:
    """Whether the server still holds the connection: drain what it sent; EOF or a reset means
    it closed it (a GOAWAY alone is followed by the close)."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def stream(server: Server, args: argparse.Namespace) -> dict:
    stop = threading.Event()
    peak = [server.rss_mib()]
    watcher = threading.Thread(target=_watch_rss, args=(server, stop, peak))
    watcher.start()
    idle = _idle_connections(server.port, 200)
    ended_at = time.monotonic() + args.seconds
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_endless_stream, args=(server.target, args.seconds, slow, out))
        for _ in range(args.flooders)
        for slow in (False, True)
    ]
    for proc in procs:
        proc.start()
    outcomes = [out.get(timeout=args.seconds + 120) for _ in procs]
    for proc in procs:
        proc.join()
    time.sleep(max(0.0, ended_at - time.monotonic()))
    held = sum(_still_open(sock) for sock in idle)
    for sock in idle:
        sock.close()
    stop.set()
    watcher.join()
    return {
        "rss_peak_mib": round(peak[0]),
        "killed_past_rss_limit_after_s": server.killed_at and round(server.killed_at, 1),
        "streams": outcomes,
        "idle_connections_held_after_s": {"seconds": args.seconds, "held": held, "of": 200},
    }


def _upload_until(target: str, stop: threading.Event, acked: list[bytes], errors: list[str]):
    with grpc.insecure_channel(target) as channel:
        stub = ldp_pb2_grpc.CollectorStub(channel)
        while not stop.is_set():
            reports = [report() for _ in range(100)]
            try:
                response = stub.Upload(ldp_pb2.UploadRequest(reports=reports), timeout=5)
            except grpc.RpcError as exc:
                errors.append(f"{exc.code().name}: {exc.details()[:60]}")
                stop.wait(0.05)
                continue
            acked += [r.report_id for r in response.results]


def store(server: Server, args: argparse.Namespace) -> dict:
    stop = threading.Event()
    acked: list[bytes] = []
    errors: list[str] = []
    uploader = threading.Thread(target=_upload_until, args=(server.target, stop, acked, errors))
    uploader.start()
    time.sleep(2)
    before = len(acked)
    wal = Path(f"{server.db}-wal")
    wal.unlink()
    time.sleep(3)
    with grpc.insecure_channel(server.target) as channel:
        try:
            health = health_pb2.HealthCheckResponse.ServingStatus.Name(
                health_pb2_grpc.HealthStub(channel)
                .Check(health_pb2.HealthCheckRequest(), timeout=5)
                .status
            )
        except grpc.RpcError as exc:
            health = exc.code().name
    stop.set()
    uploader.join()
    server.stop(kill=True)
    import sqlite3

    with contextlib.closing(sqlite3.connect(server.db)) as conn:
        stored = {row[0] for row in conn.execute("SELECT report_id FROM reports")}
    lost = sum(report_id not in stored for report_id in acked)
    distinct = sorted({e.split(":")[0] for e in errors})
    return {
        "acknowledged_before_unlink": before,
        "acknowledged_after_unlink": len(acked) - before,
        "health_after_unlink": health,
        "errors_after_unlink": {"count": len(errors), "codes": distinct, "first": errors[:1]},
        "acknowledged_then_lost_after_sigkill": lost,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=["flood", "stream", "store"], default="flood")
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--flooders", type=int, default=2)
    parser.add_argument("--inflight", type=int, default=2, help="calls in flight per flooder")
    parser.add_argument("--flood", choices=sorted(FLOODS), default="empty", help="flood content")
    args = parser.parse_args()
    if args.seconds > 600:
        parser.error("--seconds is at most 600")
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(args.tree.resolve(), Path(tmp)).start()
        try:
            result = {"flood": flood, "stream": stream, "store": store}[args.scenario](server, args)
        finally:
            server.stop()
    commit = subprocess.run(
        ["git", "-C", str(args.tree), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    header = {"scenario": args.scenario, "tree_commit": commit, "seconds": args.seconds}
    if args.scenario == "flood":
        header["flood"] = args.flood
    print(json.dumps({**header, **result}, indent=1))


if __name__ == "__main__":
    main()
