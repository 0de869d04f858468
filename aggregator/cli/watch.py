"""``watch``: a live table of anytime-valid results as reports arrive (docs/monitoring.md).

Each refresh asks for every watched analysis at its latest look: over a running server's
Analyst service (``--server``, the Monitor RPC) or from a report store's release history
(``--db``, read only). The looks are the releases, so the numbers are those every other client
sees, and looking as often as you like costs no error rate: the intervals are confidence
sequences and the p-values anytime-valid. ``--until-stop`` exits 0 once a stopping rule fires
(the e-value passes 1/alpha, or n reaches max_n); Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import functools
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from aggregator.cli.common import (
    Subcommands,
    UserError,
    add_command,
    add_side_option,
    add_source_options,
    check_source,
    connect,
    find_survey,
    null_distribution,
    positive,
    server_surveys,
    side_of,
)
from aggregator.errors import InsufficientDataError
from aggregator.remote import NotReleasedError, RemoteAnalyst, RemoteError
from aggregator.stats.anytime.names import ANALYSES, CONTINUE, SEQUENCES_ONLY
from aggregator.survey_file.analyses import Analysis, check_independent, load_analyses
from aggregator.survey_file.config import load_scores, load_surveys
from aggregator.survey_file.design import design_refusal
from client.survey import SurveyError, SurveySpec
from protos.ldp.v1 import ldp_pb2

if TYPE_CHECKING:  # the report package loads SciPy: not on serve's import path
    from aggregator.report.sequential import SequentialSection

#: Status codes that mean "try again soon" while watching (not a mistake of the request).
TRANSIENT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)
#: Exit status of --timeout without a stopping rule firing.
NO_STOP = 1


@dataclass(frozen=True)
class Watched:
    """One analysis to watch: what the Monitor RPC takes."""

    title: str
    question: str
    analysis: str
    alpha: float = 0.05
    p0: tuple[float, ...] | None = None
    groups: tuple[str, str] | None = None
    max_n: int | None = None
    scores: tuple[float, ...] | None = None


def add_commands(subparsers: Subcommands) -> None:
    watch = add_command(
        subparsers,
        "watch",
        "live anytime-valid results as reports arrive: confidence sequences, e-values, stopping "
        "rules (read only)",
    )
    add_source_options(watch)
    watch.add_argument("--survey", required=True, help="survey id")
    watch.add_argument(
        "--question",
        help="watch this question (default: every analysis the survey file (--config) declares "
        "sequential = true)",
    )
    watch.add_argument(
        "--test",
        choices=ANALYSES,
        default="frequencies",
        help="with --question: what to watch (mean_score: an ordinal question's scores from "
        "the survey file, --config)",
    )
    watch.add_argument("--p0", help="goodness_of_fit: the null (uniform, numbers, or @FILE)")
    watch.add_argument("--groups", nargs=2, metavar=("A", "B"), help="two_sample: two groups")
    watch.add_argument("--group", metavar="VALUE", help="one group (default: all pooled)")
    watch.add_argument("--alpha", type=float, default=0.05, help="level of the stopping rule")
    watch.add_argument("--max-n", type=positive, help="with --question: stop at this many reports")
    add_side_option(watch)
    watch.add_argument("--every", type=float, default=10.0, help="seconds between refreshes")
    watch.add_argument("--once", action="store_true", help="draw the table once and exit")
    watch.add_argument(
        "--until-stop",
        action="store_true",
        help="exit 0 once a stopping rule fires (the e-value passes 1/alpha, or max_n)",
    )
    watch.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="give up after this long (exit 1 with --until-stop and no rule fired)",
    )
    watch.set_defaults(run=run_watch)


def run_watch(args: argparse.Namespace) -> int:
    check_source(args)
    if not args.every > 0:
        raise UserError(f"--every must be a positive number of seconds, got {args.every}")
    analyst = connect(args) if args.server is not None else None
    try:
        survey = _survey(args, analyst)
        watched = _watched(args, survey)
        look = (
            _server_look(args, analyst, survey.id)
            if analyst is not None
            else _store_look(args, survey)
        )
        return _loop(args, watched, look)
    finally:
        if analyst is not None:
            analyst.close()


def _survey(args: argparse.Namespace, analyst: RemoteAnalyst | None) -> SurveySpec:
    if analyst is None:
        return find_survey(load_surveys(args.config), args.survey, args.config)
    surveys = server_surveys(args, analyst, args.survey)
    if args.survey not in surveys:
        raise UserError(f"unknown survey {args.survey!r} on the server at {args.server}")
    return surveys[args.survey]


def _watched(args: argparse.Namespace, survey: SurveySpec) -> list[Watched]:
    """The --question's analysis, or the survey file's sequential analyses."""
    if survey.design is not None:
        raise UserError(design_refusal(survey.id))
    for group in ([args.group] if args.group else []) + list(args.groups or []):
        try:
            survey.check_group(group)
        except SurveyError as exc:
            raise UserError(str(exc)) from None
    if args.question is None:
        extra = [flag for flag, value in _question_flags(args) if value]
        if extra:
            raise UserError(f"{extra[0]} goes with --question")
        if args.config is None:
            raise UserError("give --question, or --config with the survey's sequential analyses")
        declared = load_analyses(args.config, {survey.id: survey}).get(survey.id, [])
        sequential = [_declared(a) for a in declared if a.sequential]
        if not sequential:
            raise UserError(
                f"{args.config} declares no sequential analysis of survey {survey.id!r} "
                "(sequential = true); give --question"
            )
        return sequential
    try:
        question = survey.question(args.question)
    except KeyError:
        raise UserError(f"survey {survey.id!r} has no question {args.question!r}") from None
    if (args.p0 is not None) != (args.test == "goodness_of_fit"):
        raise UserError("--p0 goes with --test goodness_of_fit, which needs it")
    if (args.groups is not None) != (args.test == "two_sample"):
        raise UserError("--groups A B goes with --test two_sample, which needs it")
    if args.groups is not None and args.group:
        raise UserError("--group reads one group; two_sample compares --groups A B")
    if args.test not in SEQUENCES_ONLY:  # tests assume independent reports (as the server checks)
        check_independent(survey, question)
    p0 = None if args.p0 is None else tuple(null_distribution(args.p0, question))
    groups = None if args.groups is None else (args.groups[0], args.groups[1])
    title = f"{args.test.replace('_', ' ')}: {question.id}"
    scores = _scores(args, survey.id, question.id) if args.test == "mean_score" else None
    return [Watched(title, question.id, args.test, args.alpha, p0, groups, args.max_n, scores)]


def _scores(args: argparse.Namespace, survey_id: str, question_id: str) -> tuple[float, ...]:
    """An ordinal question's scores, declared in the survey file (as ``ordinal`` reads them)."""
    if args.config is None:
        raise UserError(
            "--test mean_score reads the question's scores from the survey file: give --config"
        )
    scores = load_scores(args.config).get((survey_id, question_id))
    if scores is None:
        raise UserError(
            f"question {question_id} is not declared ordinal: add 'ordinal = true' (scores "
            "1..k) or 'scores = [...]' to it in the survey file"
        )
    return scores


