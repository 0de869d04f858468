"""``ldp-aggregator serve --workers N``: N gRPC server processes on one port, one store writer.

Why: one Python process runs its gRPC event loop, request parsing, validation and response
encoding under one GIL, so it tops out at about one core however many the machine has. Here
the parent process owns the SQLite store and its single writer thread (SQLite allows one
writer; group commit makes one enough) and starts N worker processes. Each worker runs the whole
gRPC server on the same port with SO_REUSEPORT, so the kernel spreads incoming connections over
the workers, and reaches the store through :mod:`aggregator.service.server.store_link`: an upload is
acknowledged only after the parent's transaction holding it committed, exactly as in one
process. Workers are spawned, not forked (gRPC does not survive a fork). The Analyst's own
listener is served by the first worker only (one analysis executor, one audit log writer, global
analysis limits that are global), through the same store link.

Shutdown: on SIGTERM or SIGINT the parent forwards SIGTERM to the workers; each drains its
in-flight calls (their submits are still answered, the writer is alive) and exits; only then
does the parent close the store, committing whatever is queued. If a worker dies, the parent
stops the others the same way and fails (a service supervisor restarts the whole service). If
the parent dies, the workers lose their pipe, answer UNAVAILABLE (which clients retry), and exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path

import grpc

from aggregator.errors import LdpError
from aggregator.service.analyst.audit import AuditLog
from aggregator.service.analyst.auth import AnalystAccess
from aggregator.service.collector.device_auth import DEFAULT_WINDOW_SECONDS, DeviceAuthenticator
from aggregator.service.collector.limits import (
    DEFAULT_MAX_INFLIGHT_REPORTS,
    CapCounter,
    UploadGuard,
)
from aggregator.service.collector.metrics import NoMetrics, PrometheusMetrics
from aggregator.service.collector.observe import Observer, access_log_stream
from aggregator.service.collector.registry import DeviceRegistry, RegistryWatch
from aggregator.service.collector.streams import ConnectionLimits, StreamLimits
from aggregator.service.server.app import open_store, serve
from aggregator.service.server.ports import ensure_port_free
from aggregator.service.server.store_link import RemoteStore, serve_link
from aggregator.service.server.tls import server_credentials
from aggregator.store.sqlite.lock import StoreLock
from aggregator.survey_file.config import load_surveys
from client.survey import SurveySpec

log = logging.getLogger(__name__)

START_TIMEOUT = 60.0


class WorkerError(LdpError):
    """A worker process failed to start or died while serving."""


@dataclass(frozen=True)
class WorkerSecurity:
    """Transport security and device authentication, as files each worker loads itself."""

    tls_cert: Path | None = None
    tls_key: Path | None = None
    client_ca: Path | None = None
    devices: Path | None = None
    auth_window: float = DEFAULT_WINDOW_SECONDS

    def credentials(self) -> grpc.ServerCredentials | None:
        if self.tls_cert is None or self.tls_key is None:
            return None
        return server_credentials(self.tls_cert, self.tls_key, self.client_ca)

    def authenticator(self, surveys: dict[str, SurveySpec]) -> DeviceAuthenticator:
        keys = {}
        if self.devices is not None:
            with DeviceRegistry(self.devices) as registry:
                keys = registry.active_keys()
        return DeviceAuthenticator(surveys, keys, window=self.auth_window)


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker needs to start its server (sent to the spawned process)."""

    config: Path
    db: Path
    address: str
    reflection: bool
    grace: float
    log_level: int
    security: WorkerSecurity
    max_inflight_reports: int
    streams: StreamLimits
    connections: ConnectionLimits
    metrics: bool = False  # record Prometheus metrics (the parent exports them)
    access_log: bool = False  # one JSON line per upload on stderr
    analyst: tuple[str, AnalystAccess, Path] | None = None  # served by the first worker


