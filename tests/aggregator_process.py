"""The aggregator as a real process (``python -m aggregator.cli serve``): on a free port chosen by
the server itself (:func:`spawn_serve`), or on a fixed loopback port so that a test can SIGKILL
it and start it again on the same port and the same SQLite file (:class:`AggregatorProcess`)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc


def spawn_serve(
    port_file: Path, *args: str, timeout: float = 60.0, output: int | None = subprocess.PIPE
) -> tuple[subprocess.Popen, int]:
    """Start ``python -m aggregator.cli serve --port 0 --port-file PORT_FILE *args`` and wait
    until it has written the port it listens on; the process and the port. The Analyst's port
    is in ``PORT_FILE.analyst`` (:func:`analyst_port`), written before the port file.
    ``output`` is where its stdout and stderr go (text pipes by default, so a failed start
    shows its stderr; None inherits them). A server that exits, or has not started within
    ``timeout`` seconds, is killed and fails the test."""
    port_file.unlink(missing_ok=True)
    command = [sys.executable, "-m", "aggregator.cli", "serve", "--port", "0"]
    command += ["--analyst-port-file", f"{port_file}.analyst"]
    process = subprocess.Popen(
        [*command, "--port-file", str(port_file), *args], stdout=output, stderr=output, text=True
    )
    deadline = time.monotonic() + timeout
    while not (port_file.exists() and port_file.read_text().strip()):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            _, stderr = process.communicate()
            pytest.fail(f"the aggregator did not start: {stderr}")
        time.sleep(0.05)
    return process, int(port_file.read_text())


def analyst_port(port_file: Path) -> int:
    """The Analyst port of a server started by :func:`spawn_serve` with ``port_file``."""
    return int(Path(f"{port_file}.analyst").read_text())


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def is_serving(target: str, timeout: float = 0.25) -> bool:
    """One health probe on a fresh channel (with its own subchannel, so no shared reconnect
    backoff delays it): True if the server answers SERVING."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    with grpc.insecure_channel(target, options=options) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout
            )
        except grpc.RpcError:
            return False
    return response.status == health_pb2.HealthCheckResponse.SERVING


def child_pids(pid: int) -> set[int]:
    """The live child processes of ``pid`` (from /proc)."""
    children = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                children.add(int(entry.name))
    return children


class AggregatorProcess:
    """``ldp-aggregator serve --insecure [options]`` on ``port``; its output goes to ``log``."""

    def __init__(
        self, config: Path, db: Path, port: int, log: Path, options: Sequence[str] = ()
    ) -> None:
        self.config, self.db, self.port, self.log = config, db, port, log
        self.options = tuple(options)
        self.orphans: set[int] = set()  # worker processes left behind by kill()
        self._process: subprocess.Popen | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> float:
        """Spawn the server and wait for health SERVING; returns the seconds that took."""
        started = time.monotonic()
        with self.log.open("a") as log:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "aggregator.cli",
                    "serve",
                    "--insecure",
                    "--config",
                    str(self.config),
                    "--db",
                    str(self.db),
                    "--port",
                    str(self.port),
                    "--analyst-port",  # a free one: the default (port + 1) may be taken
                    "0",
                    *self.options,
                ],
                stdout=log,
                stderr=log,
            )
        while not is_serving(self.target):
            if self._process.poll() is not None:
                raise RuntimeError(f"aggregator exited with {self._process.returncode}: {self.log}")
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"aggregator not serving after {timeout} s: {self.log}")
            time.sleep(0.01)
        return time.monotonic() - started

    def kill(self) -> None:
        """SIGKILL the main process (the store's writer): no shutdown handler runs, in-flight
        transactions are cut wherever they are. Its worker processes, if any, are left to
        notice on their own (recorded in ``orphans``)."""
        assert self._process is not None
        self.orphans |= child_pids(self._process.pid)
        self._process.send_signal(signal.SIGKILL)
        self._process.wait(timeout=10)
        assert self._process.returncode == -signal.SIGKILL
        self._process = None

    def stop(self) -> None:
        """Graceful stop (SIGTERM), if still running."""
        if self._process is not None:
            self._process.send_signal(signal.SIGTERM)
            self._process.wait(timeout=30)
            self._process = None
