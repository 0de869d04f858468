"""``serve``: the gRPC aggregator, in one process or as worker processes sharing the port, with
TLS or mTLS (or an explicit --insecure), device authentication, upload limits, the Analyst on a
listener of its own (loopback by default; analyst credentials elsewhere) and, on request, a
Prometheus endpoint."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from aggregator.cli.common import (
    PROG,
    Subcommands,
    UserError,
    add_command,
    add_store_options,
    check_store_url,
    positive,
)
from aggregator.service.collector.device_auth import DEFAULT_WINDOW_SECONDS
from aggregator.service.collector.limits import DEFAULT_MAX_INFLIGHT_REPORTS
from aggregator.service.collector.registry import DeviceRegistry
from aggregator.store.sqlite.reader import StoreReader
from aggregator.survey_file.config import SurveyLimits, load_limits, load_surveys
from client.survey import SurveySpec

if TYPE_CHECKING:
    from aggregator.service.analyst.auth import AnalystAccess
    from aggregator.service.collector.streams import ConnectionLimits, StreamLimits

DEFAULT_PORT = 50051
#: Why a multi-process server does not hold a signed survey's devices to one answer per question.
ONE_ANSWER_UNCHECKED = (
    f"{PROG}: warning: with --workers above 1 the aggregator does not check one answer per "
    "device and question of surveys with device authentication (the counts live in one "
    "process; --workers 1 checks them); devices still refuse or memoize a second answer"
)

PER_NODE_LIMITS = (
    f"{PROG}: warning: with --limits-per-node, per-device limits and the one-answer check of "
    "signed surveys are counted on this node only: a device that reaches N nodes gets up to N "
    "times its cap (docs/limits.md)"
)


def add_commands(subparsers: Subcommands) -> None:
    serve = add_command(subparsers, "serve", "run the gRPC aggregator")
    add_store_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument(
        "--port", type=_tcp_port, default=DEFAULT_PORT, help="TCP port 1-65535; 0 picks a free one"
    )
    serve.add_argument("--port-file", type=Path, help="write the bound port here once serving")
    serve.add_argument(
        "--store",
        metavar="URL",
        help="a shared PostgreSQL store (postgresql://...; extra [postgres]): this process is one "
        "of several nodes serving devices and analysts from it, and --db names its own files "
        "(docs/operations.md, 'Several ingest nodes')",
    )
    serve.add_argument(
        "--limits-per-node",
        action="store_true",
        help="with --store: count per-device limits in this node's own <db>.caps, not in the "
        "shared store (a device reaching N nodes gets up to N times its cap; the store then "
        "holds no device pseudonym: docs/limits.md)",
    )
    _add_analyst_options(serve)
    serve.add_argument("--reflection", action="store_true", help="enable gRPC reflection")
    serve.add_argument(
        "--insecure", action="store_true", help="serve plaintext (development and loopback only)"
    )
    serve.add_argument("--tls-cert", type=Path, help="server certificate chain (PEM)")
    serve.add_argument("--tls-key", type=Path, help="server private key (PEM, unencrypted)")
    serve.add_argument(
        "--client-ca", type=Path, help="CA of device certificates (PEM): require mTLS"
    )
    serve.add_argument("--devices", type=Path, help="enrolled device keys (see enroll)")
    serve.add_argument(
        "--auth-window",
        type=float,
        default=DEFAULT_WINDOW_SECONDS,
        help="allowed clock difference of a device signature, seconds",
    )
    serve.add_argument(
        "--max-inflight-reports",
        type=positive,
        default=DEFAULT_MAX_INFLIGHT_REPORTS,
        help="reports waiting for the store past which uploads are shed with RESOURCE_EXHAUSTED "
        f"(default {DEFAULT_MAX_INFLIGHT_REPORTS:,}: about 0.5 s of store throughput)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="server processes sharing the port; with 2 or more, this process only writes the "
        "store (default: 1, everything in one process)",
    )
    _add_connection_limits(serve)
    serve.add_argument(
        "--metrics-port",
        type=_tcp_port,
        help="serve Prometheus metrics on this port (extra [metrics]; default: off)",
    )
    serve.add_argument(
        "--metrics-host", default="127.0.0.1", help="address of the metrics endpoint"
    )
    serve.add_argument(
        "--access-log", action="store_true", help="one JSON line per upload on stderr"
    )
    serve.set_defaults(run=run_serve)


def _add_analyst_options(serve: argparse.ArgumentParser) -> None:
    """The Analyst's own listener, its credentials and its audit log (docs/operations.md)."""
    serve.add_argument(
        "--analyst-host",
        default="127.0.0.1",
        help="address of the Analyst listener; anything but loopback needs --analyst-client-ca "
        "or --analyst-tokens",
    )
    serve.add_argument(
        "--analyst-port",
        type=_tcp_port,
        help=f"port of the Analyst listener (default: --port + 1, {DEFAULT_PORT + 1}; 0 with "
        "--port 0: a free one)",
    )
    serve.add_argument(
        "--analyst-port-file", type=Path, help="write the bound analyst port here once serving"
    )
    serve.add_argument(
        "--analyst-client-ca",
        type=Path,
        help="CA of analyst certificates (PEM, not the device CA): require analyst mTLS",
    )
    serve.add_argument(
        "--analyst-tokens",
        type=Path,
        help="hashed analyst tokens (see analyst-token add): require 'authorization: Bearer'",
    )
    serve.add_argument(
        "--audit-log",
        type=Path,
        help="append-only log of state-changing analyst calls (default: <db>.audit.jsonl)",
    )


