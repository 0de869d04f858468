"""``ldp-aggregator``: serve, estimate, test, export, import, rebuild, job (Beam); enroll, revoke
and list device keys; check-config, cost and export-survey for the survey file; report, plan,
backup and restore; two-sample.

User mistakes end with a one-line message on stderr (a JSON object with ``--json``) and a
non-zero exit status (2: bad input, 3: not enough reports to release), never a traceback. Every
command that reads the store checks the survey file against the question definitions pinned in
it (aggregator/store/definitions.py); the read-only ones (estimate, test, export) open the file
read-only and never create or change it.
"""

from __future__ import annotations

import os
import sys

# gRPC's C core reads GRPC_VERBOSITY once, when grpc is first imported: its own log lines stay
# off a CLI user's terminal (our errors say it in one line) unless asked for (debug, or
# GRPC_VERBOSITY set in the environment).
if "debug" not in sys.argv:
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import argparse
import asyncio
import contextlib
import json
import logging
import math
import shutil
import signal
from collections.abc import Sequence
from pathlib import Path

import grpc
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from aggregator.errors import InsufficientDataError, LdpError
from aggregator.presentation.numbers import share
from aggregator.service.auth import DEFAULT_WINDOW_SECONDS
from aggregator.service.devices import DeviceRegistry
from aggregator.service.limits import DEFAULT_MAX_INFLIGHT_REPORTS
from aggregator.store import confirmations, definitions, ingest, shards
from aggregator.store.ingest import ReportRejectedError
from aggregator.store.reader import StoreReader
from aggregator.store.report_store import CONFLICT, STORED, ReportStore, StoreError
from aggregator.survey_file.analyses import EXPLORATORY, check_independent, load_analyses
from aggregator.survey_file.config import ConfigError, load_limits, load_surveys
from aggregator.survey_file.null_text import NullTextError, parse_null
from client import __version__
from client.budgeting import DEFAULT_DELTA, survey_cost
from client.cli_parsing import DefaultsFormatter, OneLineParser, reader_went_away
from client.progress import bar
from client.survey import SurveyError, SurveySpec, survey_to_json
from protos.ldp.v1 import ldp_pb2

PROG = "ldp-aggregator"
#: Files the service keeps beside the store, which a backup carries: the key of the limit
#: pseudonyms (service/limits.py) and the per-device cap counts (service/cap_file.py).
SIDECAR_SUFFIXES = (".limits-secret", ".caps")
DEFAULT_PORT = 50051
METHOD_HELP = (  # tests/test_labels_and_cost.py holds it against the statistics' method tables
    "test method; default: the first one of the question's mechanism (t1, t2 are the "
    "large-domain U-statistics of docs/calibration.md). gof: "
    "randomized_response: pearson, t2; flip_components: projected, nonprojected, t1; gaussian: "
    "projected, nonprojected, imhof; laplace: monte-carlo; optimized_unary: pearson, t1; "
    "hadamard_response, subset_selection, local_hashing: pearson, t2; public_coin_bit: t3. "
    "independence: "
    "randomized_response: "
    "min-chi-square; flip_components, gaussian: projected, nonprojected; laplace: bootstrap; "
    "optimized_unary, hadamard_response, subset_selection, local_hashing: bootstrap"
)


SIDES = {"exploration": ldp_pb2.EXPLORATION, "confirmation": ldp_pb2.CONFIRMATION}