def _declared(analysis: Analysis) -> Watched:
    a = analysis
    return Watched(a.title, a.question_id, a.test, a.alpha, a.p0, a.groups, a.max_n)


def report_sections(
    args: argparse.Namespace, survey: SurveySpec, analyses: list[Analysis]
) -> tuple[SequentialSection, ...]:
    """The report's "as of n" sections of the declared sequential ``analyses``, from the same
    source as the report (``--server`` or ``--db``), with the intervals at every look."""
    from aggregator.report.sequential import SequentialSection

    analyst = connect(args) if args.server is not None else None
    try:
        look = (
            _server_look(args, analyst, survey.id)
            if analyst is not None
            else _store_look(args, survey)
        )
        sections = []
        for analysis in analyses:
            w = _declared(analysis)
            try:
                answer = look(w, True)
            except (NotReleasedError, InsufficientDataError) as exc:
                waiting = f"Not shown yet: {' '.join(str(exc).split())}"
                sections.append(SequentialSection(w.title, w.analysis, waiting=waiting))
            else:
                sections.append(SequentialSection.from_monitor(w.title, w.analysis, answer))
        return tuple(sections)
    finally:
        if analyst is not None:
            analyst.close()


def _question_flags(args: argparse.Namespace) -> list[tuple[str, object]]:
    return [
        ("--p0", args.p0),
        ("--groups", args.groups),
        ("--max-n", args.max_n),
        ("--test", args.test != "frequencies"),
    ]


#: One analysis's answer at its latest look (with the intervals at every look when asked).
Look = Callable[[Watched, bool], ldp_pb2.MonitorResponse]


def _server_look(args: argparse.Namespace, analyst: RemoteAnalyst, survey_id: str) -> Look:
    def look(w: Watched, with_path: bool = False) -> ldp_pb2.MonitorResponse:
        return analyst.monitor(
            survey_id,
            w.question,
            w.analysis,
            p0=w.p0,
            alpha=w.alpha,
            max_n=w.max_n,
            side=args.side,
            group=None if w.groups else args.group,
            groups=w.groups,
            with_path=with_path,
            scores=w.scores,
        )

    return look


def _store_look(args: argparse.Namespace, survey: SurveySpec) -> Look:
    """The same answer from the store's release history (read only; nothing moves)."""
    from aggregator.service.analyst import monitor as monitor_rpc
    from aggregator.store.sqlite import confirmations, release_history
    from aggregator.store.sqlite.reader import StoreReader

    side = side_of(survey, args.side)
    with StoreReader(args.db) as reader:
        reader.check_definitions({survey.id: survey}, args.config)
        confirmations.check_readable(reader.connection, survey, side)
    cache = monitor_rpc.MonitorCache()  # each refresh continues the e-processes

    def look(w: Watched, with_path: bool = False) -> ldp_pb2.MonitorResponse:
        question = survey.question(w.question)
        groups = list(w.groups) if w.groups else [args.group or ""]
        streams = [monitor_rpc.cells(survey, question.id, side, g) for g in groups]
        status = monitor_rpc.from_history(
            functools.partial(release_history.read, str(args.db)),
            w.analysis,
            question,
            streams,
            alpha=w.alpha,
            p0=None if w.p0 is None else list(w.p0),
            max_n=w.max_n,
            with_path=with_path,
            cache=cache,
            scores=None if w.scores is None else list(w.scores),
        )
        return monitor_rpc.response(status, question)

    return look


