"""What the commands of ``ldp-aggregator`` share: the user mistake and its one-line report, the
subcommand factory and the options several commands take, and reading a question's histogram
(or opening the store for writing) after the survey file is checked against the store. The
analysis commands read either a report store (--db) or a running server's Analyst service
(--server, aggregator.remote): the same checks, the same histogram, the same output."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import grpc
import numpy as np

from aggregator.analysis.monitor_answers import Look
from aggregator.analysis.monitoring import store_look
from aggregator.analysis.survey_data import SIDES, below_release
from aggregator.histogram import Histogram
from aggregator.remote import (
    AnalystCredentials,
    NotReleasedError,
    RemoteAnalyst,
    RemoteError,
    read_token,
)
from aggregator.remote.monitoring import server_look
from aggregator.store import checks, ingest
from aggregator.store.checks import ReportRejectedError
from aggregator.store.sqlite import confirmations, pins
from aggregator.store.sqlite.reader import StoreReader
from aggregator.store.sqlite.report_store import ReportStore
from aggregator.survey_file.analyses import check_independent
from aggregator.survey_file.config import load_surveys
from aggregator.survey_file.null_text import NullTextError, parse_null
from client.cli.parsing import DefaultsFormatter
from client.survey import QuestionSpec, SurveyError, SurveySpec
from protos.ldp.v1 import ldp_pb2

PROG = "ldp-aggregator"
#: What ``add_subparsers`` returns: each command group adds its commands to it.
Subcommands = argparse._SubParsersAction


class UserError(Exception):
    """A mistake in the command line or its inputs; ``status`` is the exit code."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def fail(args: argparse.Namespace, message: str, status: int) -> int:
    """One line on stderr (a JSON object with --json); the exit status."""
    message = " ".join(message.split())
    if getattr(args, "json", False):
        print(json.dumps({"error": message, "status": status}), file=sys.stderr)
    else:
        print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def add_command(subparsers: Subcommands, name: str, text: str, **kwargs) -> argparse.ArgumentParser:
    """A subcommand whose one-line help is also its description, with defaults in --help."""
    return subparsers.add_parser(
        name, help=text, description=text, formatter_class=DefaultsFormatter, **kwargs
    )


def positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="machine-readable output (errors too, on stderr)"
    )


def add_store_options(parser: argparse.ArgumentParser) -> None:
    """--config and --db: the survey file and the report store it is checked against."""
    parser.add_argument("--config", type=Path, required=True, help="survey definitions (TOML)")
    parser.add_argument(
        "--db", type=Path, required=True, help="SQLite report store (created 0600 by serve)"
    )


def add_source_options(parser: argparse.ArgumentParser) -> None:
    """Where an analysis command reads: --config and --db (a report store), or --server and the
    analyst's credentials (a running server's Analyst service; --config then optional)."""
    parser.add_argument(
        "--config",
        type=Path,
        help="survey definitions (TOML); required with --db, optional with --server (then "
        "checked against the server's definitions)",
    )
    parser.add_argument("--db", type=Path, help="SQLite report store (or --server)")
    remote = parser.add_argument_group("a running server's Analyst service instead of --db")
    remote.add_argument("--server", metavar="HOST:PORT", help="the server's analyst address")
    remote.add_argument(
        "--tls-ca",
        type=Path,
        metavar="FILE",
        help="CA of the server's certificate (absent: plaintext, to a loopback address only)",
    )
    remote.add_argument("--tls-cert", type=Path, metavar="FILE", help="analyst certificate")
    remote.add_argument("--tls-key", type=Path, metavar="FILE", help="analyst key")
    remote.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="analyst token, one line (sent as 'authorization: Bearer <token>')",
    )


def add_shared_store_option(parser: argparse.ArgumentParser) -> None:
    """--store: a shared PostgreSQL store instead of --db (the commands that read it)."""
    parser.add_argument(
        "--store",
        metavar="URL",
        help="a shared PostgreSQL store instead of --db (postgresql://...; extra [postgres])",
    )


def check_source(args: argparse.Namespace) -> None:
    """Exactly one of --db or --store (with --config) and --server; the credentials only with
    --server."""
    store = getattr(args, "store", None)
    given = [name for name, value in (("--db", args.db), ("--store", store)) if value is not None]
    if args.server is not None:
        given.append("--server")
    if len(given) > 1:
        what = "not both" if len(given) == 2 else "only one of them"
        raise UserError(f"give {' or '.join(given)}, {what}")
    if not given:
        raise UserError("give --db FILE (a report store) or --server HOST:PORT (a running server)")
    if given[0] in ("--db", "--store") and args.config is None:
        raise UserError(f"{given[0]} needs --config (the survey file)")
    if store is not None:
        check_store_url(store)
    given = [args.tls_ca, args.tls_cert, args.tls_key, args.token_file]
    if args.server is None and any(value is not None for value in given):
        raise UserError("--tls-ca, --tls-cert, --tls-key and --token-file go with --server")