class UserError(Exception):
    """A mistake in the command line or its inputs; ``status`` is the exit code."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.run is not run_job:  # only the Beam job passes options through
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.beam_args = [_beam_option(arg) for arg in extra]
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s"
    )
    try:
        return args.run(args)
    except BrokenPipeError:
        return reader_went_away()
    except UserError as exc:
        return _fail(args, str(exc), exc.status)
    except (ConfigError, StoreError, LdpError, ValueError, OSError) as exc:  # incl. shard errors
        return _fail(args, str(exc), 2)
    except KeyboardInterrupt:
        return 130


def _fail(args: argparse.Namespace, message: str, status: int) -> int:
    """One line on stderr (a JSON object with --json); the exit status."""
    message = " ".join(message.split())
    if getattr(args, "json", False):
        print(json.dumps({"error": message, "status": status}), file=sys.stderr)
    else:
        print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def _command(sub, name: str, text: str, **kwargs) -> argparse.ArgumentParser:
    return sub.add_parser(
        name, help=text, description=text, formatter_class=DefaultsFormatter, **kwargs
    )


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG, description="LDP survey aggregator", formatter_class=DefaultsFormatter
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning"],
        help="log level (debug also lets gRPC's own log lines through)",
    )
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = _command(sub, "serve", "run the gRPC aggregator")
    _common(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help="TCP port 1-65535; 0 picks a free one"
    )
    serve.add_argument("--port-file", type=Path, help="write the bound port here once serving")
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
        type=_positive,
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
    _connection_limits(serve)
    serve.add_argument(
        "--metrics-port",
        type=_port,
        help="serve Prometheus metrics on this port (extra [metrics]; default: off)",
    )
    serve.add_argument(
        "--metrics-host", default="127.0.0.1", help="address of the metrics endpoint"
    )
    serve.add_argument(
        "--access-log", action="store_true", help="one JSON line per upload on stderr"
    )
    serve.set_defaults(run=run_serve)

    enroll = _command(sub, "enroll", "enroll a device's Ed25519 public key")
    _devices(enroll)
    enroll.add_argument("--public-key", type=Path, required=True, help="device public key PEM")
    enroll.add_argument("--device-id", help="the id the device printed (checked against the key)")
    enroll.set_defaults(run=run_enroll)

    revoke = _command(sub, "revoke", "revoke a device key for good")
    _devices(revoke)
    revoke.add_argument("--device-id", required=True, help="the device's id (see devices)")
    revoke.set_defaults(run=run_revoke)

    listing = _command(sub, "devices", "list enrolled and revoked devices")
    _devices(listing)
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(run=run_devices)

    est = _command(sub, "estimate", "unbiased frequencies with confidence intervals (read only)")
    _common(est)
    _question(est)
    _side(est)
    _group(est)
    est.add_argument("--confidence", type=float, default=0.95, help="confidence level")
    est.add_argument(
        "--simultaneous", action="store_true", help="also intervals covering all categories at once"
    )
    _json(est)
    est.set_defaults(run=run_estimate)

    test = _command(sub, "test", "goodness of fit or independence test (read only)")
    _common(test)
    _question(test)
    test.add_argument("kind", choices=["gof", "independence"], help="which test")
    _side(test)
    _group(test)
    test.add_argument(
        "--p0",
        help="gof only: the null distribution: 'uniform', one probability per category in the "
        "question's order (comma-separated), or @FILE with 'label,probability' lines (or one "
        "probability per line); summing to 1 within 1e-9",
    )
    test.add_argument("--alpha", type=float, default=0.05, help="significance level")
    test.add_argument("--method", help=METHOD_HELP)
    test.add_argument("--seed", type=int, help="seed for Monte Carlo and bootstrap tests")
    test.add_argument(
        "--calibration",
        choices=["auto", "asymptotic", "monte-carlo"],
        default="auto",
        help="null distribution of the p-value (auto: simulated where the chi-square limit is "
        "not accurate)",
    )
    _json(test)
    test.set_defaults(run=run_test)

    export = _command(sub, "export", "write a survey's reports as shard files (store read only)")
    _common(export)
    export.add_argument("--survey", required=True, help="survey id")
    export.add_argument("--out", type=Path, required=True, help="output directory")
    export.add_argument("--shards", type=_positive, default=4, help="number of shard files")
    export.add_argument(
        "--force", action="store_true", help="write into a non-empty output directory"
    )
    _side(export)
    export.set_defaults(run=run_export)

    imp = _command(sub, "import", "read shard files into the report store")
    _common(imp)
    imp.add_argument("--from", dest="source", type=Path, required=True, help="shard directory")
    imp.set_defaults(run=run_import)

    rebuild = _command(sub, "rebuild", "recompute statistics from the report log")
    _common(rebuild)
    _json(rebuild)
    rebuild.set_defaults(run=run_rebuild)

    check = _command(sub, "check-config", "validate a survey file and show what it defines")
    check.add_argument("config", type=Path, help="survey definitions (TOML, docs/config.md)")
    check.add_argument(
        "--db", type=Path, help="also check it against the definitions pinned in this store"
    )
    _json(check)
    check.set_defaults(run=run_check_config)

    cost = _command(sub, "cost", "what one device spends on a survey, and the budget flags")
    cost.add_argument("--config", type=Path, required=True, help="survey definitions (TOML)")
    cost.add_argument("--survey", help="one survey (default: every survey in the file)")
    cost.add_argument(
        "--delta", type=float, default=DEFAULT_DELTA, help="delta of the device budget"
    )
    _json(cost)
    cost.set_defaults(run=run_cost)

    export_survey = _command(
        sub, "export-survey", "write a survey definition file for ldp-client install-survey"
    )
    export_survey.add_argument(
        "--config", type=Path, required=True, help="survey definitions (TOML)"
    )
    export_survey.add_argument("--survey", required=True, help="survey id")
    export_survey.add_argument("--out", type=Path, help="output file (default: stdout)")
    export_survey.set_defaults(run=run_export_survey)

    job = _command(
        sub,
        "job",
        "aggregate shard files with Apache Beam (extra [beam])",
        allow_abbrev=False,
        epilog="Other options go to Beam's PipelineOptions, e.g. --direct-num-workers 2 "
        "--direct-running-mode multi_processing, or a runner's own options.",
    )
    job.add_argument(
        "--surveys",
        "--config",
        dest="config",
        type=Path,
        required=True,
        help="survey definitions (TOML)",
    )
    job.add_argument(
        "--shards", nargs="+", required=True, help="shard directories (with manifest) or patterns"
    )
    job.add_argument("--out", required=True, help="results JSON file")
    job.add_argument("--runner", default="DirectRunner", help="Beam runner (default DirectRunner)")
    job.add_argument(
        "--gof",
        action="append",
        default=[],
        metavar="QUESTION=P0",
        help="goodness of fit of [survey/]question against comma-separated p0 (repeatable)",
    )
    job.add_argument("--alpha", type=float, default=0.05, help="significance level")
    job.add_argument("--confidence", type=float, default=0.95, help="confidence level")
    job.add_argument("--seed", type=int, help="seed for Monte Carlo and bootstrap tests")
    job.add_argument("--calibration", choices=["auto", "asymptotic", "monte-carlo"], default="auto")
    job.add_argument(
        "--dedup",
        choices=["auto", "always", "never"],
        default="auto",
        help="count repeated report ids once (auto: when the shards are not one export)",
    )
    job.add_argument(
        "--dedup-partitions", type=_positive, default=64, help="partitions of the dedup step"
    )
    job.set_defaults(run=run_job)
    _add_report(sub)
    _add_confirm(sub)
    _add_plan(sub)
    _add_backup(sub)
    _add_two_sample(sub)
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port from 1 to 65535 (or 0), got {text!r}")
    return value


def _json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="machine-readable output (errors too, on stderr)"
    )


def _connection_limits(serve: argparse.ArgumentParser) -> None:
    """The per-stream and per-connection limits (docs/limits.md); defaults from their classes."""
    from aggregator.service.streams import ConnectionLimits, StreamLimits

    streams, connections = StreamLimits(), ConnectionLimits()
    flags = [
        ("--max-stream-messages", _positive, streams.max_messages, "messages per upload stream"),
        ("--max-stream-reports", _positive, streams.max_reports, "reports per upload stream"),
        ("--max-stream-bytes", _positive, streams.max_bytes, "bytes per upload stream"),
        ("--max-stream-seconds", float, streams.max_seconds, "seconds an upload stream may last"),
        (
            "--max-concurrent-streams",
            _positive,
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


def _limits_of(args: argparse.Namespace):
    """The StreamLimits and ConnectionLimits of the serve flags (ValueError if not positive)."""
    from aggregator.service.streams import ConnectionLimits, StreamLimits

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


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, required=True, help="survey definitions (TOML)")
    parser.add_argument(
        "--db", type=Path, required=True, help="SQLite report store (created 0600 by serve)"
    )


def _devices(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", type=Path, required=True, help="device registry (SQLite)")


def _side(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--side",
        choices=list(SIDES),
        help="split surveys: which side to read (default exploration; confirmation only once "
        "its results are sealed)",
    )


def _group(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--group",
        metavar="VALUE",
        help="surveys with a group label: read one group (default: all groups pooled)",
    )


def _question(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--survey", required=True, help="survey id")
    parser.add_argument("--question", required=True, help="question id")


def run_serve(args: argparse.Namespace) -> int:
    credentials = _server_credentials(args)
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
    if args.workers > 1 and limits:
        raise UserError(
            "per-device limits (rate_per_minute, burst, max_reports_per_device) keep their state "
            "in one process: serve them with --workers 1"
        )
    if args.db.is_file() and args.db.stat().st_size:  # kind and pins, before binding
        with StoreReader(args.db) as reader:
            reader.check_definitions(surveys, args.config)
    with _metrics_endpoint(args):
        return _run_serve(args, surveys, limits, credentials, keys)


@contextlib.contextmanager
def _metrics_endpoint(args: argparse.Namespace):
    """With --metrics-port: the Prometheus endpoint for the life of the server (and, with
    --workers, the multiprocess directory every process records into, removed afterwards)."""
    if args.metrics_port is None:
        yield
        return
    from aggregator.service import metrics

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


def _run_serve(args, surveys, limits, credentials, keys) -> int:
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
    from aggregator.service.workers import WorkerSecurity, serve_workers

    def serving(port: int) -> None:
        _announce(args, port, f"{len(surveys)} survey(s) with {args.workers} worker processes")

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
    )
    print(f"{PROG}: stopped", flush=True)
    return 0


def _announce(args: argparse.Namespace, port: int, what: str) -> None:
    """Write the port file (if asked) and say what is served where."""
    if args.port_file:
        args.port_file.write_text(f"{port}\n")
    print(f"{PROG}: serving {what} on {args.host}:{port}", flush=True)


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
    from aggregator.service.tls import server_credentials

    return server_credentials(args.tls_cert, args.tls_key, args.client_ca)


async def _serve(
    surveys,
    limits,
    args: argparse.Namespace,
    credentials: grpc.ServerCredentials | None,
    keys: dict[str, Ed25519PublicKey],
) -> None:
    from aggregator.service.app import start_server
    from aggregator.service.metrics import PrometheusMetrics
    from aggregator.service.observe import Observer, access_log_stream

    recorder = PrometheusMetrics() if args.metrics_port is not None else None
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
    )
    _announce(args, running.port, f"{len(surveys)} survey(s)")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print(f"{PROG}: draining and shutting down", flush=True)
    await running.stop(grace=5.0)


def run_enroll(args: argparse.Namespace) -> int:
    try:
        pem = args.public_key.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read public key {args.public_key}: {exc.strerror}") from None
    with DeviceRegistry(args.devices, create=True) as registry:
        device, new = registry.enroll(pem, args.device_id)
    state = "enrolled" if new else "already enrolled"
    print(f"{state} device {device.device_id} in {args.devices}")
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    with DeviceRegistry(args.devices) as registry:
        device = registry.revoke(args.device_id)
    print(f"revoked device {device.device_id} (a running server refuses it within seconds)")
    return 0


def run_devices(args: argparse.Namespace) -> int:
    with DeviceRegistry(args.devices, read_only=True) as registry:
        devices = registry.devices()
    rows = [
        {
            "device_id": d.device_id,
            "public_key": d.public_key.hex(),
            "enrolled_at": d.enrolled_at,
            "revoked_at": d.revoked_at,
        }
        for d in devices
    ]
    if args.json:
        print(json.dumps(rows))
    else:
        for row in rows:
            state = "active" if row["revoked_at"] is None else "revoked"
            print(f"{row['device_id']}  {state}")
    return 0


def _load(args: argparse.Namespace, *, test: bool = False):
    """The question and its histogram, read only, after the survey file is checked against the
    store's pinned definitions; exit 3 below the survey's release threshold. For a ``test``,
    a question whose reports may be clustered by household is refused (ClusteredReportsError).
    A split survey is read on one side (``--side``, exploration by default; the confirmation
    side only once its results are sealed: ConfirmationError otherwise)."""
    surveys = load_surveys(args.config)
    try:
        survey, question = ingest.find_question(surveys, args.survey, args.question)
    except ReportRejectedError as exc:
        raise UserError(exc.message) from None
    if test:
        check_independent(survey, question)
    if args.side and not survey.split:
        raise UserError(f"survey {survey.id} is not split; --side is for split surveys")
    side = SIDES[args.side or "exploration"] if survey.split else 0
    args.exploratory = side == ldp_pb2.EXPLORATION
    group = getattr(args, "group", None) or ""
    try:
        if group:
            survey.check_group(group)
    except SurveyError as exc:
        raise UserError(str(exc)) from None
    args.groups = _groups_read(survey, group)
    with StoreReader(args.db) as reader:
        reader.check_definitions(surveys, args.config)
        confirmations.check_readable(reader.connection, survey, side)
        n, sums = reader.statistics(survey.id, question.id, question.statistic_size, side, group)
    if n < survey.min_batch_size:
        of = f" of {survey.group_label.name} {group!r}" if group else ""  # type: ignore[union-attr]
        raise UserError(
            f"{survey.id}/{question.id} has {n} reports{of}; results are released from "
            f"{survey.min_batch_size} (min_batch_size)",
            status=3,
        )
    return question, ingest.histogram(question, n, sums)


def _groups_read(survey: SurveySpec, group: str) -> dict[str, str]:
    """What a read of a survey with a group label covers, for the output: the one group, or
    every group pooled; empty for a survey without a group label."""
    label = survey.group_label
    if label is None:
        return {}
    if group:
        return {"group_label": label.name, "group": group}
    return {"group_label": label.name, "group": "", "pooled": ", ".join(label.values)}


def _group_line(groups: dict[str, str]) -> str | None:
    """The first line of a grouped survey's text output."""
    if not groups:
        return None
    if groups["group"]:
        return f"{groups['group_label']} = {groups['group']}"
    return (
        f"all {groups['group_label']} groups pooled ({groups['pooled']}); --group VALUE reads "
        "one group"
    )


