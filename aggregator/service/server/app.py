"""The aggregator's gRPC server (grpc.aio) from start to stop: it opens the store (one server per
store), serves the Collector and the standard health service on the device listener and the
Analyst (behind its gate and audit log, aggregator/service/analyst/auth.py and audit.py) on a
listener of its own, turns health NOT_SERVING when the store stops making reports durable, and
drains before it closes. The Analyst is never served on the device listener.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from aggregator.service.analyst.audit import AuditInterceptor, AuditLog, default_path
from aggregator.service.analyst.auth import AnalystAccess
from aggregator.service.analyst.execution import AnalysisExecutor
from aggregator.service.analyst.servicer import Analyst
from aggregator.service.collector.cap_file import CapFile, CapPersistence
from aggregator.service.collector.device_auth import DEFAULT_WINDOW_SECONDS, DeviceAuthenticator
from aggregator.service.collector.limits import (
    DEFAULT_MAX_INFLIGHT_REPORTS,
    CapCounter,
    KeyPseudonyms,
    SharedLimits,
    UploadGuard,
)
from aggregator.service.collector.observe import Observer
from aggregator.service.collector.registry import DeviceRegistry, RegistryWatch
from aggregator.service.collector.servicer import Collector
from aggregator.service.collector.streams import ConnectionLimits, StreamLimits
from aggregator.service.server.handlers import (
    SERVICE_NAMES,
    add_analyst_to_server,
    add_collector_to_server,
)
from aggregator.service.server.ports import ensure_port_free
from aggregator.store.contract import Store
from aggregator.store.errors import StoreError, StoreFailedError
from aggregator.store.sqlite import pins as sqlite_pins
from aggregator.store.sqlite.file_kind import create_private
from aggregator.store.sqlite.lock import StoreLock
from aggregator.store.sqlite.report_store import ReportStore
from aggregator.survey_file.config import SurveyLimits
from client.device.transport import MAX_MESSAGE_BYTES
from client.survey import SurveySpec

if TYPE_CHECKING:
    from aggregator.store.postgres.engine import PostgresStore

log = logging.getLogger(__name__)

#: What every node of a shared store hashes to show it has the other nodes' limits secret.
SECRET_CHECK = "ldp-survey: nodes sharing per-device limits"
#: How often an idle server checks that its store can still make reports durable.
STORE_PROBE_SECONDS = 1.0


@dataclass
class AnalystServer:
    """The Analyst's own listener: its server, port, health, executor and audit log."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    analysis: AnalysisExecutor  # the Analyst's threads and worker processes
    audit: AuditLog
    warming: asyncio.Future[bool]  # the worker processes importing SciPy (AnalysisExecutor.warm)

    async def warmed(self) -> None:
        """Wait until the analysis worker processes have imported SciPy (at most
        WARM_UP_SECONDS), then report the Analyst SERVING: ready means a first test is
        answered at once."""
        if not await self.warming:
            log.warning("the analysis worker is still starting; the first test will wait for it")
        for name in ("", SERVICE_NAMES[1]):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        await asyncio.to_thread(self.analysis.close)
        await asyncio.to_thread(self.audit.close)


@dataclass
class RunningServer:
    """A started aggregator: its device port, its analyst port (0: no analyst listener in this
    process), and how to stop it gracefully."""

    server: grpc.aio.Server
    port: int
    store: Store
    health: health.aio.HealthServicer
    lock: StoreLock | None = None
    caps: CapPersistence | None = None
    registry: RegistryWatch | None = None
    watchdog: asyncio.Task | None = None
    analyst: AnalystServer | None = None

    @property
    def analyst_port(self) -> int:
        return 0 if self.analyst is None else self.analyst.port

    @property
    def analysis(self) -> AnalysisExecutor | None:
        return None if self.analyst is None else self.analyst.analysis

    async def stop(self, grace: float = 5.0) -> None:
        """Report NOT_SERVING, drain in-flight calls on both listeners for up to ``grace``
        seconds, close the store (which commits everything already queued), release the
        store's lock."""
        await self.health.enter_graceful_shutdown()
        stopping = [self.server.stop(grace)]
        if self.analyst is not None:
            stopping.append(self.analyst.stop(grace))
        await asyncio.gather(*stopping)
        if self.watchdog is not None:
            self.watchdog.cancel()
            await asyncio.gather(self.watchdog, return_exceptions=True)
        if self.registry is not None:
            await self.registry.close()
        if self.caps is not None:
            await self.caps.close()
        await asyncio.to_thread(self.store.close)
        if self.lock is not None:
            self.lock.release()


