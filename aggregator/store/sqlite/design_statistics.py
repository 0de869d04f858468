"""Per design key sufficient statistics in a report store file (SQLite): added in the ingest
transaction, merged from an import, read per question (aggregator/store/design_statistics.py:
what they are and how they are used).

The table is created by the first design report, so a store of surveys without a design (or one
written before designs) has none and pays nothing; readers treat a missing table as no data.
The log does not keep a report's design key: ``ReportStore.rebuild`` recomputes histograms only.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import numpy as np

from aggregator.store.design_statistics import Keyed, KeyStatistics

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
_IN_CHUNK = 500


def add(conn: sqlite3.Connection, batches: Sequence[Keyed]) -> None:
    """Inside the caller's write transaction: add new reports' (m, k) int64 statistic rows to
    their keys' statistics, one read and one write per key touched."""
    pending: dict[tuple, list] = {}
    for where, keys, rows in batches:
        if not len(keys):
            continue
        names, index = np.unique(np.asarray(keys, dtype=str), return_inverse=True)
        values = np.asarray(rows, dtype=np.int64)
        sums = np.zeros((len(names), values.shape[1]), dtype=np.int64)
        squares = np.zeros((len(names), values.shape[1]))
        np.add.at(sums, index, values)
        np.add.at(squares, index, np.square(values.astype(np.float64)))
        counts = np.bincount(index, minlength=len(names))
        for j, name in enumerate(names.tolist()):
            totals = pending.setdefault((*where, name), [0, 0, 0.0])
            totals[0] += int(counts[j])
            totals[1] = totals[1] + sums[j]
            totals[2] = totals[2] + squares[j]
    _write(conn, pending)


def merge(
    conn: sqlite3.Connection, rows: Sequence[tuple[tuple[str, str, int], KeyStatistics]]
) -> None:
    """Inside the caller's write transaction: add per-key totals (an imported export's) to the
    store's; each row is ((survey, question, side), one group and key's statistics)."""
    pending: dict[tuple, list] = {}
    for where, stat in rows:
        totals = pending.setdefault((*where, stat.group, stat.key), [0, 0, 0.0])
        totals[0] += stat.n
        totals[1] = totals[1] + np.asarray(stat.sums, dtype=np.int64)
        totals[2] = totals[2] + np.asarray(stat.squares, dtype=np.float64)
    _write(conn, pending)


def _write(conn: sqlite3.Connection, pending: dict[tuple, list]) -> None:
    """Add pending (n, sums, squares) per (survey, question, side, group, key) to the table."""
    if not pending:
        return
    conn.execute(_TABLE)
    for known, merged in _merged(conn, pending).items():
        pending[known] = list(merged)
    conn.executemany(
        "INSERT OR REPLACE INTO design_statistics VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (*cell, n, np.asarray(sums, "<i8").tobytes(), np.asarray(squares, "<f8").tobytes())
            for cell, (n, sums, squares) in pending.items()
        ],
    )


def _merged(conn: sqlite3.Connection, pending: dict[tuple, list]) -> dict[tuple, tuple]:
    """The pending cells plus what the store holds of them already."""
    by_group: dict[tuple, list[str]] = {}
    for cell in pending:
        by_group.setdefault(cell[:4], []).append(cell[4])
    out = {}
    for group, keys in by_group.items():
        for start in range(0, len(keys), _IN_CHUNK):
            chunk = keys[start : start + _IN_CHUNK]
            marks = ",".join("?" * len(chunk))
            found = conn.execute(
                "SELECT design_key, n, sums, squares FROM design_statistics WHERE survey_id = ?"
                " AND question_id = ? AND side = ? AND group_value = ?"
                f" AND design_key IN ({marks})",
                (*group, *chunk),
            )
            for key, n, sums, squares in found:
                n0, sums0, squares0 = pending[(*group, key)]
                out[(*group, key)] = (
                    n0 + n,
                    sums0 + np.frombuffer(sums, dtype="<i8"),
                    squares0 + np.frombuffer(squares, dtype="<f8"),
                )
    return out


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
