"""``export``, ``import``, ``rebuild``: the store's reports as shard files and back, and its
statistics recomputed from the report log."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sqlite3
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from aggregator.cli.common import (
    Subcommands,
    UserError,
    add_command,
    add_json_option,
    add_side_option,
    add_store_options,
    add_store_or_url_options,
    check_store_url,
    find_survey,
    open_store,
    positive,
    side_of,
)
from aggregator.store import definitions, ingest, shards
from aggregator.store.checks import ReportRejectedError
from aggregator.store.model import CONFLICT, STORED, StoredReport
from aggregator.store.sqlite import confirmations, design_statistics
from aggregator.store.sqlite.design_import import import_question
from aggregator.store.sqlite.reader import StoreReader
from aggregator.survey_file.config import load_surveys
from client.cli.progress import bar
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2


def add_commands(subparsers: Subcommands) -> None:
    export = add_command(
        subparsers, "export", "write a survey's reports as shard files (store read only)"
    )
    add_store_or_url_options(export)
    export.add_argument("--survey", required=True, help="survey id")
    export.add_argument("--out", type=Path, required=True, help="output directory")
    export.add_argument("--shards", type=positive, default=4, help="number of shard files")
    export.add_argument(
        "--force", action="store_true", help="write into a non-empty output directory"
    )
    add_side_option(export)
    export.set_defaults(run=run_export)

    imp = add_command(subparsers, "import", "read shard files into the report store")
    add_store_options(imp)
    imp.add_argument("--from", dest="source", type=Path, required=True, help="shard directory")
    imp.set_defaults(run=run_import)

    rebuild = add_command(subparsers, "rebuild", "recompute statistics from the report log")
    add_store_options(rebuild)
    add_json_option(rebuild)
    rebuild.set_defaults(run=run_rebuild)


def run_export(args: argparse.Namespace) -> int:
    surveys = load_surveys(args.config)
    survey = find_survey(surveys, args.survey, args.config)
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out {args.out} is a file, not a directory")
    if args.out.is_dir() and any(args.out.iterdir()) and not args.force:
        raise UserError(
            f"--out {args.out} is not empty; choose an empty directory or pass --force to write "
            "into it"
        )
    side = side_of(survey, args.side)
    if args.store is not None:
        manifest = _export_shared(args, surveys, survey, side)
    else:
        with StoreReader(args.db) as reader:
            reader.check_definitions(surveys, args.config)
            confirmations.check_readable(reader.connection, survey, side)
            total = sum(
                reader.statistics(survey.id, q.id, q.statistic_size, side)[0]
                for q in survey.questions
            )
            conn = reader.connection
            conn.execute("BEGIN")  # one snapshot for the reports and the design statistics
            try:
                design = _design_rows(conn, survey, side)
                with bar(total, "export", unit="reports") as progress:
                    manifest = shards.export_survey(
                        reader, survey, args.out, args.shards, progress.update, side, design
                    )
            finally:
                conn.execute("COMMIT")
    which = f" ({shards.SIDE_NAMES[side]} side)" if side else ""
    keys = " and their design statistics" if manifest.design is not None else ""
    print(
        f"exported {manifest.reports} reports of {args.survey}{which}{keys} into "
        f"{len(manifest.shards)} shard(s) in {args.out}"
    )
    return 0


def _design_rows(
    conn: sqlite3.Connection, survey: SurveySpec, side: int
) -> shards.DesignRows | None:
    """The survey's per design key statistics on ``side`` (None for a survey without a design)."""
    if survey.design is None:
        return None
    return [
        (question.id, stat)
        for question in survey.questions
        for stat in design_statistics.read(conn, survey.id, question.id, side)
    ]


def _export_shared(
    args: argparse.Namespace, surveys: dict[str, SurveySpec], survey: SurveySpec, side: int
) -> shards.Manifest:
    """``export --store URL``: the same checks and shards from a shared PostgreSQL store, its
    reports (and a design survey's per-key statistics) read in one snapshot, so the Beam job
    runs on them unchanged."""
    check_store_url(args.store)
    from aggregator.store.postgres import pins
    from aggregator.store.postgres.connection import connect
    from aggregator.store.postgres.design import Snapshot
    from aggregator.store.postgres.engine import PostgresStore

    with PostgresStore(args.store) as store:
        pins.check(store, surveys, args.config)
        store.analysis().check_readable(survey, side)
        total = sum(store.statistics(survey.id, q.id, side)[0] for q in survey.questions)
    with Snapshot(connect(args.store)) as snapshot:  # the reports and the keys: one snapshot
        design = snapshot.design_rows(survey, side) if survey.design is not None else None
        with bar(total, "export", unit="reports") as progress:
            return shards.export_survey(
                snapshot, survey, args.out, args.shards, progress.update, side, design
            )