def open_store(
    surveys: dict[str, SurveySpec],
    db_path: str,
    *,
    max_delay: float = 0.002,
    on_commit: Callable[[float, int], None] | None = None,
) -> ReportStore:
    """Open the report store (its files private to their owner: 0600), check every question of
    the surveys against its pinned definition (aggregator/store/definitions.py) and register it."""
    create_private(db_path)
    for suffix in ("-wal", "-shm"):
        if os.path.exists(db_path + suffix):
            create_private(db_path + suffix)
    store = ReportStore(db_path, max_delay=max_delay, on_commit=on_commit)
    try:
        sqlite_pins.register(store, surveys)
    except BaseException:
        store.close()
        raise
    return store


def open_shared_store(
    surveys: dict[str, SurveySpec],
    url: str,
    *,
    max_delay: float = 0.002,
    on_commit: Callable[[float, int], None] | None = None,
) -> PostgresStore:
    """Open the shared PostgreSQL store at ``url`` (extra [postgres]), check every question of
    the surveys against its pinned definition and register it: one ingest node of several."""
    from aggregator.store.postgres import pins
    from aggregator.store.postgres.engine import PostgresStore

    store = PostgresStore(url, max_delay=max_delay, on_commit=on_commit)
    try:
        pins.register(store, surveys)
    except BaseException:
        store.close()
        raise
    return store


async def start_server(
    surveys: dict[str, SurveySpec],
    db_path: str,
    address: str = "127.0.0.1:0",
    *,
    reflection: bool = False,
    credentials: grpc.ServerCredentials | None = None,
    max_delay: float = 0.002,
    device_keys: Mapping[str, Ed25519PublicKey] | None = None,
    auth_window: float = DEFAULT_WINDOW_SECONDS,
    limits: Mapping[str, SurveyLimits] | None = None,
    max_inflight_reports: int = DEFAULT_MAX_INFLIGHT_REPORTS,
    streams: StreamLimits | None = None,
    connections: ConnectionLimits | None = None,
    observer: Observer | None = None,
    devices: str | os.PathLike[str] | None = None,
    analyst_address: str = "127.0.0.1:0",
    analyst_access: AnalystAccess | None = None,
    audit_log: str | os.PathLike[str] | None = None,
    store_url: str | None = None,
    per_node_limits: bool = False,
) -> RunningServer:
    """Open the store, register every question, and start serving devices on ``address`` and
    analysts on ``analyst_address``.

    ``store_url`` (postgresql://...) makes this server one node of several on a shared
    PostgreSQL store: its Collector and Analyst serve the shared reports and analysis state,
    its per-device limits are counted in the store (every node must share ``db_path``'s limits
    secret), or with ``per_node_limits`` in the node's own ``<db>.caps`` as on SQLite, and
    ``db_path`` names the node's own files (its lock, limits secret and audit log), as
    docs/operations.md says.

    ``credentials`` (see ``aggregator.service.server.tls.server_credentials``) switch on TLS or
    mTLS;
    ``device_keys`` are the enrolled Ed25519 keys that signed uploads are verified with, and
    ``auth_window`` the allowed clock difference of a signature in seconds. ``limits`` are the
    surveys' per-device limits (their counts persist in ``<db>.caps``, under keyed hashes);
    ``max_inflight_reports`` bounds the reports waiting for the store, past which uploads are
    shed (RESOURCE_EXHAUSTED with a retry hint). ``streams`` and ``connections`` bound each
    client stream and each HTTP/2 connection (defaults: :mod:`.streams`, docs/limits.md).
    ``observer`` records uploads and commits (metrics, access log; default: nothing).
    ``devices`` is the device registry file: its keys replace ``device_keys``, and are reloaded
    when it changes (revocation without a restart). ``analyst_access`` are the analyst
    listener's TLS files and credentials (default: plaintext, loopback callers only);
    ``audit_log`` is where state-changing Analyst calls are recorded (default
    ``<db>.audit.jsonl``).
    """
    observer = observer or Observer()
    lock = StoreLock(db_path)  # before anything is opened: one server per store
    try:
        caps: CapFile | None = None
        shared_store: PostgresStore | None = None
        store: Store
        if store_url is not None:
            store = shared_store = open_shared_store(
                surveys, store_url, max_delay=max_delay, on_commit=observer.recorder.commit
            )
            if per_node_limits:
                caps = CapFile.beside(db_path)
        else:
            caps = CapFile.beside(db_path)
            caps.adopt_legacy(db_path)
            store = open_store(
                surveys, db_path, max_delay=max_delay, on_commit=observer.recorder.commit
            )
    except BaseException:
        lock.release()
        raise
    try:
        pseudonym = KeyPseudonyms.beside(db_path)
        shared = None
        if shared_store is not None and limits and not per_node_limits:
            shared = shared_limits(shared_store, pseudonym)
        guard = UploadGuard(
            limits or {},
            CapCounter(caps.load() if caps is not None else {}),
            max_inflight_reports=max_inflight_reports,
            shared=shared,
        )
        registry = None
        if devices is not None:
            with DeviceRegistry(devices) as opened:
                device_keys = opened.active_keys()
        auth = DeviceAuthenticator(surveys, device_keys or {}, window=auth_window)
        if devices is not None:
            registry = RegistryWatch(devices, auth.replace_keys)
        running = await serve(
            surveys,
            store,
            address,
            guard=guard,
            reflection=reflection,
            credentials=credentials,
            auth=auth,
            observer=observer,
            pseudonym=pseudonym,
            streams=streams,
            connections=connections,
            analyst=(
                analyst_address,
                analyst_access or AnalystAccess(),
                Path(audit_log) if audit_log is not None else default_path(db_path),
            ),
        )
    except BaseException:
        store.close()
        lock.release()
        raise
    running.lock = lock
    if registry is not None:
        running.registry = registry
        registry.start()
    if caps is not None:
        running.caps = CapPersistence(caps, guard.changed_counts, guard.keep_changed)
        running.caps.start()
    return running