def run_estimate(args: argparse.Namespace) -> int:
    from aggregator.stats import estimate  # SciPy: imported only by the commands that need it

    question, hist = _load(args)
    est = estimate(hist, args.confidence, simultaneous=args.simultaneous)
    if args.json:
        side = {"exploratory": True} if args.exploratory else {}
        labels = {"question": question.id, "labels": question.labels}
        print(json.dumps({**labels, **side, **args.groups, **est.to_dict()}))
    else:
        if args.exploratory:
            print(EXPLORATORY)
        if _group_line(args.groups):
            print(_group_line(args.groups))
        print(estimate_table(est, question.labels))
    return 0


def estimate_table(est, labels: list[str]) -> str:
    """The estimate as a table with its interval method; simultaneous intervals when computed;
    when an unbiased value falls outside [0, 1], the projected distribution is shown beside it,
    with what it means."""
    projected = est.projected()
    outside = bool(((est.frequencies < 0) | (est.frequencies > 1)).any())
    joint = est.simultaneous_low is not None
    width = max(8, *(len(label) for label in labels))
    level = f"{100 * est.confidence:g}% CI"
    header = f"  {'category':<{width}}  estimate    s.e.   {level:<18}"
    if joint:
        header += f"  {'simultaneous':<18}"
    method = f", intervals: {est.interval_method}" if est.interval_method else ""
    lines = [
        f"estimate [{est.mechanism}], n = {est.n}{method}",
        header + ("  projected" if outside else ""),
    ]
    for j, label in enumerate(labels):
        interval = f"[{share(est.ci_low[j])}, {share(est.ci_high[j])}]"
        line = f"  {label:<{width}}  {share(est.frequencies[j]):>8}  "
        line += f"{share(est.standard_errors[j]):>6}   {interval:<18}"
        if joint:
            both = f"[{share(est.simultaneous_low[j])}, {share(est.simultaneous_high[j])}]"
            line += f"  {both:<18}"
        lines.append(line + (f"  {share(projected[j]):>9}" if outside else ""))
    if joint:
        lines.append(
            f"  'simultaneous': all {len(labels)} intervals cover at once with probability at "
            f"least {100 * est.confidence:g}%"
        )
    if outside:
        lines.append(
            "  An unbiased estimate can fall outside [0, 1] by noise; 'projected' is the nearest "
            "distribution (non-negative, sums to 1; biased), for reading off shares."
        )
    return "\n".join(line.rstrip() for line in lines)


