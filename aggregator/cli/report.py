"""``report``: a survey's report (every question, plots, the tests its survey file declares) as
self-contained HTML or Markdown."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from aggregator.cli.common import (
    Subcommands,
    UserError,
    add_command,
    add_group_option,
    add_side_option,
    add_store_options,
)
from aggregator.survey_file.analyses import load_analyses


def add_commands(subparsers: Subcommands) -> None:
    report = add_command(
        subparsers, "report", "a survey report: every question, plots, declared tests"
    )
    add_store_options(report)
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
    from aggregator.report import build_report, render_html, render_markdown
    from aggregator.report.large import csv_name, full_table_csv, is_large

    data = open_survey(args.config, args.db, args.survey, args.side, args.group)
    analyses = load_analyses(args.config, {data.survey.id: data.survey})[data.survey.id]
    histograms = {question_id: item.histogram for question_id, item in data.items()}
    compared = {g for analysis in analyses for g in analysis.groups or ()}
    label = data.survey.group_label
    if label is not None and not data.group:  # a pooled report: a column per group
        compared |= set(label.values)
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
        sealed=_sealed_record(args.db, data.survey.id) if data.side == "confirmation" else None,
    )
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


def _sealed_record(db: Path, survey_id: str) -> dict:
    """The confirmation side's sealed record (open_survey has checked that it is sealed)."""
    from aggregator.store import confirmations

    state = confirmations.read_state(str(db), survey_id)
    if state is None:  # open_survey refuses an unsealed confirmation side first
        raise UserError(f"survey {survey_id}: no sealed confirmatory results")
    return json.loads(state.sealed_record())
