"""The questions' statistics in a report store file (SQLite): read a question's (n, sums) on
a side and of a group, write them back, and add new reports' rows to them exactly."""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing

import numpy as np

from aggregator.store.errors import StoreError
from aggregator.store.sqlite.connection import read_only


def read_statistics(
    path: str | os.PathLike[str],
    survey_id: str,
    question_id: str,
    side: int = 0,
    group: str = "",
) -> tuple[int, np.ndarray]:
    """A question's committed (n, int64 sums) on ``side`` and of ``group`` ('': pooled), read
    from the file on a connection of its own: any process may call it while another process's
    ReportStore writes (WAL readers)."""
    with closing(read_only(os.fspath(path))) as conn:
        n, sums = read_side(conn, survey_id, question_id, side, group)
    return n, np.array(sums, dtype=np.int64)


def read_side(
    conn: sqlite3.Connection, survey_id: str, question_id: str, side: int = 0, group: str = ""
) -> tuple[int, list[int]]:
    """(n, sums) of a registered question on ``side``, of one ``group`` ('': all groups); a
    side or group with no reports is (0, zeros)."""
    key = (survey_id, question_id)
    row = conn.execute(
        "SELECT n, sums, k FROM statistics WHERE survey_id = ? AND question_id = ?", key
    ).fetchone()
    if row is None:
        raise StoreError(f"unknown question {survey_id}/{question_id}")
    if group:
        sql = (
            "SELECT n, sums FROM group_statistics WHERE survey_id = ? AND question_id = ?"
            " AND side = ? AND group_value = ?"
        )
        found = conn.execute(sql, (*key, side, group)).fetchone()
        if found is None:
            return 0, [0] * row[2]
        row = found
    elif side:
        sql = "SELECT n, sums FROM side_statistics WHERE survey_id = ? AND question_id = ?"
        found = conn.execute(sql + " AND side = ?", (*key, side)).fetchone()
        if found is None:
            return 0, [0] * row[2]
        row = found
    return row[0], np.frombuffer(row[1], dtype="<i8").tolist()


def write_statistics(
    conn: sqlite3.Connection,
    survey_id: str,
    question_id: str,
    n: int,
    sums: list[int],
    side: int = 0,
    group: str = "",
) -> None:
    try:
        blob = np.array(sums, dtype="<i8").tobytes()
    except OverflowError:
        raise StoreError(f"sums of {survey_id}/{question_id} overflow int64") from None
    if group:
        conn.execute(
            "INSERT OR REPLACE INTO group_statistics VALUES (?, ?, ?, ?, ?, ?)",
            (survey_id, question_id, side, group, n, blob),
        )
        return
    if side:
        conn.execute(
            "INSERT OR REPLACE INTO side_statistics VALUES (?, ?, ?, ?, ?)",
            (survey_id, question_id, side, n, blob),
        )
        return
    conn.execute(
        "UPDATE statistics SET n = ?, sums = ? WHERE survey_id = ? AND question_id = ?",
        (n, blob, survey_id, question_id),
    )


def accumulate(n: int, sums: list[int], rows: np.ndarray) -> tuple[int, list[int]]:
    """(n, sums) plus the rows of an (m, k) int64 matrix, exactly: numpy's int64 sums would wrap
    silently on overflow, so huge values are summed as Python ints (and write_statistics
    rejects out-of-range sums)."""
    bound = max(int(rows.max()), -int(rows.min())) if rows.size else 0  # no float copy
    if bound * len(rows) < 2**62:
        delta = rows.sum(axis=0).tolist()
    else:
        delta = [int(x) for x in rows.astype(object).sum(axis=0)]
    return n + len(rows), [a + b for a, b in zip(sums, delta, strict=True)]