def run_test(args: argparse.Namespace) -> int:
    from aggregator.stats import goodness_of_fit, independence

    if args.kind == "independence" and args.p0:
        raise UserError("--p0 is for gof; an independence test takes no null distribution")
    if args.kind == "gof" and not args.p0:
        raise UserError("gof needs --p0 (one probability per category, comma-separated)")
    question, hist = _load(args, test=True)
    try:
        if args.kind == "gof":
            p0 = _p0(args.p0, question)
            result = goodness_of_fit(
                hist, p0, args.alpha, args.method, calibration=args.calibration, rng=args.seed
            )
        else:
            if len(question.shape) != 2:
                raise UserError(f"question {question.id} does not have exactly 2 attributes")
            result = independence(
                hist,
                question.shape,
                args.alpha,
                args.method,
                calibration=args.calibration,
                rng=args.seed,
            )
    except InsufficientDataError as exc:
        raise UserError(str(exc), status=3) from None
    if args.json:
        side = {"exploratory": True} if args.exploratory else {}
        print(json.dumps({**side, **args.groups, **result.to_dict()}))
    else:
        if args.exploratory:
            print(EXPLORATORY)
        if _group_line(args.groups):
            print(_group_line(args.groups))
        print(result.summary())
    return 0


def _p0(text: str, question) -> np.ndarray:
    """--p0 as a distribution over the question's categories: ``uniform``, comma-separated
    numbers in category order, or ``@file`` (aggregator/survey_file/null_text.py)."""
    try:
        return np.array(parse_null(text, question.labels, "--p0"))
    except NullTextError as exc:
        raise UserError(f"question {question.id}: {exc}") from None


def _open_store(surveys, db: Path, where: object) -> ReportStore:
    """The store for writing, with every question checked against its pinned definition."""
    store = ReportStore(db)
    try:
        definitions.register(store, surveys, where)
    except BaseException:
        store.close()
        raise
    return store


def run_export(args: argparse.Namespace) -> int:
    surveys = load_surveys(args.config)
    if args.survey not in surveys:
        raise UserError(f"unknown survey {args.survey!r}; {args.config} defines {_ids(surveys)}")
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out {args.out} is a file, not a directory")
    if args.out.is_dir() and any(args.out.iterdir()) and not args.force:
        raise UserError(
            f"--out {args.out} is not empty; choose an empty directory or pass --force to write "
            "into it"
        )
    survey = surveys[args.survey]
    if args.side and not survey.split:
        raise UserError(f"survey {survey.id} is not split; --side is for split surveys")
    side = SIDES[args.side or "exploration"] if survey.split else 0
    with StoreReader(args.db) as reader:
        reader.check_definitions(surveys, args.config)
        confirmations.check_readable(reader.connection, survey, side)
        total = sum(
            reader.statistics(survey.id, q.id, q.statistic_size, side)[0] for q in survey.questions
        )
        with bar(total, "export", unit="reports") as progress:
            manifest = shards.export_survey(
                reader, survey, args.out, args.shards, progress.update, side
            )
    which = f" ({shards.SIDE_NAMES[side]} side)" if side else ""
    print(
        f"exported {manifest.reports} reports of {args.survey}{which} into "
        f"{len(manifest.shards)} shard(s) in {args.out}"
    )
    return 0


def _ids(surveys: dict[str, SurveySpec]) -> str:
    return ", ".join(sorted(surveys))


def run_import(args: argparse.Namespace) -> int:
    surveys = load_surveys(args.config)
    manifest = shards.read_manifest(args.source)
    survey = surveys.get(manifest.survey.id)
    if not definitions.reads_as(manifest.survey, survey):
        change = definitions.survey_change(manifest.survey, survey, args.config)
        raise UserError(f"{args.source}: {change}")
    shards.verify(args.source, manifest)
    store = _open_store(surveys, args.db, args.config)
    fresh: list[int] = []
    try:
        for name, _, _ in manifest.shards:
            batch = []
            for report in shards.read_shard(args.source / name):
                report.side = manifest.side  # a split survey's export holds one side
                try:
                    batch.append(ingest.validate(report, surveys))
                except ReportRejectedError as exc:
                    raise UserError(f"{name}: invalid report ({exc.reason.value}): {exc}") from None
                if len(batch) == 5000:
                    fresh += store.put(batch)
                    batch = []
            fresh += store.put(batch) if batch else []
    finally:
        store.close()
    accepted, conflicts = fresh.count(STORED), fresh.count(CONFLICT)
    duplicate = len(fresh) - accepted - conflicts
    print(f"imported {accepted} new reports ({duplicate} already present)")
    if conflicts:
        print(
            f"{args.source}: {conflicts} report ids are stored with other content; "
            "those reports were not imported",
            file=sys.stderr,
        )
    return 0