def connect(args: argparse.Namespace) -> RemoteAnalyst:
    """The Analyst service --server names, with the credentials given (checked before any
    call: one line for a missing file or plaintext to a remote host)."""
    token = read_token(args.token_file) if args.token_file is not None else None
    credentials = AnalystCredentials(args.tls_ca, args.tls_cert, args.tls_key, token)
    return RemoteAnalyst(args.server, credentials)


def server_surveys(
    args: argparse.Namespace, analyst: RemoteAnalyst, survey_id: str
) -> dict[str, SurveySpec]:
    """The survey as the server defines it ({} if the server has none of that id, so the caller
    says "unknown survey" as on a store); with --config, the file's survey, which must define
    it exactly as the server does (as a store's pinned definitions are checked)."""
    try:
        served = analyst.survey(survey_id)
    except RemoteError as exc:
        if exc.code != grpc.StatusCode.NOT_FOUND:
            raise
        return {}
    if args.config is None:
        return {survey_id: served}
    local = load_surveys(args.config)
    if survey_id not in local:
        raise UserError(
            f"{args.config} does not define survey {survey_id!r}, which the server at "
            f"{args.server} serves"
        )
    if local[survey_id].to_proto() != served.to_proto():
        raise UserError(
            f"{args.config} defines survey {survey_id!r} differently from the server at "
            f"{args.server}; read it with the survey file the server runs (or without --config)"
        )
    return {survey_id: local[survey_id]}


def monitor_look(
    args: argparse.Namespace, survey: SurveySpec, analyst: RemoteAnalyst | None
) -> Look:
    """How ``watch`` and the report's "as of n" section ask for a monitored analysis: the
    server's Monitor RPC (``analyst``, from --server) or the store's release history (--db,
    read only), on --side and --group."""
    if analyst is not None:
        return server_look(analyst, survey.id, args.side, args.group)
    return store_look(args.db, args.config, survey, side_of(survey, args.side), args.group)


def survey_definitions(args: argparse.Namespace, survey_id: str) -> dict[str, SurveySpec]:
    """The surveys a command reads: the survey file's (--db), or --survey as the server
    defines it (--server; {} when it has none of that id)."""
    check_source(args)
    if args.server is None:
        return load_surveys(args.config)
    with connect(args) as analyst:
        return server_surveys(args, analyst, survey_id)


def add_calibration_option(parser: argparse.ArgumentParser, doc: str | None = None) -> None:
    """--calibration: how a test's p-value is found (aggregator/stats/calibration.py); ``doc``
    names the page that says more."""
    more = f"; {doc}" if doc else ""
    parser.add_argument(
        "--calibration",
        choices=["auto", "asymptotic", "monte-carlo"],
        default="auto",
        help="null distribution of the p-value (auto: simulated where the chi-square limit is "
        f"not accurate{more})",
    )


def add_side_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--side",
        choices=list(SIDES),
        help="split surveys: which side to read (default exploration; confirmation only once "
        "its results are sealed)",
    )


def add_group_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--group",
        metavar="VALUE",
        help="surveys with a group label: read one group (default: all groups pooled)",
    )


def add_question_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--survey", required=True, help="survey id")
    parser.add_argument("--question", required=True, help="question id")


def find_survey(surveys: dict[str, SurveySpec], survey_id: str, config: Path) -> SurveySpec:
    """The survey --survey names; unknown, a mistake that lists the ones the file defines."""
    if survey_id not in surveys:
        defined = ", ".join(sorted(surveys))
        raise UserError(f"unknown survey {survey_id!r}; {config} defines {defined}")
    return surveys[survey_id]


def side_of(survey: SurveySpec, side: str | None) -> int:
    """The side --side names of a split survey (exploration by default); 0 for an unsplit one,
    where --side is a mistake."""
    if side and not survey.split:
        raise UserError(f"survey {survey.id} is not split; --side is for split surveys")
    return SIDES[side or "exploration"] if survey.split else 0