def shared_limits(store: PostgresStore, pseudonym: KeyPseudonyms) -> SharedLimits:
    """The per-device counts of a shared PostgreSQL store, after checking this node hashes
    devices with the same secret as the other nodes."""
    from aggregator.store.postgres.device_limits import SharedDeviceLimits

    shared = SharedDeviceLimits(store)
    shared.check_secret(pseudonym(SECRET_CHECK))
    return shared


async def serve(
    surveys: dict[str, SurveySpec],
    store: Store,
    address: str,
    *,
    reflection: bool = False,
    credentials: grpc.ServerCredentials | None = None,
    guard: UploadGuard | None = None,
    auth: DeviceAuthenticator | None = None,
    pseudonym: Callable[[str], str] | None = None,
    share_port: bool = False,
    observer: Observer | None = None,
    streams: StreamLimits | None = None,
    connections: ConnectionLimits | None = None,
    analyst: tuple[str, AnalystAccess, Path] | None = None,
) -> RunningServer:
    """Start serving on ``address`` from an open store (see :func:`start_server` for the
    security and limit arguments; ``guard`` defaults to load shedding only). ``share_port`` lets
    several processes listen on one port (SO_REUSEPORT; the kernel spreads connections over
    them); otherwise it is off, so a second server on a busy port fails instead of silently
    taking half its traffic. ``analyst`` is (address, access, audit log) of the Analyst's
    listener (:func:`serve_analyst`); None serves no Analyst in this process. It returns once
    the Analyst's worker processes have imported SciPy (the device listener already serves
    meanwhile), so whoever announces the server announces one ready for its first test."""
    guard = guard or UploadGuard({}, CapCounter())
    connections = connections or ConnectionLimits()
    server = grpc.aio.server(
        options=[
            # The largest message of any RPC: an Upload of MAX_REPORTS_PER_REQUEST reports fits
            # with room to spare; the smaller RPCs have their own bounds in their handlers.
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", int(share_port)),
            *connections.options(),
        ]
    )
    health_servicer = health.aio.HealthServicer()
    loop = asyncio.get_running_loop()

    turning: list[asyncio.Task] = []  # the tasks that turn health NOT_SERVING
    analyst_server: AnalystServer | None = None

    def store_failed(reason: str) -> None:
        if not turning:
            log.error("the report store stopped acknowledging: %s", reason)
            turning.append(loop.create_task(health_servicer.enter_graceful_shutdown()))
            if analyst_server is not None:
                turning.append(loop.create_task(analyst_server.health.enter_graceful_shutdown()))

    collector = Collector(surveys, store, guard, auth, pseudonym, store_failed, observer)
    add_collector_to_server(collector, server, streams)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if reflection:
        from grpc_reflection.v1alpha import reflection as grpc_reflection

        names = (SERVICE_NAMES[0], grpc_reflection.SERVICE_NAME, health.SERVICE_NAME)
        grpc_reflection.enable_server_reflection(names, server)
    if analyst is not None:  # first: a refused analyst listener leaves nothing bound
        analyst_server = await serve_analyst(surveys, store, *analyst, connections=connections)
    try:
        port = _bind(server, address, credentials, share_port)
        await server.start()
    except BaseException:
        if analyst_server is not None:
            await analyst_server.stop(0)
        raise
    for name in ("", SERVICE_NAMES[0]):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    # The store's probe watches from the moment uploads are taken, not from the end of warm-up.
    watchdog = loop.create_task(_probe_store(store, store_failed))
    if analyst_server is not None:  # announced once ready to answer a test at once
        await analyst_server.warmed()
    log.info("aggregator listening on port %d", port)
    running = RunningServer(server, port, store, health_servicer, analyst=analyst_server)
    running.watchdog = watchdog
    return running