def run_check_config(args: argparse.Namespace) -> int:
    surveys = load_surveys(args.config)
    limits = load_limits(args.config)
    load_analyses(args.config, surveys)  # the optional analysis section is checked too
    if args.db is not None:
        with StoreReader(args.db) as reader:
            reader.check_definitions(surveys, args.config)
    rows = []
    for survey in surveys.values():
        cost = survey_cost(survey.questions)
        rows.append(
            {
                "survey": survey.id,
                "min_batch_size": survey.min_batch_size,
                "require_device_auth": survey.require_device_auth,
                "household_members": survey.household_members,
                "exploration_fraction": survey.exploration_fraction,
                "group_label": None
                if survey.group_label is None
                else {"name": survey.group_label.name, "values": list(survey.group_label.values)},
                "limits": survey.id in limits,
                "cost": cost.to_dict(),
                "questions": [
                    {"id": q.id, "k": q.k, "digest": q.digest.hex(), **q.definition()}
                    for q in survey.questions
                ],
            }
        )
    if args.json:
        print(json.dumps({"config": str(args.config), "ok": True, "surveys": rows}))
        return 0
    print(f"{args.config}: OK, {len(rows)} survey(s)")
    for row in rows:
        print(
            f"survey {row['survey']}: {len(row['questions'])} question(s), results released from "
            f"{row['min_batch_size']} reports; a device spends epsilon {row['cost']['epsilon']:g}"
            f" and rho {row['cost']['rho']:g} ({row['cost']['flags']})"
        )
        if row["exploration_fraction"]:
            print(
                f"  split: {100 * row['exploration_fraction']:g}% of devices explore, the rest "
                "confirm (docs/adaptive-analysis.md)"
            )
        if row["group_label"]:
            label = row["group_label"]
            print(
                f"  public group label {label['name']}: {', '.join(label['values'])} (sent "
                "unrandomized with every report; docs/two-sample.md)"
            )
        for q in row["questions"]:
            parameter = f"rho = {q['rho']:g}" if "rho" in q else f"epsilon = {q['epsilon']:g}"
            shared = ", household_shared" if q.get("household_shared") else ""
            print(f"  {q['id']}: {q['mechanism']}, {parameter}, k = {q['k']}{shared}")
    if args.db is not None:
        print(f"matches the definitions pinned in {args.db}")
    return 0


def run_cost(args: argparse.Namespace) -> int:
    surveys = load_surveys(args.config)
    if args.survey is not None and args.survey not in surveys:
        raise UserError(f"unknown survey {args.survey!r}; {args.config} defines {_ids(surveys)}")
    chosen = [surveys[args.survey]] if args.survey else list(surveys.values())
    try:
        costs = {s.id: survey_cost(s.questions, args.delta) for s in chosen}
    except ValueError as exc:
        raise UserError(f"--delta: {exc}") from None
    if args.json:
        print(json.dumps({survey_id: c.to_dict() for survey_id, c in costs.items()}))
        return 0
    for survey in chosen:
        cost = costs[survey.id]
        print(f"survey {survey.id}: one device answering each question once spends")
        for question in survey.questions:
            c = question.mechanism.cost
            name = "epsilon" if c.kind == "pure" else "rho"
            print(
                f"  {question.id:<24} {name} {c.value:g} ({'pure' if c.kind == 'pure' else 'zCDP'})"
            )
        print(
            f"  total: epsilon {cost.epsilon:g} (pure, pointwise bucket), rho {cost.rho:g} (zCDP)"
        )
        if cost.rho:
            print(
                f"  covered by an ({cost.budget:g}, {cost.delta:g})-DP budget with "
                f"{cost.pointwise:g} of it pointwise"
            )
        else:
            print(f"  covered by a pure {cost.budget:g}-LDP budget")
        print(f"  ldp-client submit ... {cost.flags}")
        if cost.household_epsilon or cost.household_rho:
            print(
                f"  household_shared questions: epsilon {cost.household_epsilon:g}, rho "
                f"{cost.household_rho:g} per household device; a household of D devices needs "
                f"ldp-client household create --cap D x {cost.household_epsilon:g}"
                + (f" --rho-cap D x {cost.household_rho:g}" if cost.household_rho else "")
                + " --devices D (docs/households.md)"
            )
    return 0


def run_export_survey(args: argparse.Namespace) -> int:
    surveys = load_surveys(args.config)
    if args.survey not in surveys:
        raise UserError(f"unknown survey {args.survey!r}; {args.config} defines {_ids(surveys)}")
    text = survey_to_json(surveys[args.survey])
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
        print(f"wrote survey {args.survey} to {args.out} (ldp-client install-survey {args.out})")
    return 0


def run_rebuild(args: argparse.Namespace) -> int:
    surveys = load_surveys(args.config)
    if not args.db.exists():
        raise UserError(f"report store not found: {args.db}")
    questions = {(s.id, q.id): q for s in surveys.values() for q in s.questions}
    store = _open_store(surveys, args.db, args.config)
    sides = [  # every question's pooled statistic per side, then per group of a group label
        (s.id, q.id, side, group)
        for s in surveys.values()
        for q in s.questions
        for side in ((ldp_pb2.EXPLORATION, ldp_pb2.CONFIRMATION) if s.split else (0,))
        for group in ("", *(s.group_label.values if s.group_label else ()))
    ]
    try:
        before = {key: store.statistics(*key) for key in sides}

        def contribution(survey_id: str, question_id: str, payload: bytes) -> np.ndarray:
            question = questions.get((survey_id, question_id))
            if question is None:
                raise UserError(f"the log holds reports of unknown question {question_id!r}")
            return ingest.contribution(question, payload)

        total = sum(n for key, (n, _) in before.items() if not key[3])  # pooled: each once
        with bar(total, "rebuild", unit="reports", quiet=args.json) as progress:
            after = store.rebuild(contribution, progress.update)
    finally:
        store.close()
    rows = []
    for key in sides:
        n_before, sums_before = before[key]
        stored_as = key[:2] if key[2:] == (0, "") else key[:3] if not key[3] else key
        found = after.get(stored_as, (0, np.zeros_like(sums_before)))
        n_after, sums_after = found
        same = n_before == n_after and np.array_equal(sums_before, sums_after)
        row = {"survey": key[0], "question": key[1], "n": int(n_after), "matched": same}
        if key[2]:
            row["side"] = ldp_pb2.Side.Name(key[2]).lower()
        if key[3]:
            row["group"] = key[3]
        rows.append(row)
    if args.json:
        print(json.dumps(rows))
    else:
        for row in rows:
            status = "matches" if row["matched"] else "DIFFERED (rewritten from the log)"
            where = f" ({row['side']} side)" if "side" in row else ""
            where += f" [{row['group']}]" if "group" in row else ""
            print(f"{row['survey']}/{row['question']}{where}: n = {row['n']}, statistics {status}")
    return 0 if all(row["matched"] for row in rows) else 1


