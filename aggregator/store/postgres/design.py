"""Per design key statistics in the shared PostgreSQL store (docs/designs.md): what the SQLite
engine's design_statistics.py keeps, sharded like the group statistics.

Each ingest transaction adds its stored reports' (n, int64 sums, float64 sums of squares) per
(survey, question, side, group, design key) to the shard it chose for its other statistics, so
devices sharing a popular key seldom wait on one row; a read sums a key's shards. The log keeps
no design key, as in SQLite. :class:`Snapshot` reads the reports and the keys' statistics of one
REPEATABLE READ snapshot, for an export that carries both (docs/shard-format.md)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import TracebackType

import numpy as np
import psycopg

from aggregator.store.design_statistics import KeyStatistics
from aggregator.store.model import STORED, ReportBatch
from aggregator.store.postgres.log import read_reports
from client.survey import SurveySpec

_ADD = """INSERT INTO design_statistic_shards AS s
    (survey_id, question_id, side, group_value, design_key, shard, n, sums, squares)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (survey_id, question_id, side, group_value, design_key, shard) DO UPDATE SET
    n = s.n + excluded.n,
    sums = ARRAY(SELECT a + b FROM unnest(s.sums, excluded.sums) WITH ORDINALITY AS t(a, b, i)
        ORDER BY i),
    squares = ARRAY(SELECT a + b FROM unnest(s.squares, excluded.squares)
        WITH ORDINALITY AS t(a, b, i) ORDER BY i)"""


def add(
    conn: psycopg.Connection, batches: Sequence[ReportBatch], flags: Sequence[int], shard: int
) -> None:
    """Inside the ingest transaction: add the stored reports of batches with design keys to
    their keys' rows of ``shard``, in one order (commits never wait on each other in a cycle)."""
    parts: dict[tuple[str, str, int, str, str], list[np.ndarray]] = {}
    start = 0
    for b in batches:
        mine, start = flags[start : start + len(b)], start + len(b)
        if not b.design_keys:
            continue
        for key, flag, row in zip(b.design_keys, mine, b.contributions, strict=True):
            if flag == STORED:
                parts.setdefault((b.survey_id, b.question_id, b.side, b.group, key), []).append(row)
    for cell in sorted(parts):
        rows = np.stack(parts[cell])
        squares = np.square(rows.astype(np.float64)).sum(axis=0).tolist()
        sums = [int(x) for x in rows.astype(object).sum(axis=0)]  # exact: no int64 wrap
        conn.execute(_ADD, (*cell, shard, len(rows), sums, squares))


def read(
    conn: psycopg.Connection, survey_id: str, question_id: str, side: int = 0
) -> list[KeyStatistics]:
    """Every (group, design key) of the question on ``side`` with reports, its shards summed, in
    key order (as the SQLite engine's design_statistics.read)."""
    rows = conn.execute(
        "SELECT group_value, design_key, n, sums, squares FROM design_statistic_shards"
        " WHERE survey_id = %s AND question_id = %s AND side = %s"
        " ORDER BY group_value, design_key, shard",
        (survey_id, question_id, side),
    )
    out: list[KeyStatistics] = []
    for group, key, n, sums, squares in rows:
        if out and (out[-1].group, out[-1].key) == (group, key):
            last = out.pop()
            n += last.n
            sums = [int(a) + int(b) for a, b in zip(last.sums, sums, strict=True)]
            squares = last.squares + np.asarray(squares, dtype=np.float64)
        out.append(
            KeyStatistics(
                group,
                key,
                int(n),
                np.array(sums, dtype=np.int64),
                np.asarray(squares, dtype=np.float64),
            )
        )
    return out


class Snapshot:
    """One REPEATABLE READ, read-only transaction on ``conn`` (its own, autocommit; closed at the
    end): a survey's reports (``iter_reports``, the export's ReportSource) and its design
    statistics from one snapshot."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn
        self._transaction = self._conn.transaction()

    def __enter__(self) -> Snapshot:
        self._transaction.__enter__()
        self._conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        try:
            self._transaction.__exit__(kind, error, trace)
        finally:
            self._conn.close()

    def design_rows(self, survey: SurveySpec, side: int) -> list[tuple[str, KeyStatistics]]:
        """(question id, statistics) of every key of the survey's questions on ``side``."""
        return [
            (question.id, stat)
            for question in survey.questions
            for stat in read(self._conn, survey.id, question.id, side)
        ]

    def iter_reports(
        self,
        survey_id: str,
        question_id: str | None = None,
        batch: int = 10000,
        side: int | None = None,
    ) -> Iterator[tuple[bytes, str, bytes, str]]:
        """(report_id, question_id, payload, group) in report_id order (a server-side cursor)."""
        return read_reports(self._conn, survey_id, question_id, batch, side)