async def serve_analyst(
    surveys: dict[str, SurveySpec],
    store: Store,
    address: str,
    access: AnalystAccess,
    audit_log: Path,
    *,
    connections: ConnectionLimits | None = None,
) -> AnalystServer:
    """Serve the Analyst (and health) on ``address``, behind the gate of ``access``, recording
    state-changing calls in ``audit_log``, with the device listener's per-connection limits.
    Its health turns SERVING once its worker processes are warm (AnalystServer.warmed). Raises
    AnalystAccessError for settings that would expose it, AuditLogError for a log that cannot
    be written."""
    host, _, _ = address.rpartition(":")
    access.check(host.strip("[]"))
    audit = AuditLog(audit_log)
    audit.check()
    gate = access.gate()
    server = grpc.aio.server(
        # The gate runs first and sets the caller's identity the audit log then records.
        interceptors=[gate, AuditInterceptor(audit)],
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
            *(connections or ConnectionLimits()).options(),
        ],
    )
    analyst = Analyst(surveys, store.analysis())
    # While the listeners start: the worker processes import SciPy (AnalystServer.warmed).
    warming = asyncio.ensure_future(asyncio.to_thread(analyst.executor.warm))
    add_analyst_to_server(analyst, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        port = _bind(server, address, access.credentials(), False)
        await server.start()
    except BaseException:
        await asyncio.to_thread(analyst.executor.close)
        audit.close()
        raise
    log.info("analyst listening on port %d", port)
    return AnalystServer(server, port, health_servicer, analyst.executor, audit, warming)


def _bind(
    server: grpc.aio.Server,
    address: str,
    credentials: grpc.ServerCredentials | None,
    share_port: bool,
) -> int:
    """Add ``address`` to ``server``; the bound port (OSError if it cannot be bound)."""
    host, _, port_text = address.rpartition(":")
    if not share_port and port_text.isdigit():
        ensure_port_free(host.strip("[]"), int(port_text))
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    if port == 0:
        raise OSError(f"cannot bind {address}")
    return port


async def _probe_store(store: Store, failed: Callable[[str], None]) -> None:
    """Every STORE_PROBE_SECONDS, an empty submit: its (empty) commit runs the store's file
    checks, so a WAL deleted while no upload comes in turns health NOT_SERVING too (and what
    was committed is rescued into the database file right away). With ``--workers`` every
    worker probes through its link, so every worker turns NOT_SERVING."""
    while True:
        await asyncio.sleep(STORE_PROBE_SECONDS)
        try:
            await asyncio.wrap_future(store.submit_batches([]))
        except StoreFailedError as exc:
            failed(str(exc))
            return
        except StoreError:  # closed: the server is stopping
            return