def run_job(args: argparse.Namespace) -> int:
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # Beam warns about optional cloud libraries
    try:
        from aggregator.jobs.job_cli import run_job_command
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "apache_beam":
            raise
        raise UserError(
            "the job command needs Apache Beam: pip install 'ldp-survey[beam]'"
        ) from None
    finally:
        root.setLevel(level)
    return run_job_command(args)


def _beam_option(arg: str) -> str:
    """Beam spells its options with underscores; accept the dashed form too."""
    if not arg.startswith("--"):
        return arg
    name, sep, value = arg[2:].partition("=")
    return "--" + name.replace("-", "_") + sep + value


def _add_report(sub) -> None:
    report = _command(sub, "report", "a survey report: every question, plots, declared tests")
    _common(report)
    report.add_argument("--survey", help="survey id (optional when the file defines one)")
    report.add_argument("--out", type=Path, required=True, help="file to write")
    report.add_argument(
        "--format", choices=["html", "md"], default="html", help="self-contained HTML or Markdown"
    )
    report.add_argument("--confidence", type=float, default=0.95, help="confidence level")
    report.add_argument("--seed", type=int, default=0, help="seed of Monte Carlo p-values")
    _side(report)
    _group(report)
    report.set_defaults(run=run_report)


def run_report(args: argparse.Namespace) -> int:
    from aggregator.loader import open_survey
    from aggregator.report import build_report, render_html, render_markdown

    data = open_survey(args.config, args.db, args.survey, args.side, args.group)
    analyses = load_analyses(args.config, {data.survey.id: data.survey})[data.survey.id]
    histograms = {question_id: item.histogram for question_id, item in data.items()}
    compared = {g for analysis in analyses for g in analysis.groups or ()}
    group_histograms = {
        (question_id, g): item.histogram
        for g in sorted(compared)
        for question_id, item in open_survey(
            args.config, args.db, args.survey, args.side, g
        ).items()
    }
    report = build_report(
        data.survey,
        histograms,
        analyses,
        args.confidence,
        args.seed,
        side=data.side,
        group=data.group,
        group_histograms=group_histograms,
    )
    text = render_html(report) if args.format == "html" else render_markdown(report)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({len(report.questions)} questions)")
    return 0


def _add_confirm(sub) -> None:
    """preregister, confirm, holdout: explore, then confirm (docs/adaptive-analysis.md)."""
    prereg = _command(
        sub, "preregister", "register a split survey's confirmatory plan (hashed, timestamped)"
    )
    _common(prereg)
    prereg.add_argument("--survey", required=True, help="survey id")
    prereg.add_argument("--plan", type=Path, required=True, help="plan file (TOML)")
    prereg.set_defaults(run=run_preregister)
    confirm = _command(
        sub, "confirm", "run the registered plan once on the confirmation side and seal it"
    )
    _common(confirm)
    confirm.add_argument("--survey", required=True, help="survey id")
    confirm.add_argument("--seed", type=int, default=0, help="seed of Monte Carlo p-values")
    _json(confirm)
    confirm.set_defaults(run=run_confirm)
    holdout = _command(
        sub, "holdout", "one test on the confirmation side as a reusable holdout (one bit)"
    )
    _common(holdout)
    _question(holdout)
    holdout.add_argument("kind", choices=["gof", "independence"], help="which test")
    holdout.add_argument("--p0", help="gof only: null distribution, as for `test --p0`")
    holdout.add_argument(
        "--alpha", type=float, help="family-wise level over all queries (first query: 0.05)"
    )
    holdout.add_argument("--max-queries", type=_positive, help="m, fixed by the first query: 20")
    holdout.add_argument("--max-rejections", type=_positive, help="B, fixed by the first query: 3")
    holdout.add_argument("--seed", type=int, default=0, help="seed of Monte Carlo p-values")
    holdout.set_defaults(run=run_holdout)


def _writer(args: argparse.Namespace):
    """The survey, and the store opened for writing under the server's lock (a running server
    must be used through its Analyst RPCs instead: it keeps the confirmation state in memory)."""
    from aggregator.service.store_lock import StoreInUseError, StoreLock

    surveys = load_surveys(args.config)
    if args.survey not in surveys:
        raise UserError(f"unknown survey {args.survey!r}; {args.config} defines {_ids(surveys)}")
    if not args.db.exists():
        raise UserError(f"{args.db}: no such report store")
    try:
        lock = StoreLock(args.db)
    except StoreInUseError as exc:
        raise UserError(f"{exc}; use the Analyst RPCs of that server, or stop it") from None
    try:
        store = _open_store(surveys, args.db, args.config)
    except BaseException:
        lock.release()
        raise
    return surveys, surveys[args.survey], store, lock


def run_preregister(args: argparse.Namespace) -> int:
    from aggregator.confirm.plan import load_plan

    surveys, survey, store, lock = _writer(args)
    try:
        plan = load_plan(args.plan, surveys)
        if plan.survey_id != survey.id:
            raise UserError(f"{args.plan} is a plan for survey {plan.survey_id}, not {survey.id}")
        when, already = confirmations.preregister(store, survey, plan.text, plan.sha256)
    finally:
        store.close()
        lock.release()
    state = "already registered at" if already else "registered at"
    print(f"plan sha256 {plan.sha256} {state} {when} for survey {survey.id}")
    print(f"{len(plan.tests)} test(s), {plan.multiplicity} at family-wise alpha {plan.alpha:g}")
    return 0


def run_confirm(args: argparse.Namespace) -> int:
    from aggregator.confirm.display import sealed_text
    from aggregator.confirm.plan import parse_plan
    from aggregator.confirm.run import sealed_record

    surveys, survey, store, lock = _writer(args)

    def compute(plan: str, histograms) -> dict:
        return sealed_record(parse_plan(plan, surveys), survey, histograms, args.seed)

    try:
        sealed, already = confirmations.seal(store, survey, compute)
    except InsufficientDataError as exc:
        raise UserError(f"nothing sealed: {exc}", status=3) from None
    finally:
        store.close()
        lock.release()
    record = json.loads(sealed.sealed)
    if args.json:
        print(json.dumps({"already": already, **record}))
    else:
        print(sealed_text(record, already))
    return 0


