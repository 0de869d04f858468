"""The design rows of each released snapshot (docs/designs.md, docs/threat-model.md "What is
released").

When :mod:`aggregator.store.sqlite.releases` moves a cell's snapshot, the same write transaction
copies that cell's per design key statistics (:mod:`aggregator.store.sqlite.design_statistics`)
here, replacing the cell's previous copy. A design-based answer of the Analyst service reads only
these rows, so its n is the released n and it moves exactly when the histogram's release moves: it
reveals nothing a release does not. The table is created by the first snapshot of a cell with design
rows, so a store of surveys without a design opens (and releases) unchanged.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import closing

import numpy as np

from aggregator.store.design_statistics import KeyStatistics
from aggregator.store.sqlite.connection import has_table
from aggregator.store.sqlite.file_kind import open_read_only
from aggregator.store.sqlite.schema import STORE_KIND

_SCHEMA = """CREATE TABLE IF NOT EXISTS design_releases (
    survey_id TEXT NOT NULL,
    question_id TEXT NOT NULL,
    side INTEGER NOT NULL,
    group_value TEXT NOT NULL,
    design_key TEXT NOT NULL,
    n INTEGER NOT NULL,
    sums BLOB NOT NULL,
    squares BLOB NOT NULL,
    PRIMARY KEY (survey_id, question_id, side, group_value, design_key)
)"""
_WHERE = "survey_id = ? AND question_id = ? AND side = ? AND group_value = ?"

#: (survey_id, question_id, side, group value or ''), as aggregator.store.releases.Cell.
Cell = tuple[str, str, int, str]


def snapshot(conn: sqlite3.Connection, cell: Cell) -> None:
    """Inside the write transaction that moves ``cell``'s release: replace its design rows by
    the cell's current per key statistics (nothing for a store without design statistics)."""
    if not has_table(conn, "design_statistics"):
        return
    conn.execute(_SCHEMA)
    conn.execute(f"DELETE FROM design_releases WHERE {_WHERE}", cell)
    conn.execute(
        "INSERT INTO design_releases SELECT survey_id, question_id, side, group_value,"
        f" design_key, n, sums, squares FROM design_statistics WHERE {_WHERE}",
        cell,
    )


def released(path: str, cells: Sequence[Cell]) -> dict[Cell, tuple[int, list[KeyStatistics]]]:
    """Of each cell with a released snapshot: its released n and its released design rows, read
    in one read transaction (a cell released before design rows were snapshotted has rows whose
    n do not sum to the released n; the caller refuses it)."""
    with closing(open_read_only(path, STORE_KIND)) as conn:
        conn.execute("BEGIN")
        try:
            if not has_table(conn, "releases"):
                return {}
            counts = {}
            for cell in dict.fromkeys(cells):
                row = conn.execute(f"SELECT n FROM releases WHERE {_WHERE}", cell).fetchone()
                if row is not None:
                    counts[cell] = int(row[0])
            rows = read(conn, list(counts))
        finally:
            conn.execute("COMMIT")
    return {cell: (n, rows[cell]) for cell, n in counts.items()}


def read(conn: sqlite3.Connection, cells: Sequence[Cell]) -> dict[Cell, list[KeyStatistics]]:
    """Each cell's released design rows in key order (empty: none snapshotted)."""
    found: dict[Cell, list[KeyStatistics]] = {cell: [] for cell in cells}
    if not has_table(conn, "design_releases"):
        return found
    for cell in found:
        rows = conn.execute(
            "SELECT group_value, design_key, n, sums, squares FROM design_releases"
            f" WHERE {_WHERE} ORDER BY design_key",
            cell,
        )
        found[cell] = [
            KeyStatistics(
                group,
                key,
                n,
                np.frombuffer(sums, dtype="<i8").astype(np.int64),
                np.frombuffer(squares, dtype="<f8").astype(np.float64),
            )
            for group, key, n, sums, squares in rows
        ]
    return found