#: The exit status of a watch stopped by Ctrl-C (as the shell reports a SIGINT).
INTERRUPTED = 130


def _loop(args: argparse.Namespace, watched: list[Watched], look: Look) -> int:
    """Refresh until --once, a fired rule (--until-stop), --timeout or Ctrl-C. Ctrl-C only sets
    a flag, checked after each refresh and ending the wait between refreshes: a KeyboardInterrupt
    raised inside a blocking gRPC call can be swallowed by grpc's completion-queue loop."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        return _refresh(args, watched, look, stop)
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        return _refresh(args, watched, look, stop)
    finally:
        signal.signal(signal.SIGINT, previous)


def _refresh(
    args: argparse.Namespace, watched: list[Watched], look: Look, stop: threading.Event
) -> int:
    started, drawn, first = time.monotonic(), 0, True
    while not stop.is_set():
        try:
            answers = [_answer(look, w) for w in watched]
        except RemoteError as exc:
            if first or exc.code not in TRANSIENT:
                raise
            print(f"{exc}; retrying in {args.every:g} s", file=sys.stderr, flush=True)
        else:
            lines = _table(watched, answers)
            drawn = _draw(lines, drawn)
            fired = [
                (w, a)
                for w, a in zip(watched, answers, strict=True)
                if not isinstance(a, str) and a.decision != CONTINUE
            ]
            if args.until_stop and fired:
                for w, a in fired:
                    print(f"stopping rule fired: {w.title}: {_why(a)}", flush=True)
                return 0
            if args.once:
                return 3 if any(isinstance(a, str) for a in answers) else 0
        first = False
        if args.timeout is not None and time.monotonic() - started + args.every > args.timeout:
            if args.until_stop:
                print(f"no stopping rule fired in {args.timeout:g} s", file=sys.stderr)
                return NO_STOP
            return 0
        stop.wait(args.every)
    return INTERRUPTED


def _answer(look: Look, w: Watched) -> ldp_pb2.MonitorResponse | str:
    """The answer, or why nothing is released yet (a state to show, not an error)."""
    try:
        return look(w, False)
    except (NotReleasedError, InsufficientDataError) as exc:
        return f"waiting: {' '.join(str(exc).split())}"


def _why(answer: ldp_pb2.MonitorResponse) -> str:
    if answer.decision == "reject":
        return (
            f"reject: the e-value passed {1 / answer.alpha:g} at n = {answer.rejected_at} "
            f"(anytime p = {answer.pvalue:.3g}, alpha = {answer.alpha:g})"
        )
    return f"stop at max_n: n = {answer.n} reached max_n = {answer.max_n}"


HEADER = (
    "analysis",
    "category",
    "n",
    "estimate",
    "low",
    "high",
    "e-value",
    "anytime p",
    "decision",
)


def _table(watched: list[Watched], answers: list) -> list[str]:
    """One row per category of each analysis (the test's columns on its first row); an analysis
    with nothing released yet is one line saying so."""
    rows: list[tuple[str, ...]] = [HEADER]
    waiting: dict[int, str] = {}
    for w, a in zip(watched, answers, strict=True):
        if isinstance(a, str):
            waiting[len(rows)] = f"{w.title}  {a}"
            rows.append(("",) * len(HEADER))
            continue
        has_test = a.HasField("evalue")
        test = (f"{a.evalue:.3g}", f"{a.pvalue:.3g}") if has_test else ("-", "-")
        for i, label in enumerate(a.labels):
            head = (w.title, label, str(a.n)) if i == 0 else ("", label, "")
            numbers = (f"{a.estimate[i]:.3f}", f"{a.low[i]:.3f}", f"{a.high[i]:.3f}")
            tail = (*test, a.decision) if i == 0 else ("", "", "")
            rows.append((*head, *numbers, *tail))
    widths = [max(len(row[c]) for row in rows) for c in range(len(HEADER))]
    return [
        waiting.get(i) or "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for i, row in enumerate(rows)
    ]


def _draw(lines: list[str], drawn: int) -> int:
    """Redraw in place on a terminal (move up over the last table); plain lines otherwise."""
    stamp = time.strftime("%H:%M:%S")
    text = [f"as of {stamp} (time-uniform intervals, anytime-valid p-values)", *lines]
    if sys.stdout.isatty() and drawn:
        sys.stdout.write(f"\x1b[{drawn}F\x1b[J")
    sys.stdout.write("\n".join(text) + "\n")
    sys.stdout.flush()
    return len(text)
