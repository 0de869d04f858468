"""``report``: a survey's report (every question, plots, the tests its survey file declares) as
self-contained HTML or Markdown, from a report store (--db) or a running server (--server)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from aggregator.cli.common import (
    Subcommands,
    UserError,
    add_command,
    add_group_option,
    add_side_option,
    add_source_options,
    check_source,
    connect,
    monitor_look,
    server_surveys,
)
from aggregator.survey_file.analyses import load_analyses
from aggregator.survey_file.config import load_surveys

if TYPE_CHECKING:
    from aggregator.analysis.survey_data import SurveyData
    from aggregator.remote import RemoteAnalyst
    from aggregator.report.content import SurveyReport
    from aggregator.report.sequential import SequentialSection
    from aggregator.survey_file.analyses import Analysis


def add_commands(subparsers: Subcommands) -> None:
    report = add_command(
        subparsers, "report", "a survey report: every question, plots, declared tests"
    )
    add_source_options(report)
    report.add_argument("--survey", help="survey id (optional when the file defines one)")
    report.add_argument("--out", type=Path, required=True, help="file to write")
    report.add_argument(
        "--format", choices=["html", "md"], default="html", help="self-contained HTML or Markdown"
    )
    report.add_argument("--confidence", type=float, default=0.95, help="confidence level")
    report.add_argument("--seed", type=int, default=0, help="seed of Monte Carlo p-values")
    add_side_option(report)
    add_group_option(report)
    report.add_argument(
        "--ignore-design",
        action="store_true",
        help="a survey with a sampling design: report it as a simple random sample (every "
        "estimate and test then says it ignores the sampling design)",
    )
    report.set_defaults(run=run_report)


def run_report(args: argparse.Namespace) -> int:
    from aggregator.analysis.survey_data import open_survey

    check_source(args)
    if args.server is None:
        designed = _has_design(args) and not args.ignore_design
        return _write(
            args,
            lambda group: open_survey(
                args.config, args.db, args.survey, args.side, group, design=designed
            ),
            lambda survey_id: _sealed_record(args.db, survey_id),
            None,
        )
    survey_id = args.survey or _only_survey(args)
    with connect(args) as analyst:
        if not server_surveys(args, analyst, survey_id):
            raise UserError(f"unknown survey {survey_id!r} at the server {args.server}")
        # The confirmation side is readable only once sealed, and Confirm then answers the
        # sealed record unchanged: asked after the read, it never seals anything.
        return _write(
            args,
            lambda group: analyst.open_survey(survey_id, args.side, group),
            lambda survey_id: analyst.confirm(survey_id)[0],
            analyst,
        )


def _has_design(args: argparse.Namespace) -> bool:
    """Whether the survey read from --db has a sampling design (its report is then
    design-based: the design-based estimate is each released question's headline)."""
    surveys = load_surveys(args.config)
    only = next(iter(surveys.values())) if len(surveys) == 1 else None
    survey = surveys.get(args.survey) if args.survey else only
    return survey is not None and survey.design is not None


def _design_answers(
    args: argparse.Namespace,
    data: SurveyData,
    analyses: list[Analysis],
    analyst: RemoteAnalyst | None,
) -> tuple[dict, dict]:
    """The design-based estimates and tests of a survey with a sampling design (none without
    one, or with --ignore-design)."""
    from aggregator.cli.report_design import served_design_answers, stored_design_answers

    if data.survey.design is None or args.ignore_design:
        return {}, {}
    if analyst is not None:
        return served_design_answers(analyst, data, analyses, args.confidence)
    return stored_design_answers(data, analyses, args.confidence, args.seed)


def _only_survey(args: argparse.Namespace) -> str:
    """With --server and no --survey: the one survey --config defines."""
    surveys = load_surveys(args.config) if args.config is not None else {}
    if len(surveys) != 1:
        raise UserError("--survey is needed with --server (unless --config defines one survey)")
    return next(iter(surveys))


def _write(
    args: argparse.Namespace,
    read: Callable[[str | None], SurveyData],
    sealed_record: Callable[[str], dict],
    analyst: RemoteAnalyst | None,
) -> int:
    """Build the report from what ``read(group)`` gives (one group, or None: all pooled) and
    write it, with the full tables of large questions beside it; a survey with a sampling
    design design-based (its estimates and tests from ``analyst`` over --server), unless
    --ignore-design."""
    from aggregator.report import build_report, render_html, render_markdown
    from aggregator.report.large import csv_name, full_table_csv, is_large

    data = read(args.group)
    analyses = (
        load_analyses(args.config, {data.survey.id: data.survey})[data.survey.id]
        if args.config is not None
        else []
    )
    if args.ignore_design:
        analyses = [dataclasses.replace(analysis, design=False) for analysis in analyses]
    designs, design_tests = _design_answers(args, data, analyses, analyst)
    compared = {g for analysis in analyses for g in analysis.groups or ()}
    label = data.survey.group_label
    if label is not None and not data.group:  # a pooled report: a column per group
        compared |= set(label.values)
    by_group = {g: read(g) for g in sorted(compared)}
    group_histograms = {
        (question_id, g): item.stored
        for g, read_g in by_group.items()
        for question_id, item in read_g.items()
        if not item.withheld  # withheld by the server: not given, counted as empty
    }
    report = build_report(
        data.survey,
        {question_id: item.stored for question_id, item in data.items() if not item.withheld},
        analyses,
        args.confidence,
        args.seed,
        side=data.side,
        group=data.group,
        group_histograms=group_histograms,
        sealed=sealed_record(data.survey.id) if data.side == "confirmation" else None,
        designs=designs,
        design_tests=design_tests,
        ignores_design=args.ignore_design and data.survey.design is not None,
    )
    report = _withheld_by_server(report, data, by_group)
    sequential = [analysis for analysis in analyses if analysis.sequential]
    if sequential:  # the "as of n" section (aggregator/report/sequential.py)
        report = dataclasses.replace(report, sequential=_sequential(args, data, sequential))
    tables = {
        section.question.id: csv_name(args.out.stem, section)
        for section in report.questions
        if is_large(section)
    }
    for section in report.questions:
        if section.question.id in tables:
            path = args.out.parent / tables[section.question.id]
            path.write_text(full_table_csv(section), encoding="utf-8")
    render = render_html if args.format == "html" else render_markdown
    args.out.write_text(render(report, tables), encoding="utf-8")
    beside = f"; full tables: {', '.join(tables.values())}" if tables else ""
    print(f"wrote {args.out} ({len(report.questions)} questions{beside})")
    return 0


def _sequential(
    args: argparse.Namespace, data: SurveyData, analyses: list[Analysis]
) -> tuple[SequentialSection, ...]:
    """The "as of n" sections of the declared sequential ``analyses``, from the same source as
    the report (--server or --db), with the intervals at every look."""
    from aggregator.report.sequential import sequential_sections

    analyst = connect(args) if args.server is not None else None
    try:
        return sequential_sections(analyses, monitor_look(args, data.survey, analyst))
    finally:
        if analyst is not None:
            analyst.close()


def _withheld_by_server(
    report: SurveyReport, data: SurveyData, by_group: Mapping[str, SurveyData]
) -> SurveyReport:
    """A server releases nothing below min_batch_size, not even the count: the sections of the
    questions it withheld, and the tests of groups it withheld, say its reason instead of a
    count of 0. A report read from a store has nothing withheld and is returned unchanged."""
    from aggregator.report.content import TestSection

    why = {(qid, ""): item.withheld for qid, item in data.items() if item.withheld}
    why |= {
        (qid, g): item.withheld
        for g, read_g in by_group.items()
        for qid, item in read_g.items()
        if item.withheld
    }
    if not why:
        return report
    sections = []
    for section in report.questions:
        qid = section.question.id
        tests = []
        for test in section.tests:
            held = [why[(qid, g)] for g in ("", *(test.analysis.groups or ())) if (qid, g) in why]
            tests.append(TestSection(test.analysis, None, f"not run: {held[0]}") if held else test)
        reason = why.get((qid, ""), section.withheld)
        sections.append(dataclasses.replace(section, withheld=reason, tests=tuple(tests)))
    return dataclasses.replace(report, questions=tuple(sections))


def _sealed_record(db: Path, survey_id: str) -> dict:
    """The confirmation side's sealed record (open_survey has checked that it is sealed)."""
    from aggregator.store.sqlite import confirmations

    state = confirmations.read_state(str(db), survey_id)
    if state is None:  # open_survey refuses an unsealed confirmation side first
        raise UserError(f"survey {survey_id}: no sealed confirmatory results")
    return json.loads(state.sealed_record())
