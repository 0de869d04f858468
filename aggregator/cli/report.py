"""``report``: a survey's report (every question, plots, the tests its survey file declares) as
self-contained HTML or Markdown, from a report store (--db) or a running server (--server)."""

from __future__ import annotations

import argparse
import dataclasses
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
    server_surveys,
)
from aggregator.presentation.numbers import reports
from aggregator.survey_file.analyses import load_analyses
from aggregator.survey_file.config import load_surveys

if TYPE_CHECKING:
    from aggregator.loader import SurveyData
    from aggregator.report.content import SurveyReport


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
    report.set_defaults(run=run_report)


def run_report(args: argparse.Namespace) -> int:
    from aggregator.loader import open_survey

    check_source(args)
    if args.server is None:
        return _write(
            args, lambda group: open_survey(args.config, args.db, args.survey, args.side, group)
        )
    survey_id = args.survey or _only_survey(args)
    with connect(args) as analyst:
        if not server_surveys(args, analyst, survey_id):
            raise UserError(f"unknown survey {survey_id!r} at the server {args.server}")
        return _write(args, lambda group: analyst.open_survey(survey_id, args.side, group))


def _only_survey(args: argparse.Namespace) -> str:
    """With --server and no --survey: the one survey --config defines."""
    surveys = load_surveys(args.config) if args.config is not None else {}
    if len(surveys) != 1:
        raise UserError("--survey is needed with --server (unless --config defines one survey)")
    return next(iter(surveys))


def _write(args: argparse.Namespace, read: Callable[[str | None], SurveyData]) -> int:
    """Build the report from what ``read(group)`` gives (one group, or None: all pooled) and
    write it."""
    from aggregator.report import build_report, render_html, render_markdown

    data = read(args.group)
    analyses = (
        load_analyses(args.config, {data.survey.id: data.survey})[data.survey.id]
        if args.config is not None
        else []
    )
    histograms = {question_id: item.histogram for question_id, item in data.items()}
    compared = {g: read(g) for g in sorted({g for a in analyses for g in a.groups or ()})}
    group_histograms = {
        (question_id, g): item.histogram
        for g, read_g in compared.items()
        for question_id, item in read_g.items()
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
    if args.server is not None:
        counts = {
            (question_id, g): item.n
            for g, read_g in {"": data, **compared}.items()
            for question_id, item in read_g.items()
            if not item.released
        }
        report = _with_counts(report, counts)
    text = render_html(report) if args.format == "html" else render_markdown(report)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({len(report.questions)} questions)")
    return 0


def _with_counts(report: SurveyReport, counts: Mapping[tuple[str, str], int]) -> SurveyReport:
    """The report with the counts of questions and groups the server withheld (below
    min_batch_size it releases their count only, so their histograms were empty) in the
    sentences that say so, as a report read from a store says them."""
    from aggregator.report.content import TestSection

    sections = []
    for section in report.questions:
        qid, threshold = section.question.id, section.min_batch_size
        n = counts.get((qid, ""), section.n)
        tests = []
        for test in section.tests:
            groups = test.analysis.groups or ()
            small = [g for g in groups if counts.get((qid, g), threshold) < threshold]
            if n < threshold:
                why = f"not run: {reports(n)}, results are released from {threshold}"
            elif small and test.result is None:
                why = f"not run: {small[0]} has {reports(counts[(qid, small[0])])}"
                why += f", results are released from {threshold}"
            else:
                why = test.sentence
            tests.append(TestSection(test.analysis, test.result, why))
        sections.append(dataclasses.replace(section, n=n, tests=tuple(tests)))
    return dataclasses.replace(report, questions=tuple(sections))