def serve_workers(
    config: Path,
    db: Path,
    host: str,
    port: int,
    workers: int,
    *,
    reflection: bool = False,
    security: WorkerSecurity | None = None,
    max_inflight_reports: int = DEFAULT_MAX_INFLIGHT_REPORTS,
    grace: float = 5.0,
    on_serving: Callable[[int, int], None] = lambda port, analyst_port: None,
    streams: StreamLimits | None = None,
    connections: ConnectionLimits | None = None,
    metrics: bool = False,
    access_log: bool = False,
    analyst: tuple[str, AnalystAccess, Path] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT with ``workers`` processes (see the module docstring).
    ``on_serving(port, analyst_port)`` runs once every worker listens. Raises WorkerError if a
    worker fails. With ``metrics``, every process records into prometheus-client's
    multiprocess directory
    (:func:`aggregator.service.collector.metrics.prepare_multiprocess`, called before this).
    ``analyst`` is (address, access, audit log) of the Analyst's listener, which the first worker
    serves (its settings are checked here first)."""
    if workers < 1:
        raise ValueError("workers must be >= 1")
    if analyst is not None:
        address, access, audit_log = analyst
        access.check(address.rpartition(":")[0].strip("[]"))
        AuditLog(audit_log).check()
    settings = WorkerSettings(
        config,
        db,
        f"{host}:{port}",  # the port is the one bound once reserved (0: a free one)
        reflection,
        grace,
        logging.getLogger().level,
        security or WorkerSecurity(),
        max_inflight_reports,
        streams or StreamLimits(),
        connections or ConnectionLimits(),
        metrics,
        access_log,
        analyst,
    )
    with StoreLock(db):
        _serve_locked(settings, host, port, workers, on_serving)


def _serve_locked(
    settings: WorkerSettings,
    host: str,
    port: int,
    workers: int,
    on_serving: Callable[[int, int], None],
) -> None:
    """:func:`serve_workers` while holding the store's lock."""
    recorder = PrometheusMetrics() if settings.metrics else NoMetrics()
    store = open_store(load_surveys(settings.config), str(settings.db), on_commit=recorder.commit)
    grace = settings.grace
    procs: list[multiprocessing.process.BaseProcess] = []
    # Caught from the start: a SIGTERM while the workers start (or right after the port is
    # announced) stops the server cleanly once they are up, instead of killing this process.
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in _STOP_SIGNALS}
    try:
        with _reserved_port(host, port) as bound:
            settings = dataclasses.replace(settings, address=f"{host}:{bound}")
            pending = [_spawn_worker(settings, i, procs) for i in range(workers)]
            ready = [_wait_until_ready(i, *pipes) for i, pipes in enumerate(pending)]
        links = [link for link, _ in ready]
        threads = [
            threading.Thread(target=serve_link, args=(store, conn), name=f"link-{i}", daemon=True)
            for i, conn in enumerate(links)
        ]
        for thread in threads:
            thread.start()
        on_serving(bound, ready[0][1])
        dead = _wait_for_stop_or_death(procs, stop)
        _stop_workers(procs, grace)
        for thread in threads:
            thread.join(timeout=grace + 10)
        if dead is not None:
            raise WorkerError(f"worker process {dead.name} exited with status {dead.exitcode}")
    finally:
        _stop_workers(procs, grace)
        store.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _spawn_worker(
    settings: WorkerSettings, index: int, procs: list[multiprocessing.process.BaseProcess]
) -> tuple[Connection, Connection]:
    """Spawn worker ``index`` (appended to ``procs``; the first serves the Analyst too); the
    parent's ends of its store pipe and of its one-way start-up status pipe."""
    ctx = multiprocessing.get_context("spawn")
    own = settings if index == 0 else dataclasses.replace(settings, analyst=None)
    store_parent, store_child = ctx.Pipe()
    status_parent, status_child = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=_worker_main,
        args=(own, store_child, status_child),
        name=f"ldp-worker-{index}",
    )
    proc.start()
    procs.append(proc)
    store_child.close()
    status_child.close()
    return store_parent, status_parent


def _wait_until_ready(index: int, store: Connection, status: Connection) -> tuple[Connection, int]:
    """Wait until worker ``index`` listens; its store pipe and its analyst port (0: none)."""
    with status:
        if not status.poll(START_TIMEOUT):
            raise WorkerError(f"worker {index} did not start within {START_TIMEOUT:.0f} s")
        try:
            state, detail = status.recv()
        except EOFError:
            raise WorkerError(f"worker {index} exited during start-up") from None
    if state != "ready":
        raise WorkerError(f"worker {index} could not start: {detail}")
    return store, detail


@contextlib.contextmanager
def _reserved_port(host: str, port: int) -> Iterator[int]:
    """Hold ``host:port`` (0: a free port) with a bound, not listening, SO_REUSEPORT socket
    while the workers bind it too; yields the port. A port another program already uses, another
    worker group's included (its sockets share the port with SO_REUSEPORT, which would let this
    group join silently), fails here with PortInUseError (:func:`ensure_port_free`)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    ensure_port_free(host, port)
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        yield sock.getsockname()[1]


def _wait_for_stop_or_death(
    procs: list[multiprocessing.process.BaseProcess], stop: threading.Event
) -> multiprocessing.process.BaseProcess | None:
    """Block until ``stop`` is set (SIGTERM/SIGINT: None) or until a worker exits (that
    worker)."""
    while not stop.is_set():
        ended = wait([proc.sentinel for proc in procs], timeout=0.2)
        if ended:
            return next(proc for proc in procs if proc.sentinel in ended)
    return None


def _stop_workers(procs: list[multiprocessing.process.BaseProcess], grace: float) -> None:
    """SIGTERM every live worker (each drains its calls), wait, kill what is left."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(timeout=grace + 10)
        if proc.is_alive():
            log.error("worker %s did not stop in time; killing it", proc.name)
            proc.kill()
            proc.join()


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _worker_main(settings: WorkerSettings, store_conn: Connection, status: Connection) -> None:
    """Entry point of a worker process."""
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s [%(processName)s] %(message)s"
    )
    asyncio.run(_worker(settings, store_conn, status))


async def _worker(settings: WorkerSettings, store_conn: Connection, status: Connection) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    store = await RemoteStore.connect(store_conn, settings.db, on_lost=stop.set)
    try:
        surveys = load_surveys(settings.config)
        security = settings.security
        auth = security.authenticator(surveys)
        if security.devices is not None:  # revocation without a restart, in every worker
            registry = RegistryWatch(security.devices, auth.replace_keys)
        running = await serve(
            surveys,
            store,
            settings.address,
            reflection=settings.reflection,
            credentials=security.credentials(),
            guard=UploadGuard({}, CapCounter(), max_inflight_reports=settings.max_inflight_reports),
            auth=auth,
            share_port=True,
            analyst=settings.analyst,
            streams=settings.streams,
            connections=settings.connections,
            observer=Observer(
                PrometheusMetrics() if settings.metrics else None,
                access_log_stream(settings.access_log),
            ),
        )
    except Exception as exc:  # reported to the parent, which stops the service
        with contextlib.suppress(OSError), status:
            status.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    try:
        with status:
            status.send(("ready", running.analyst_port))
    except OSError:  # the parent is gone
        stop.set()
    if security.devices is not None:
        running.registry = registry
        registry.start()
    await stop.wait()
    await running.stop(settings.grace)
