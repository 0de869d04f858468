"""``ldp-aggregator``: serve, estimate, test, export, import, rebuild.

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

import numpy as np

from aggregator import ingest, shards
from aggregator.config import ConfigError, load_surveys
from aggregator.errors import InsufficientDataError, LdpError
from aggregator.ingest import ReportRejectedError
from aggregator.storage import ReportStore, StoreError

PROG = "ldp-aggregator"


class UserError(Exception):
    """A mistake in the command line or its inputs; ``status`` is the exit code."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
    serve.set_defaults(run=run_serve)

    est = sub.add_parser("estimate", help="unbiased frequencies with confidence intervals")
    _common(est)
    _question(est)
    est.add_argument("--confidence", type=float, default=0.95)
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
    return parser


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, required=True, help="survey definitions (TOML)")
    parser.add_argument("--db", type=Path, required=True, help="SQLite report store")


def _question(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--survey", required=True)
    parser.add_argument("--question", required=True)


def run_serve(args: argparse.Namespace) -> int:
    if not args.insecure:
        raise UserError("no transport security configured: pass --insecure for plaintext")
    surveys = load_surveys(args.config)
    asyncio.run(_serve(surveys, args))
    return 0


async def _serve(surveys, args: argparse.Namespace) -> None:
    from aggregator.server import start_server

    running = await start_server(
        surveys, str(args.db), f"{args.host}:{args.port}", reflection=args.reflection
    )
    if args.port_file:
        args.port_file.write_text(f"{running.port}\n")
    print(f"{PROG}: serving {len(surveys)} survey(s) on {args.host}:{running.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print(f"{PROG}: draining and shutting down", flush=True)
    await running.stop(grace=5.0)


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
    est = estimate(hist, args.confidence)
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
            result = goodness_of_fit(hist, p0, args.alpha, args.method, rng=args.seed)
        else:
            if len(question.shape) != 2:
                raise UserError(f"question {question.id} does not have exactly 2 attributes")
            result = independence(hist, question.shape, args.alpha, args.method, rng=args.seed)
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


if __name__ == "__main__":
    sys.exit(main())