def load_histogram(
    args: argparse.Namespace, *, test: bool = False
) -> tuple[QuestionSpec, Histogram]:
    """The question and its histogram, read only, after the survey file is checked against the
    store's pinned definitions (or, with --server, the released histogram of the server's
    Analyst service); exit 3 below the survey's release threshold. For a ``test``, a question
    whose reports may be clustered by household is refused (ClusteredReportsError).
    A split survey is read on one side (``--side``, exploration by default; the confirmation
    side only once its results are sealed: ConfirmationError otherwise). Sets
    ``args.exploratory`` and ``args.groups`` (what was read) for the output."""
    check_source(args)
    analyst = connect(args) if args.server is not None else None
    try:
        surveys = (
            load_surveys(args.config)
            if analyst is None
            else server_surveys(args, analyst, args.survey)
        )
        try:
            survey, question = checks.find_question(surveys, args.survey, args.question)
        except ReportRejectedError as exc:
            raise UserError(exc.message) from None
        if test:
            check_independent(survey, question)
        side = side_of(survey, args.side)
        args.exploratory = side == ldp_pb2.EXPLORATION
        group = getattr(args, "group", None) or ""
        try:
            if group:
                survey.check_group(group)
        except SurveyError as exc:
            raise UserError(str(exc)) from None
        args.groups = _groups_read(survey, group)
        if analyst is not None:
            try:
                released = analyst.released(survey.id, question.id, args.side, group, test=test)
            except NotReleasedError as exc:
                raise UserError(str(exc), status=3) from None
            if released.groups is not None:  # pooled: the groups the server released and summed
                args.groups["pooled"] = ", ".join(released.groups)
            return question, released.histogram
    finally:
        if analyst is not None:
            analyst.close()
    if getattr(args, "store", None) is not None:
        n, sums = _shared_statistics(args, surveys, survey, question.id, side, group)
    else:
        with StoreReader(args.db) as reader:
            reader.check_definitions(surveys, args.config)
            confirmations.check_readable(reader.connection, survey, side)
            n, sums = reader.statistics(
                survey.id, question.id, question.statistic_size, side, group
            )
    withheld = below_release(survey, question, n, group)
    if withheld:
        raise UserError(withheld, status=3)
    return question, ingest.histogram(question, n, sums)


def _shared_statistics(
    args: argparse.Namespace,
    surveys: dict[str, SurveySpec],
    survey: SurveySpec,
    question_id: str,
    side: int,
    group: str,
) -> tuple[int, np.ndarray]:
    """(n, sums) of a question in a shared PostgreSQL store (--store), after the checks of
    --db: the survey file against the pinned definitions, the side readable."""
    from aggregator.store.postgres import pins
    from aggregator.store.postgres.engine import PostgresStore

    with PostgresStore(args.store) as store:
        pins.check(store, surveys, args.config)
        store.analysis().check_readable(survey, side)
        return store.statistics(survey.id, question_id, side, group)


def _groups_read(survey: SurveySpec, group: str) -> dict[str, str]:
    """What a read of a survey with a group label covers, for the output: the one group, or
    every group pooled; empty for a survey without a group label."""
    label = survey.group_label
    if label is None:
        return {}
    if group:
        return {"group_label": label.name, "group": group}
    return {"group_label": label.name, "group": "", "pooled": ", ".join(label.values)}


def null_distribution(text: str, question: QuestionSpec) -> np.ndarray:
    """--p0 as a distribution over the question's categories: ``uniform``, comma-separated
    numbers in category order, or ``@file`` (aggregator/survey_file/null_text.py)."""
    try:
        return np.array(parse_null(text, question.labels, "--p0"))
    except NullTextError as exc:
        raise UserError(f"question {question.id}: {exc}") from None


def add_store_or_url_options(parser: argparse.ArgumentParser) -> None:
    """--config, and either --db (a SQLite store file) or --store (a shared PostgreSQL store)."""
    parser.add_argument("--config", type=Path, required=True, help="survey definitions (TOML)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", type=Path, help="SQLite report store (or --store)")
    where.add_argument(
        "--store",
        metavar="URL",
        help="a shared PostgreSQL store instead (postgresql://...; extra [postgres])",
    )


def check_store_url(url: str) -> None:
    """--store: a PostgreSQL URL, with the [postgres] extra installed; else a UserError."""
    if not url.startswith(("postgresql://", "postgres://")):
        raise UserError("--store takes a PostgreSQL URL: postgresql://USER@HOST/DATABASE")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise UserError(
            "--store needs the PostgreSQL driver: pip install 'ldp-survey[postgres]'"
        ) from None


def open_store(surveys: dict[str, SurveySpec], db: Path, where: object) -> ReportStore:
    """The store for writing, with every question checked against its pinned definition."""
    store = ReportStore(db)
    try:
        pins.register(store, surveys, where)
    except BaseException:
        store.close()
        raise
    return store
