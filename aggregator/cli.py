"""``ldp-aggregator``: serve, estimate, test, export, import, rebuild, job (Beam); enroll, revoke
and list device keys.

User mistakes end with a one-line message on stderr and a non-zero exit status (2: bad input,
3: not enough reports to release), never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from aggregator.config import ConfigError, load_limits, load_surveys
from aggregator.errors import InsufficientDataError, LdpError
from aggregator.service.auth import DEFAULT_WINDOW_SECONDS
from aggregator.service.devices import DeviceRegistry
from aggregator.service.limits import DEFAULT_MAX_INFLIGHT_REPORTS
from aggregator.store import ingest, shards
from aggregator.store.ingest import ReportRejectedError
from aggregator.store.report_store import ReportStore, StoreError

PROG = "ldp-aggregator"


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
    except UserError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.status
    except (ConfigError, StoreError, LdpError, ValueError, OSError) as exc:  # incl. shard errors
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="LDP survey aggregator")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning"])
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the gRPC aggregator")
    _common(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=50051, help="0 picks a free port")
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
        help="allowed clock difference of a device signature, seconds (default 300)",
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
    serve.set_defaults(run=run_serve)

    enroll = sub.add_parser("enroll", help="enroll a device's Ed25519 public key")
    _devices(enroll)
    enroll.add_argument("--public-key", type=Path, required=True, help="device public key PEM")
    enroll.add_argument("--device-id", help="the id the device printed (checked against the key)")
    enroll.set_defaults(run=run_enroll)

    revoke = sub.add_parser("revoke", help="revoke a device key for good")
    _devices(revoke)
    revoke.add_argument("--device-id", required=True)
    revoke.set_defaults(run=run_revoke)

    listing = sub.add_parser("devices", help="list enrolled and revoked devices")
    _devices(listing)
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(run=run_devices)

    est = sub.add_parser("estimate", help="unbiased frequencies with confidence intervals")
    _common(est)
    _question(est)
    est.add_argument("--confidence", type=float, default=0.95)
    est.add_argument(
        "--simultaneous", action="store_true", help="also intervals covering all categories at once"
    )
    est.add_argument("--json", action="store_true", help="machine-readable output")
    est.set_defaults(run=run_estimate)

    test = sub.add_parser("test", help="goodness of fit or independence test")
    _common(test)
    _question(test)
    test.add_argument("kind", choices=["gof", "independence"])
    test.add_argument("--p0", help="null distribution for gof, comma-separated")
    test.add_argument("--alpha", type=float, default=0.05)
    test.add_argument("--method", help="test method (default: the mechanism's recommended one)")
    test.add_argument("--seed", type=int, help="seed for Monte Carlo and bootstrap tests")
    test.add_argument(
        "--calibration",
        choices=["auto", "asymptotic", "monte-carlo"],
        default="auto",
        help="null distribution of the p-value (default auto: simulated where the chi-square "
        "limit is not accurate)",
    )
    test.add_argument("--json", action="store_true", help="machine-readable output")
    test.set_defaults(run=run_test)

    export = sub.add_parser("export", help="write a survey's reports as shard files")
    _common(export)
    export.add_argument("--survey", required=True)
    export.add_argument("--out", type=Path, required=True, help="output directory")
    export.add_argument("--shards", type=int, default=4)
    export.set_defaults(run=run_export)

    imp = sub.add_parser("import", help="read shard files into the report store")
    _common(imp)
    imp.add_argument("--from", dest="source", type=Path, required=True, help="shard directory")
    imp.set_defaults(run=run_import)

    rebuild = sub.add_parser("rebuild", help="recompute statistics from the report log")
    _common(rebuild)
    rebuild.add_argument("--json", action="store_true", help="machine-readable output")
    rebuild.set_defaults(run=run_rebuild)

    job = sub.add_parser(
        "job",
        help="aggregate shard files with Apache Beam (extra [beam])",
        allow_abbrev=False,
        epilog="Other options go to Beam's PipelineOptions, e.g. --direct-num-workers 2 "
        "--direct-running-mode multi_processing, or a runner's own options.",
    )
    job.add_argument("--surveys", "--config", dest="config", type=Path, required=True)
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
    job.add_argument("--alpha", type=float, default=0.05)
    job.add_argument("--confidence", type=float, default=0.95)
    job.add_argument("--seed", type=int, help="seed for Monte Carlo and bootstrap tests")
    job.add_argument("--calibration", choices=["auto", "asymptotic", "monte-carlo"], default="auto")
    job.add_argument(
        "--dedup",
        choices=["auto", "always", "never"],
        default="auto",
        help="count repeated report ids once (auto: when the shards are not one export)",
    )
    job.add_argument("--dedup-partitions", type=_positive, default=64)
    job.set_defaults(run=run_job)
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, required=True, help="survey definitions (TOML)")
    parser.add_argument("--db", type=Path, required=True, help="SQLite report store")


def _devices(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", type=Path, required=True, help="device registry (SQLite)")


def _question(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--survey", required=True)
    parser.add_argument("--question", required=True)


def run_serve(args: argparse.Namespace) -> int:
    credentials = _server_credentials(args)
    if args.workers < 1:
        raise UserError("--workers must be at least 1")
    surveys = load_surveys(args.config)
    keys: dict[str, Ed25519PublicKey] = {}
    if args.devices is not None:
        with DeviceRegistry(args.devices) as registry:
            keys = registry.active_keys()
    elif any(s.require_device_auth for s in surveys.values()):
        raise UserError("a survey requires device authentication: pass --devices REGISTRY")
    if args.auth_window <= 0:
        raise UserError("--auth-window must be positive")
    limits = load_limits(args.config)
    if args.workers == 1:
        asyncio.run(_serve(surveys, limits, args, credentials, keys))
        return 0
    if limits:
        raise UserError(
            "per-device limits (rate_per_minute, burst, max_reports_per_device) keep their state "
            "in one process: serve them with --workers 1"
        )
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
        on_serving=serving,
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
    from aggregator.service.server import start_server

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
    print(f"revoked device {device.device_id} (effective at the next server start)")
    return 0


def run_devices(args: argparse.Namespace) -> int:
    with DeviceRegistry(args.devices) as registry:
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


def _load(args: argparse.Namespace):
    surveys = load_surveys(args.config)
    if not args.db.exists():
        raise UserError(f"report store not found: {args.db}")
    try:
        survey, question = ingest.find_question(surveys, args.survey, args.question)
    except ReportRejectedError as exc:
        raise UserError(exc.message) from None
    store = ReportStore(args.db)
    try:
        store.register_question(survey.id, question.id, question.k)
        n, sums = store.statistics(survey.id, question.id)
    finally:
        store.close()
    if n < survey.min_batch_size:
        raise UserError(
            f"{survey.id}/{question.id} has {n} reports; results are released from "
            f"{survey.min_batch_size}",
            status=3,
        )
    return question, ingest.histogram(question, n, sums)


def run_estimate(args: argparse.Namespace) -> int:
    from aggregator.stats import estimate  # SciPy: imported only by the commands that need it

    question, hist = _load(args)
    est = estimate(hist, args.confidence, simultaneous=args.simultaneous)
    if args.json:
        print(json.dumps({"question": question.id, "labels": question.labels, **est.to_dict()}))
    else:
        print(est.summary(question.labels))
    return 0


def run_test(args: argparse.Namespace) -> int:
    from aggregator.stats import goodness_of_fit, independence

    question, hist = _load(args)
    try:
        if args.kind == "gof":
            if not args.p0:
                raise UserError("gof needs --p0 (comma-separated probabilities)")
            p0 = np.array([float(x) for x in args.p0.split(",")])
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
    print(json.dumps(result.to_dict()) if args.json else result.summary())
    return 0


def _open_store(surveys, db: Path) -> ReportStore:
    store = ReportStore(db)
    for survey in surveys.values():
        for question in survey.questions:
            store.register_question(survey.id, question.id, question.k)
    return store


def run_export(args: argparse.Namespace) -> int:
    surveys = load_surveys(args.config)
    if args.survey not in surveys:
        raise UserError(f"unknown survey {args.survey!r}")
    if not args.db.exists():
        raise UserError(f"report store not found: {args.db}")
    store = _open_store(surveys, args.db)
    try:
        manifest = shards.export_survey(store, surveys[args.survey], args.out, args.shards)
    finally:
        store.close()
    print(
        f"exported {manifest.reports} reports of {args.survey} into {len(manifest.shards)} "
        f"shard(s) in {args.out}"
    )
    return 0


def run_import(args: argparse.Namespace) -> int:
    surveys = load_surveys(args.config)
    manifest = shards.read_manifest(args.source)
    survey = surveys.get(manifest.survey.id)
    if survey != manifest.survey:
        raise UserError(
            f"survey {manifest.survey.id!r} in {args.source} differs from (or is missing in) "
            f"{args.config}"
        )
    shards.verify(args.source, manifest)
    store = _open_store(surveys, args.db)
    fresh: list[bool] = []
    try:
        for name, _, _ in manifest.shards:
            batch = []
            for report in shards.read_shard(args.source / name):
                try:
                    batch.append(ingest.validate(report, surveys))
                except ReportRejectedError as exc:
                    raise UserError(f"{name}: invalid report ({exc.code.name}): {exc}") from None
                if len(batch) == 5000:
                    fresh += store.put(batch)
                    batch = []
            fresh += store.put(batch) if batch else []
    finally:
        store.close()
    accepted = sum(fresh)
    duplicate = len(fresh) - accepted
    print(f"imported {accepted} new reports ({duplicate} already present)")
    return 0


def run_rebuild(args: argparse.Namespace) -> int:
    surveys = load_surveys(args.config)
    if not args.db.exists():
        raise UserError(f"report store not found: {args.db}")
    questions = {(s.id, q.id): q for s in surveys.values() for q in s.questions}
    store = ReportStore(args.db)
    try:
        for (survey_id, question_id), question in questions.items():
            store.register_question(survey_id, question_id, question.k)
        before = {key: store.statistics(*key) for key in questions}

        def contribution(survey_id: str, question_id: str, payload: bytes) -> np.ndarray:
            question = questions.get((survey_id, question_id))
            if question is None:
                raise UserError(f"the log holds reports of unknown question {question_id!r}")
            return ingest.contribution(question, payload)

        after = store.rebuild(contribution)
    finally:
        store.close()
    rows = []
    for key in questions:
        n_before, sums_before = before[key]
        n_after, sums_after = after.get(key, (0, np.zeros_like(sums_before)))
        same = n_before == n_after and np.array_equal(sums_before, sums_after)
        rows.append({"survey": key[0], "question": key[1], "n": int(n_after), "matched": same})
    if args.json:
        print(json.dumps(rows))
    else:
        for row in rows:
            status = "matches" if row["matched"] else "DIFFERED (rewritten from the log)"
            print(f"{row['survey']}/{row['question']}: n = {row['n']}, statistics {status}")
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


if __name__ == "__main__":
    sys.exit(main())