def run_holdout(args: argparse.Namespace) -> int:
    from aggregator.confirm.display import holdout_text
    from aggregator.confirm.run import holdout_answer

    if args.kind == "gof" and not args.p0:
        raise UserError("gof needs --p0 (one probability per category, comma-separated)")
    test = "goodness_of_fit" if args.kind == "gof" else "independence"
    given = (args.alpha, args.max_queries, args.max_rejections)
    parameters = None if given == (None,) * 3 else dict(confirmations.DEFAULT_HOLDOUT)
    if parameters is not None:
        for key, value in zip(("alpha", "m", "budget"), given, strict=True):
            parameters[key] = parameters[key] if value is None else value
    surveys = load_surveys(args.config)
    try:
        _, question = ingest.find_question(surveys, args.survey, args.question)
    except ReportRejectedError as exc:
        raise UserError(exc.message) from None
    p0 = _p0(args.p0, question) if args.p0 else None
    _, survey, store, lock = _writer(args)
    answer: list = []

    def compute(held: dict, histograms) -> tuple[dict, bool, float]:
        answer.append(holdout_answer(held, survey, histograms, question.id, test, p0, args.seed))
        return answer[0]

    try:
        state = confirmations.holdout_query(store, survey, parameters, (question.id, test), compute)
    except InsufficientDataError as exc:
        raise UserError(f"no query used: {exc}", status=3) from None
    finally:
        store.close()
        lock.release()
    _, reject, level = answer[0]
    print(holdout_text(state, reject, level, question.id, test))
    return 0


PLAN_MECHANISMS = (
    "all",
    "randomized_response",
    "flip_components",
    "gaussian",
    "laplace",
    "optimized_unary",
    "hadamard_response",
    "subset_selection",
    "local_hashing",
    "public_coin_bit",
)


def _add_plan(sub) -> None:
    plan = _command(
        sub,
        "plan",
        "study planning: power at n, or the n a target power needs, ranked over mechanisms",
        epilog="Goodness of fit: --p0 (or --k for a uniform null); independence: --shape R,C. "
        "The alternative: --alternative (a full distribution) or --effect (Cohen's w; see "
        "docs/planning.md for the alternative it builds).",
    )
    plan.add_argument(
        "--mechanism", choices=PLAN_MECHANISMS, default="all", help="one mechanism, or rank all"
    )
    plan.add_argument("--epsilon", type=float, help="epsilon of the epsilon-LDP mechanisms")
    plan.add_argument("--rho", type=float, help="rho of --mechanism gaussian (zCDP)")
    plan.add_argument(
        "--groups",
        type=_positive,
        default=10,
        help="public groups L of --mechanism public_coin_bit (default 10); its power is averaged "
        "over the public random subsets, i.e. over seeds",
    )
    null = plan.add_mutually_exclusive_group(required=True)
    null.add_argument("--p0", help="goodness of fit against this null (comma-separated)")
    null.add_argument("--k", type=_positive, help="goodness of fit against uniform on k categories")
    null.add_argument("--shape", help="independence of an R x C table, e.g. 2,3")
    alternative = plan.add_mutually_exclusive_group(required=True)
    alternative.add_argument("--alternative", help="the true distribution to detect")
    alternative.add_argument("--effect", type=float, help="Cohen's effect size w to detect")
    goal = plan.add_mutually_exclusive_group(required=True)
    goal.add_argument("--n", type=_positive, help="planned number of reports: give the power")
    goal.add_argument("--power", type=float, help="target power: give the reports needed")
    plan.add_argument("--alpha", type=float, default=0.05, help="significance level")
    plan.add_argument("--plot", type=Path, help="draw power against n here (.png, .svg, .pdf)")
    _json(plan)
    plan.set_defaults(run=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    from aggregator.planning import (
        interaction_alternative,
        plan_study,
        plot_power_curves,
        tilted_alternative,
    )
    from aggregator.stats.validate import check_distribution

    null, shape = None, None
    if args.shape is not None:
        shape = _shape(args.shape)
        k = shape[0] * shape[1]
    elif args.p0 is not None:
        null = check_distribution(_numbers("--p0", args.p0), len(args.p0.split(",")), "--p0")
        k = null.size
    else:
        k = args.k
        null = np.full(k, 1.0 / k)
    if args.alternative is not None:
        alternative = _numbers("--alternative", args.alternative)
        if alternative.size != k:
            raise UserError(f"--alternative has {alternative.size} probabilities, the null {k}")
    elif shape is not None:
        alternative = interaction_alternative(shape, args.effect)
    else:
        alternative = tilted_alternative(null, args.effect)
    epsilon, mechanisms = _plan_mechanisms(args, k)
    plan = plan_study(
        k=k,
        epsilon=epsilon,
        alternative=alternative,
        null=null,
        shape=shape,
        mechanisms=mechanisms,
        n=args.n,
        target_power=args.power,
        alpha=args.alpha,
    )
    if args.plot is not None:
        plot_power_curves(plan, args.plot)
    print(json.dumps(plan.to_dict()) if args.json else plan.summary())
    return 0


def _plan_mechanisms(args: argparse.Namespace, k: int):
    """The epsilon the advisor compares at, and the one mechanism asked for (None: all)."""
    from client.mechanisms import (
        FlipComponents,
        GaussianNoise,
        HadamardResponse,
        LaplaceNoise,
        LocalHashing,
        OptimizedUnaryEncoding,
        PublicCoinBit,
        RandomizedResponse,
        SubsetSelection,
    )

    if args.mechanism == "gaussian":
        if args.rho is None:
            raise UserError("--mechanism gaussian needs --rho")
        return math.sqrt(2 * args.rho), [GaussianNoise(k, args.rho)]
    if args.rho is not None:
        raise UserError("--rho is for --mechanism gaussian; the others take --epsilon")
    if args.epsilon is None:
        raise UserError(f"--mechanism {args.mechanism} needs --epsilon")
    kinds = {
        "randomized_response": RandomizedResponse,
        "flip_components": FlipComponents,
        "laplace": LaplaceNoise,
        "optimized_unary": OptimizedUnaryEncoding,
        "hadamard_response": HadamardResponse,
        "subset_selection": SubsetSelection,
        "local_hashing": LocalHashing,
    }
    if args.mechanism == "all":
        return args.epsilon, None
    if args.mechanism == "public_coin_bit":  # the seed does not change the planned power
        try:
            return args.epsilon, [PublicCoinBit(k, args.epsilon, 0, args.groups)]
        except ValueError as exc:
            raise UserError(str(exc)) from None
    return args.epsilon, [kinds[args.mechanism](k, args.epsilon)]


def _numbers(flag: str, text: str) -> np.ndarray:
    try:
        return np.array([float(x) for x in text.split(",")])
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected comma-separated numbers") from None


def _shape(text: str) -> tuple[int, int]:
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) >= 2 for p in parts):
        raise UserError(f"--shape {text!r}: expected two category counts >= 2, e.g. 2,3")
    return int(parts[0]), int(parts[1])


