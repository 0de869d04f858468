"""The Beam job's other source: the reports of one survey read straight from a shared PostgreSQL
store, from one snapshot of it, in parallel.

The job's launcher opens a read-only REPEATABLE READ transaction and exports its snapshot
(``pg_export_snapshot``) for as long as the pipeline runs (:func:`held_snapshot`); each element is
a range of report ids (by their first byte, :func:`ranges`), and each worker reads its range in a
transaction of its own that imports that snapshot, so the ranges together are exactly the
reports committed when the job started, however many nodes keep ingesting meanwhile, and each
report is read once (ids are the log's primary key: no deduplication needed). Rows are summed per
(question, group) in blocks, with the service's decoding, as from a shard.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import apache_beam as beam
import numpy as np
import psycopg
from psycopg import sql

from aggregator.jobs.partial import Partial
from aggregator.jobs.records import QuestionKey
from aggregator.store.errors import StoreUnavailableError
from aggregator.store.postgres.connection import redacted
from client.survey import SurveySpec

#: Rows fetched from the server per round trip, and summed at once.
BLOCK_ROWS = 20_000


@dataclass(frozen=True)
class TableRange:
    """The reports of ``survey_id`` (on ``side``; None: every side) whose id's first byte is in
    [``lo``, ``hi``), as committed in the exported ``snapshot``."""

    url: str
    snapshot: str
    survey_id: str
    side: int | None
    lo: int
    hi: int


@contextmanager
def held_snapshot(url: str) -> Iterator[str]:
    """Export a snapshot of the store at ``url`` and keep it importable until the block ends."""
    try:
        conn = psycopg.connect(url, connect_timeout=10)
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        row = conn.execute("SELECT pg_export_snapshot()").fetchone()
    except psycopg.Error as exc:
        raise StoreUnavailableError(f"cannot take a snapshot of {redacted(url)}: {exc}") from None
    try:
        yield str(row[0] if row else "")
    finally:
        conn.close()


def ranges(
    url: str, snapshot: str, survey_id: str, side: int | None, parts: int
) -> tuple[TableRange, ...]:
    """``parts`` (1..256) ranges of report ids that together cover every id once."""
    if not 1 <= parts <= 256:
        raise ValueError("parts must be in 1..256")
    bounds = [round(i * 256 / parts) for i in range(parts + 1)]
    return tuple(
        TableRange(url, snapshot, survey_id, side, lo, hi) for lo, hi in itertools.pairwise(bounds)
    )


class ReadTableRange(beam.DoFn):
    """Read one :class:`TableRange` and emit ((survey, question, group), Partial) per question
    and group it holds."""

    def __init__(self, surveys: dict[str, SurveySpec]) -> None:
        self.surveys = surveys

    def process(self, part: TableRange) -> Iterator[tuple[QuestionKey, Partial]]:
        survey = self.surveys[part.survey_id]
        query = "SELECT question_id, group_value, payload FROM reports WHERE survey_id = %s"
        params: list[object] = [part.survey_id]
        if part.side is not None:
            query += " AND side = %s"
            params.append(part.side)
        query += " AND report_id >= %s"
        params.append(bytes([part.lo]))
        if part.hi < 256:
            query += " AND report_id < %s"
            params.append(bytes([part.hi]))
        totals: dict[QuestionKey, Partial] = {}
        try:
            with psycopg.connect(part.url, connect_timeout=10) as conn:
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(part.snapshot))
                with conn.cursor(name="job_range") as cursor:
                    cursor.itersize = BLOCK_ROWS
                    cursor.execute(query, params)
                    while rows := cursor.fetchmany(BLOCK_ROWS):
                        _add(totals, survey, rows)
                conn.rollback()
        except psycopg.Error as exc:  # a runner reports it in one line
            raise RuntimeError(f"reading {part.survey_id} from the store: {exc}") from None
        yield from totals.items()


def _add(totals: dict[QuestionKey, Partial], survey: SurveySpec, rows: list[tuple]) -> None:
    """Sum one block of (question, group, payload) rows into ``totals``."""
    by_key: dict[tuple[str, str], list[bytes]] = {}
    for question_id, group, payload in rows:
        by_key.setdefault((question_id, group), []).append(bytes(payload))
    for (question_id, group), payloads in by_key.items():
        question = survey.question(question_id)
        size = question.mechanism.payload_size
        matrix = np.frombuffer(b"".join(payloads), dtype=np.uint8).reshape(len(payloads), size)
        key = (survey.id, question_id, group)
        partial = Partial.of_payloads(question, matrix)
        totals[key] = totals[key] + partial if key in totals else partial
