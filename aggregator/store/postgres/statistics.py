"""The questions' statistics in the shared PostgreSQL store, read: a question's (n, sums) on a
side and of a group (its shards summed), whether a survey has reports, how many a question has.
(The shards are added to by each commit: engine.py.)"""

from __future__ import annotations

import numpy as np
import psycopg

from aggregator.store.errors import StoreError


def read_side(
    conn: psycopg.Connection, survey_id: str, question_id: str, side: int = 0, group: str = ""
) -> tuple[int, np.ndarray]:
    """(n, int64 sums) of a registered question on ``side`` and of ``group``: its shards summed
    ((0, zeros) before any report)."""
    row = conn.execute(
        "SELECT k FROM questions WHERE survey_id = %s AND question_id = %s",
        (survey_id, question_id),
    ).fetchone()
    if row is None:
        raise StoreError(f"unknown question {survey_id}/{question_id}")
    sums = [0] * row[0]
    n = 0
    shards = conn.execute(
        "SELECT n, sums FROM statistic_shards WHERE survey_id = %s AND question_id = %s"
        " AND side = %s AND group_value = %s",
        (survey_id, question_id, side, group),
    )
    for shard_n, shard_sums in shards:
        n += shard_n
        sums = [a + b for a, b in zip(sums, shard_sums, strict=True)]
    return n, np.array(sums, dtype=np.int64)


def survey_has_reports(conn: psycopg.Connection, survey_id: str) -> bool:
    """True if any question of the survey has a stored report (on any side)."""
    sql = "SELECT 1 FROM statistic_shards WHERE survey_id = %s AND group_value = '' AND n > 0"
    return conn.execute(sql + " LIMIT 1", (survey_id,)).fetchone() is not None


def question_count(conn: psycopg.Connection, survey_id: str, question_id: str) -> int:
    """Reports of a question on every side."""
    sql = (
        "SELECT coalesce(sum(n), 0) FROM statistic_shards WHERE survey_id = %s"
        " AND question_id = %s AND group_value = ''"
    )
    row = conn.execute(sql, (survey_id, question_id)).fetchone()
    return int(row[0]) if row else 0