def _add_backup(sub) -> None:
    backup = _command(sub, "backup", "online backup of a report store and its secret files")
    backup.add_argument("--db", type=Path, required=True, help="the report store (may be serving)")
    backup.add_argument("--out", type=Path, required=True, help="a new or empty folder")
    _json(backup)
    backup.set_defaults(run=run_backup)

    restore = _command(sub, "restore", "restore a backup (checks every file's SHA-256 first)")
    restore.add_argument("--from", dest="source", type=Path, required=True, help="backup folder")
    restore.add_argument("--db", type=Path, required=True, help="the store to restore as")
    restore.add_argument(
        "--force", action="store_true", help="replace an existing store (stop its server first)"
    )
    _json(restore)
    restore.set_defaults(run=run_restore)


def run_backup(args: argparse.Namespace) -> int:
    from aggregator.store.backup import backup

    manifest = backup(args.db, args.out, SIDECAR_SUFFIXES)
    if args.json:
        print(json.dumps(manifest))
    else:
        print(
            f"backed up {manifest['reports']:,} reports and {len(manifest['files'])} files "
            f"to {args.out}"
        )
    return 0


def run_restore(args: argparse.Namespace) -> int:
    from aggregator.store.backup import restore

    manifest = restore(args.source, args.db, args.force)
    if args.json:
        print(json.dumps(manifest))
    else:
        print(f"restored {manifest['reports']:,} reports ({manifest['created']}) as {args.db}")
    return 0


def _add_two_sample(sub) -> None:
    two = _command(
        sub, "two-sample", "did two groups answer alike? homogeneity of two questions (read only)"
    )
    _common(two)
    two.add_argument("--a", metavar="SURVEY:QUESTION", help="group A: a question")
    two.add_argument("--b", metavar="SURVEY:QUESTION", help="group B: a question")
    two.add_argument("--survey", help="with --groups: the survey (it declares a group label)")
    two.add_argument("--question", help="with --groups: the question")
    two.add_argument(
        "--groups",
        nargs=2,
        metavar=("A", "B"),
        help="compare two values of the survey's group label on one question (instead of --a/--b)",
    )
    two.add_argument("--alpha", type=float, default=0.05, help="significance level")
    two.add_argument("--seed", type=int, help="seed for the Monte Carlo null")
    two.add_argument(
        "--calibration",
        choices=["auto", "asymptotic", "monte-carlo"],
        default="auto",
        help="null distribution of the p-value (auto: simulated where the chi-square limit is "
        "not accurate; docs/two-sample.md)",
    )
    _side(two)
    _json(two)
    two.set_defaults(run=run_two_sample)


def run_two_sample(args: argparse.Namespace) -> int:
    from aggregator.stats import two_sample
    from aggregator.survey_file.groups import check_same_definition

    # A split survey is read on one side (--side; exploration, labelled, by default), like
    # estimate and test; --side applies to both groups.
    groups = _two_sample_groups(args)
    (question_a, hist_a), (question_b, hist_b) = (_load(group, test=True) for group in groups)
    exploratory = any(group.exploratory for group in groups)
    names = tuple(f"{g.survey}:{g.question}" + (f"[{g.group}]" if g.group else "") for g in groups)
    check_same_definition(question_a, question_b, names)
    try:
        result = two_sample(hist_a, hist_b, args.alpha, calibration=args.calibration, rng=args.seed)
    except InsufficientDataError as exc:
        raise UserError(str(exc), status=3) from None
    if args.json:
        label = {"exploratory": True} if exploratory else {}
        print(json.dumps({"a": names[0], "b": names[1], **label, **result.to_dict()}))
    else:
        if exploratory:
            print(EXPLORATORY)
        print(f"A = {names[0]} (n = {hist_a.n}), B = {names[1]} (n = {hist_b.n})")
        print(result.summary())
    return 0


def _two_sample_groups(args: argparse.Namespace) -> list[argparse.Namespace]:
    """The two groups of ``two-sample`` as arguments of _load: two questions (--a, --b) or one
    question split by two values of its survey's group label (--survey, --question, --groups).
    One line (exit 2) for a mix of the two forms, neither, or two names of one group."""
    from aggregator.survey_file.groups import two_sample_request_problem

    pair = args.a is not None or args.b is not None
    grouped = args.groups is not None or args.survey is not None or args.question is not None
    if pair == grouped:
        raise UserError(
            "give either --a and --b (two questions) or --survey, --question and --groups A B "
            "(one question split by its group label)"
        )
    if pair:
        if args.a is None or args.b is None:
            raise UserError("--a and --b go together")
        if args.a == args.b:
            raise UserError(
                f"--a and --b both name {args.a}: a two-sample test compares two groups"
            )
        where = [_survey_question(flag, text) for flag, text in (("a", args.a), ("b", args.b))]
        where = [{**w, "group": ""} for w in where]
    else:
        if args.survey is None or args.question is None or args.groups is None:
            raise UserError("--groups A B needs --survey and --question")
        where = [
            {"survey": args.survey, "question": args.question, "group": g} for g in args.groups
        ]
    keys = [(w["survey"], w["question"], w["group"]) for w in where]
    problem = two_sample_request_problem(keys[0], keys[1])
    if problem:
        raise UserError(problem)
    fields = {k: v for k, v in vars(args).items() if k not in ("survey", "question", "groups")}
    return [argparse.Namespace(**fields, **w) for w in where]


def _survey_question(flag: str, text: str) -> dict[str, str]:
    survey, sep, question = text.partition(":")
    if not (sep and survey and question):
        raise UserError(f"--{flag} {text!r}: expected SURVEY:QUESTION")
    return {"survey": survey, "question": question}


if __name__ == "__main__":
    sys.exit(main())