def _tcp_port(text: str) -> int:
    """argparse type: a TCP port, or 0 for a free one."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port from 1 to 65535 (or 0), got {text!r}")
    return value


def _add_connection_limits(serve: argparse.ArgumentParser) -> None:
    """The per-stream and per-connection limits (docs/limits.md); defaults from their classes."""
    from aggregator.service.collector.streams import ConnectionLimits, StreamLimits

    streams, connections = StreamLimits(), ConnectionLimits()
    flags: list[tuple[str, Callable[[str], float], float, str]] = [
        ("--max-stream-messages", positive, streams.max_messages, "messages per upload stream"),
        ("--max-stream-reports", positive, streams.max_reports, "reports per upload stream"),
        ("--max-stream-bytes", positive, streams.max_bytes, "bytes per upload stream"),
        ("--max-stream-seconds", float, streams.max_seconds, "seconds an upload stream may last"),
        (
            "--max-concurrent-streams",
            positive,
            connections.max_concurrent_streams,
            "concurrent calls per HTTP/2 connection",
        ),
        (
            "--max-connection-idle",
            float,
            connections.max_connection_idle_seconds,
            "seconds a connection without calls is kept",
        ),
        (
            "--max-connection-age",
            float,
            connections.max_connection_age_seconds,
            "seconds after which a connection is asked to reconnect",
        ),
    ]
    for flag, kind, default, what in flags:
        serve.add_argument(flag, type=kind, default=default, help=f"{what} (default {default:g})")


def _limits_of(args: argparse.Namespace) -> tuple[StreamLimits, ConnectionLimits]:
    """The StreamLimits and ConnectionLimits of the serve flags (ValueError if not positive)."""
    from aggregator.service.collector.streams import ConnectionLimits, StreamLimits

    streams = StreamLimits(
        max_messages=args.max_stream_messages,
        max_reports=args.max_stream_reports,
        max_bytes=args.max_stream_bytes,
        max_seconds=args.max_stream_seconds,
    )
    connections = ConnectionLimits(
        max_concurrent_streams=args.max_concurrent_streams,
        max_connection_idle_seconds=args.max_connection_idle,
        max_connection_age_seconds=args.max_connection_age,
    )
    return streams, connections


def run_serve(args: argparse.Namespace) -> int:
    credentials = _server_credentials(args)
    folder = args.db.absolute().parent
    if not folder.is_dir():  # before the audit log beside it is checked: say the real mistake
        raise UserError(f"cannot create report store {args.db}: folder {folder} does not exist")
    if args.store is not None:
        _check_shared_store(args)
    elif args.limits_per_node:
        raise UserError("--limits-per-node goes with --store (a single server counts per node)")
    args.analyst = _analyst_listener(args)
    if args.workers < 1:
        raise UserError("--workers must be at least 1")
    surveys = load_surveys(args.config)
    keys: dict[str, Ed25519PublicKey] = {}
    if args.devices is not None:
        with DeviceRegistry(args.devices, read_only=True) as registry:
            keys = registry.active_keys()
    elif any(s.require_device_auth for s in surveys.values()):
        raise UserError("a survey requires device authentication: pass --devices REGISTRY")
    if args.auth_window <= 0:
        raise UserError("--auth-window must be positive")
    limits = load_limits(args.config)
    args.streams, args.connections = _limits_of(args)
    if args.workers > 1 and any(limit.declared for limit in limits.values()):
        raise UserError(
            "per-device limits (rate_per_minute, burst, max_reports_per_device) keep their state "
            "in one process: serve them with --workers 1"
        )
    if args.workers > 1 and limits:  # only the one-answer rule of signed surveys
        print(ONE_ANSWER_UNCHECKED, file=sys.stderr, flush=True)
    if args.limits_per_node and limits:
        print(PER_NODE_LIMITS, file=sys.stderr, flush=True)
    if args.store is None and args.db.is_file() and args.db.stat().st_size:  # before binding
        with StoreReader(args.db) as reader:
            reader.check_definitions(surveys, args.config)
    with _metrics_endpoint(args):
        return _run_server(args, surveys, limits, credentials, keys)


@contextlib.contextmanager
def _metrics_endpoint(args: argparse.Namespace) -> Iterator[None]:
    """With --metrics-port: the Prometheus endpoint for the life of the server (and, with
    --workers, the multiprocess directory every process records into, removed afterwards)."""
    if args.metrics_port is None:
        yield
        return
    from aggregator.service.collector import metrics

    folder = metrics.prepare_multiprocess() if args.workers > 1 else None
    try:
        port = metrics.start_exporter(args.metrics_host, args.metrics_port)
        print(f"{PROG}: metrics on http://{args.metrics_host}:{port}/metrics", flush=True)
        yield
    except metrics.MetricsUnavailableError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(
            f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {exc.strerror}"
        ) from None
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _run_server(
    args: argparse.Namespace,
    surveys: dict[str, SurveySpec],
    limits: dict[str, SurveyLimits],
    credentials: grpc.ServerCredentials | None,
    keys: dict[str, Ed25519PublicKey],
) -> int:
    """Serve until SIGINT or SIGTERM: in this process, or with --workers as worker processes."""
    if args.workers == 1:
        try:
            asyncio.run(_serve(surveys, limits, args, credentials, keys))
        except RuntimeError as exc:
            if "bind" not in str(exc).lower():
                raise
            raise UserError(
                f"cannot listen on {args.host}:{args.port}: the port is in use or the address "
                "is not available here"
            ) from None
        return 0
    from aggregator.service.server.workers import WorkerSecurity, serve_workers

    def serving(port: int, analyst_port: int) -> None:
        what = f"{len(surveys)} survey(s) with {args.workers} worker processes"
        _announce(args, port, analyst_port, what)

    serve_workers(
        args.config,
        args.db,
        args.host,
        args.port,
        args.workers,
        reflection=args.reflection,
        security=WorkerSecurity(
            args.tls_cert, args.tls_key, args.client_ca, args.devices, args.auth_window
        ),
        max_inflight_reports=args.max_inflight_reports,
        streams=args.streams,
        connections=args.connections,
        on_serving=serving,
        metrics=args.metrics_port is not None,
        access_log=args.access_log,
        analyst=args.analyst,
    )
    print(f"{PROG}: stopped", flush=True)
    return 0


def _check_shared_store(args: argparse.Namespace) -> None:
    """--store: a PostgreSQL URL, one process per node, and the [postgres] extra installed."""
    check_store_url(args.store)
    if args.workers != 1:
        raise UserError("--store runs one process per node: start more nodes, not --workers")


def _announce(args: argparse.Namespace, port: int, analyst_port: int, what: str) -> None:
    """Write the port files (if asked) and say what is served where."""
    if args.analyst_port_file:
        args.analyst_port_file.write_text(f"{analyst_port}\n")
    if args.port_file:
        args.port_file.write_text(f"{port}\n")
    print(f"{PROG}: serving the Analyst on {args.analyst_host}:{analyst_port}", flush=True)
    print(f"{PROG}: serving {what} on {args.host}:{port}", flush=True)


def _analyst_listener(args: argparse.Namespace) -> tuple[str, AnalystAccess, Path]:
    """(address, access, audit log) of the Analyst's listener, checked: a non-loopback address
    without analyst credentials, tokens in plaintext off loopback, or an audit log that cannot
    be written are one-line errors before anything is bound."""
    from aggregator.service.analyst.audit import AuditLog, AuditLogError, default_path
    from aggregator.service.analyst.auth import AnalystAccess, AnalystAccessError

    if args.analyst_port is None:
        args.analyst_port = args.port + 1 if args.port else 0
    if args.port and args.analyst_port == args.port and args.analyst_host == args.host:
        raise UserError("--analyst-port must differ from --port: the Analyst has its own listener")
    access = AnalystAccess(
        tls_cert=None if args.insecure else args.tls_cert,
        tls_key=None if args.insecure else args.tls_key,
        client_ca=args.analyst_client_ca,
        device_ca=args.client_ca,
        tokens=args.analyst_tokens,
    )
    audit_log = args.audit_log or default_path(args.db)
    try:
        access.check(args.analyst_host)
        access.gate()  # the CA and token files are readable
        AuditLog(audit_log).check()
    except (AnalystAccessError, AuditLogError) as exc:
        raise UserError(str(exc)) from None
    return f"{args.analyst_host}:{args.analyst_port}", access, audit_log


def _analyst_arguments(analyst: tuple[str, AnalystAccess, Path]) -> dict:
    """start_server's Analyst arguments."""
    address, access, audit_log = analyst
    return {"analyst_address": address, "analyst_access": access, "audit_log": audit_log}


