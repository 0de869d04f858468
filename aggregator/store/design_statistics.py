"""Per design key sufficient statistics of a survey with a sampling design (docs/designs.md).

For each (survey, question, side, group, design key) the store keeps the number of reports, the
int64 sums of their statistic rows (as the histogram does) and the float64 sums of the rows'
squares, updated in the ingest transaction that stores the reports. With the sampling frame
(stratum, PSU and weight per key) these give every design-based estimate and test: a key's
weight is constant, so its weighted sums are the weight times these sums.

The table is created by the first design report, so a store of surveys without a design (or one
written before designs) has none and pays nothing; readers treat a missing table as no data.
The log does not keep a report's design key: ``ReportStore.rebuild`` recomputes histograms only.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

import numpy as np

_TABLE = """CREATE TABLE IF NOT EXISTS design_statistics (
    survey_id TEXT NOT NULL,
    question_id TEXT NOT NULL,
    side INTEGER NOT NULL,
    group_value TEXT NOT NULL,
    design_key TEXT NOT NULL CHECK (design_key != ''),
    n INTEGER NOT NULL,
    sums BLOB NOT NULL,
    squares BLOB NOT NULL,
    PRIMARY KEY (survey_id, question_id, side, group_value, design_key)
)"""


@dataclass(frozen=True)
class KeyStatistics:
    """One design key's reports of one question (and group): their number, the int64 sums of
    their statistic rows and the float64 sums of the rows' squares, coordinate by coordinate."""

    group: str
    key: str
    n: int
    sums: np.ndarray
    squares: np.ndarray


def add(
    conn: sqlite3.Connection,
    survey_id: str,
    question_id: str,
    side: int,
    group: str,
    key: str,
    rows: np.ndarray,
) -> None:
    """Inside the caller's write transaction: add the (m, k) int64 statistic rows of new reports
    carrying design ``key`` to that key's statistics."""
    if not len(rows):
        return
    conn.execute(_TABLE)
    where = (survey_id, question_id, side, group, key)
    found = conn.execute(
        "SELECT n, sums, squares FROM design_statistics WHERE survey_id = ? AND question_id = ?"
        " AND side = ? AND group_value = ? AND design_key = ?",
        where,
    ).fetchone()
    values = np.asarray(rows, dtype=np.int64)
    n, sums = len(values), values.sum(axis=0, dtype=np.int64)
    squares = np.square(values.astype(np.float64)).sum(axis=0)
    if found is not None:
        n += found[0]
        sums = sums + np.frombuffer(found[1], dtype="<i8")
        squares = squares + np.frombuffer(found[2], dtype="<f8")
    conn.execute(
        "INSERT OR REPLACE INTO design_statistics VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (*where, n, sums.astype("<i8").tobytes(), squares.astype("<f8").tobytes()),
    )


def read(
    conn: sqlite3.Connection, survey_id: str, question_id: str, side: int = 0
) -> list[KeyStatistics]:
    """Every (group, design key) of the question on ``side`` with reports, in key order; none
    from a store that never received a design report."""
    sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'design_statistics'"
    if conn.execute(sql).fetchone() is None:
        return []
    rows = conn.execute(
        "SELECT group_value, design_key, n, sums, squares FROM design_statistics"
        " WHERE survey_id = ? AND question_id = ? AND side = ? ORDER BY group_value, design_key",
        (survey_id, question_id, side),
    )
    return [
        KeyStatistics(
            group,
            key,
            n,
            np.frombuffer(sums, dtype="<i8").astype(np.int64),
            np.frombuffer(squares, dtype="<f8").astype(np.float64),
        )
        for group, key, n, sums, squares in rows
    ]
