"""``preregister``, ``confirm``, ``holdout``: explore, then confirm (docs/adaptive-analysis.md).
Each writes the confirmation state into the store, so each refuses a store a server holds: with
--server it asks that server's Analyst service to do it instead, and prints the same."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from aggregator.analysis.design_data import side_design_data
from aggregator.cli.common import (
    Subcommands,
    UserError,
    add_command,
    add_json_option,
    add_question_options,
    add_source_options,
    check_source,
    connect,
    find_survey,
    null_distribution,
    open_store,
    positive,
    server_surveys,
)
from aggregator.errors import InsufficientDataError
from aggregator.remote import NotReleasedError
from aggregator.store import checks
from aggregator.store.checks import ReportRejectedError
from aggregator.store.confirmations import DEFAULT_HOLDOUT, Snapshot
from aggregator.store.sqlite import confirmations
from aggregator.store.sqlite.report_store import ReportStore
from aggregator.survey_file.config import load_surveys
from aggregator.survey_file.design import IGNORES_DESIGN
from client.survey import SurveySpec

if TYPE_CHECKING:
    from aggregator.confirm.plan import Plan
    from aggregator.remote import RemoteAnalyst
    from aggregator.store.sqlite.lock import StoreLock


def add_commands(subparsers: Subcommands) -> None:
    prereg = add_command(
        subparsers,
        "preregister",
        "register a split survey's confirmatory plan (hashed, timestamped)",
    )
    add_source_options(prereg)
    prereg.add_argument("--survey", required=True, help="survey id")
    prereg.add_argument("--plan", type=Path, required=True, help="plan file (TOML)")
    prereg.set_defaults(run=run_preregister)
    confirm = add_command(
        subparsers, "confirm", "run the registered plan once on the confirmation side and seal it"
    )
    add_source_options(confirm)
    confirm.add_argument("--survey", required=True, help="survey id")
    confirm.add_argument("--seed", type=int, default=0, help="seed of Monte Carlo p-values")
    add_json_option(confirm)
    confirm.set_defaults(run=run_confirm)
    holdout = add_command(
        subparsers, "holdout", "one test on the confirmation side as a reusable holdout (one bit)"
    )
    add_source_options(holdout)
    add_question_options(holdout)
    holdout.add_argument("kind", choices=["gof", "independence"], help="which test")
    holdout.add_argument("--p0", help="gof only: null distribution, as for `test --p0`")
    holdout.add_argument(
        "--alpha", type=float, help="family-wise level over all queries (first query: 0.05)"
    )
    holdout.add_argument("--max-queries", type=positive, help="m, fixed by the first query: 20")
    holdout.add_argument("--max-rejections", type=positive, help="B, fixed by the first query: 3")
    holdout.add_argument("--seed", type=int, default=0, help="seed of Monte Carlo p-values")
    holdout.add_argument(
        "--ignore-design",
        action="store_true",
        help="a survey with a sampling design: test as a simple random sample (with --db; "
        "by default the query is the design-based Rao-Scott test)",
    )
    holdout.set_defaults(run=run_holdout)


def _open_for_writing(
    args: argparse.Namespace,
) -> tuple[dict[str, SurveySpec], SurveySpec, ReportStore, StoreLock]:
    """The survey, and the store opened for writing under the server's lock (a running server
    must be used through its Analyst RPCs instead: it keeps the confirmation state in memory)."""
    from aggregator.store.sqlite.lock import StoreInUseError, StoreLock

    surveys = load_surveys(args.config)
    survey = find_survey(surveys, args.survey, args.config)
    if not args.db.exists():
        raise UserError(f"{args.db}: no such report store")
    try:
        lock = StoreLock(args.db)
    except StoreInUseError as exc:
        raise UserError(f"{exc}; use the Analyst RPCs of that server, or stop it") from None
    try:
        store = open_store(surveys, args.db, args.config)
    except BaseException:
        lock.release()
        raise
    return surveys, survey, store, lock


def _server_survey(args: argparse.Namespace, analyst: RemoteAnalyst) -> dict[str, SurveySpec]:
    """--survey as the server defines it (checked against --config if given)."""
    surveys = server_surveys(args, analyst, args.survey)
    if not surveys:
        raise UserError(f"unknown survey {args.survey!r} at the server {args.server}")
    return surveys


def run_preregister(args: argparse.Namespace) -> int:
    check_source(args)
    if args.server is not None:
        with connect(args) as analyst:
            surveys = _server_survey(args, analyst)
            plan = _plan(args, surveys)
            registration = analyst.preregister(args.survey, plan.text)
        sha256, when = registration.plan_sha256, registration.registered_at
        already = registration.already
    else:
        surveys, survey, store, lock = _open_for_writing(args)
        try:
            plan = _plan(args, surveys)
            when, already = confirmations.preregister(store, survey, plan.text, plan.sha256)
        finally:
            store.close()
            lock.release()
        sha256 = plan.sha256
    state = "already registered at" if already else "registered at"
    print(f"plan sha256 {sha256} {state} {when} for survey {args.survey}")
    print(f"{len(plan.tests)} test(s), {plan.multiplicity} at family-wise alpha {plan.alpha:g}")
    return 0


def _plan(args: argparse.Namespace, surveys: dict[str, SurveySpec]) -> Plan:
    """The plan file --plan, which must be a plan for --survey."""
    from aggregator.confirm.plan import load_plan

    plan = load_plan(args.plan, surveys)
    if plan.survey_id != args.survey:
        raise UserError(f"{args.plan} is a plan for survey {plan.survey_id}, not {args.survey}")
    return plan


def run_confirm(args: argparse.Namespace) -> int:
    from aggregator.confirm.plan import parse_plan
    from aggregator.confirm.run import sealed_record

    check_source(args)
    if args.server is not None:
        if args.seed != 0:
            raise UserError("--seed goes with --db: a server seals with seed 0")
        with connect(args) as analyst:
            _server_survey(args, analyst)
            try:
                record, already = analyst.confirm(args.survey)
            except NotReleasedError as exc:
                raise UserError(f"nothing sealed: {exc}", status=3) from None
        return _print_sealed(args, record, already)
    surveys, survey, store, lock = _open_for_writing(args)

    def compute(plan: str, snap: Snapshot) -> dict:
        designs = side_design_data(survey, snap.designs)
        return sealed_record(parse_plan(plan, surveys), survey, snap.histograms, args.seed, designs)

    try:
        sealed, already = confirmations.seal(store, survey, compute)
    except InsufficientDataError as exc:
        raise UserError(f"nothing sealed: {exc}", status=3) from None
    finally:
        store.close()
        lock.release()
    return _print_sealed(args, json.loads(sealed.sealed_record()), already)


def _print_sealed(args: argparse.Namespace, record: dict, already: bool) -> int:
    from aggregator.confirm.display import sealed_text

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
    parameters = None if given == (None,) * 3 else dict(DEFAULT_HOLDOUT)
    if parameters is not None:
        for key, value in zip(("alpha", "m", "budget"), given, strict=True):
            parameters[key] = parameters[key] if value is None else value
    check_source(args)
    if args.server is not None:
        return _holdout_remote(args, test)
    surveys = load_surveys(args.config)
    try:
        _, question = checks.find_question(surveys, args.survey, args.question)
    except ReportRejectedError as exc:
        raise UserError(exc.message) from None
    p0 = null_distribution(args.p0, question) if args.p0 else None
    _, survey, store, lock = _open_for_writing(args)
    answer: list = []

    design = False if args.ignore_design else None

    def compute(held: dict, snap: Snapshot) -> tuple[dict, bool, float]:
        designs = side_design_data(survey, snap.designs)
        query = (question.id, test, p0, args.seed, designs, design)
        answer.append(holdout_answer(held, survey, snap.histograms, *query))
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
    if args.ignore_design and survey.design is not None:
        print(IGNORES_DESIGN)
    return 0


def _holdout_remote(args: argparse.Namespace, test: str) -> int:
    """One holdout query on the server; it opens a holdout with the default alpha, m and B and
    runs it with seed 0, so those options go with --db only."""
    from aggregator.confirm.display import holdout_text

    given = (args.alpha, args.max_queries, args.max_rejections)
    if given != (None,) * 3 or args.seed != 0 or args.ignore_design:
        raise UserError(
            "--alpha, --max-queries, --max-rejections, --seed and --ignore-design go with "
            "--db: a server opens a holdout with alpha 0.05, m 20, B 3 and runs it with seed 0 "
            "(design-based for a survey with a sampling design)"
        )
    with connect(args) as analyst:
        surveys = _server_survey(args, analyst)
        try:
            _, question = checks.find_question(surveys, args.survey, args.question)
        except ReportRejectedError as exc:
            raise UserError(exc.message) from None
        p0 = null_distribution(args.p0, question) if args.p0 else None
        try:
            answer = analyst.holdout(args.survey, question.id, test, p0)
        except NotReleasedError as exc:
            raise UserError(f"no query used: {exc}", status=3) from None
    print(holdout_text(answer.state, answer.reject, answer.level, question.id, test))
    return 0