def run_import(args: argparse.Namespace) -> int:
    surveys = load_surveys(args.config)
    manifest = shards.read_manifest(args.source)
    survey = surveys.get(manifest.survey.id)
    if not definitions.reads_as(manifest.survey, survey):
        change = definitions.survey_change(manifest.survey, survey, args.config)
        raise UserError(f"{args.source}: {change}")
    shards.verify(args.source, manifest)
    if survey is not None and survey.design is not None:
        return _import_design_survey(args, surveys, survey, manifest)
    store = open_store(surveys, args.db, args.config)
    fresh: list[int] = []
    try:
        for batch in _validated(args.source, manifest, surveys):
            fresh += store.put(batch)
    finally:
        store.close()
    _imported(args, fresh)
    return 0


def _imported(args: argparse.Namespace, fresh: list[int], design: str = "") -> None:
    """Say what an import stored (``design``: what it did with design statistics)."""
    accepted, conflicts = fresh.count(STORED), fresh.count(CONFLICT)
    duplicate = len(fresh) - accepted - conflicts
    print(f"imported {accepted} new reports ({duplicate} already present){design}")
    if conflicts:
        print(
            f"{args.source}: {conflicts} report ids are stored with other content; "
            "those reports were not imported",
            file=sys.stderr,
        )


def _import_design_survey(
    args: argparse.Namespace,
    surveys: dict[str, SurveySpec],
    survey: SurveySpec,
    manifest: shards.Manifest,
) -> int:
    """Import a design survey's export one question per transaction: its reports (validated as
    keyless: shards carry no keys) with its keys' statistics
    (aggregator/store/sqlite/design_import.py)."""
    try:
        design = shards.read_design(args.source, manifest, survey)
    except shards.ShardFormatError as exc:
        raise UserError(str(exc)) from None
    keyless = {**surveys, survey.id: dataclasses.replace(survey, design=None)}
    known = {question.id for question in survey.questions}
    store = open_store(surveys, args.db, args.config)
    fresh: list[int] = []
    try:
        for question in survey.questions:  # a report of an unknown question: refused with the first

            def mine(question_id: str, this: str = question.id) -> bool:
                return question_id == this or question_id not in known

            batches = _validated(args.source, manifest, keyless, mine)
            reports = [report for batch in batches for report in batch]
            keys = [stat for question_id, stat in design if question_id == question.id]
            fresh += import_question(store, reports, keys)
    finally:
        store.close()
    _imported(args, fresh, ", with their design statistics" if STORED in fresh else "")
    return 0


def _validated(
    source: Path,
    manifest: shards.Manifest,
    surveys: dict[str, SurveySpec],
    keep: Callable[[str], bool] = lambda question_id: True,
) -> Iterator[list[StoredReport]]:
    """The export's reports (of the questions ``keep`` takes) validated for the store, in
    batches of up to 5,000; a one-line UserError for an invalid one."""
    side = shards.side_enum(manifest.side)  # an export holds one side; records do not say it
    for name, _, _ in manifest.shards:
        batch = []
        for report in shards.read_shard(source / name):
            if keep(report.question_id):
                report.side = side
                batch.append(report)
            if len(batch) == 5000:
                yield _valid(name, batch, surveys)
                batch = []
        if batch:
            yield _valid(name, batch, surveys)


def _valid(
    name: str, reports: list[ldp_pb2.Report], surveys: dict[str, SurveySpec]
) -> list[StoredReport]:
    try:
        return ingest.validate_batch(reports, surveys)
    except ReportRejectedError as exc:
        raise UserError(f"{name}: invalid report ({exc.reason.value}): {exc}") from None


def run_rebuild(args: argparse.Namespace) -> int:
    surveys = load_surveys(args.config)
    if not args.db.exists():
        raise UserError(f"report store not found: {args.db}")
    questions = {(s.id, q.id): q for s in surveys.values() for q in s.questions}
    store = open_store(surveys, args.db, args.config)
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