def _server_credentials(args: argparse.Namespace) -> grpc.ServerCredentials | None:
    """TLS/mTLS credentials from the flags, or None for an explicit --insecure."""
    tls_flags = [args.tls_cert, args.tls_key, args.client_ca]
    if args.insecure:
        if any(tls_flags):
            raise UserError("--insecure cannot be combined with --tls-cert/--tls-key/--client-ca")
        return None
    if args.tls_cert is None and args.tls_key is None:
        raise UserError(
            "no transport security configured: pass --tls-cert and --tls-key (and --client-ca "
            "for mTLS), or --insecure for plaintext"
        )
    if args.tls_cert is None or args.tls_key is None:
        raise UserError("--tls-cert and --tls-key go together")
    from aggregator.service.server.tls import server_credentials

    return server_credentials(args.tls_cert, args.tls_key, args.client_ca)


async def _serve(
    surveys: dict[str, SurveySpec],
    limits: dict[str, SurveyLimits],
    args: argparse.Namespace,
    credentials: grpc.ServerCredentials | None,
    keys: dict[str, Ed25519PublicKey],
) -> None:
    """Serve in this process until SIGINT or SIGTERM, then drain for up to 5 seconds."""
    from aggregator.service.collector.metrics import PrometheusMetrics
    from aggregator.service.collector.observe import Observer, access_log_stream
    from aggregator.service.server.app import start_server

    recorder = PrometheusMetrics() if args.metrics_port is not None else None
    # Caught from the start: a SIGTERM while the server starts (or right after it is
    # announced) drains it once up, instead of killing the process.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    running = await start_server(
        surveys,
        str(args.db),
        f"{args.host}:{args.port}",
        reflection=args.reflection,
        credentials=credentials,
        device_keys=keys,
        auth_window=args.auth_window,
        limits=limits,
        max_inflight_reports=args.max_inflight_reports,
        devices=args.devices,
        streams=args.streams,
        connections=args.connections,
        observer=Observer(recorder, access_log_stream(args.access_log)),
        **_analyst_arguments(args.analyst),
        store_url=args.store,
        per_node_limits=args.limits_per_node,
    )
    _announce(args, running.port, running.analyst_port, f"{len(surveys)} survey(s)")
    await stop.wait()
    print(f"{PROG}: draining and shutting down", flush=True)
    await running.stop(grace=5.0)
