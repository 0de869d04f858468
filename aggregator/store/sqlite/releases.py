"""Released snapshots in a report store file (SQLite): the rule of aggregator/store/releases.py
with SQLite's single writer. Every snapshot moved is also appended to
:mod:`aggregator.store.sqlite.release_history` (the looks of monitoring), and its per design key
rows are copied to :mod:`aggregator.store.sqlite.design_releases`.

:func:`release` reads the snapshots and statistics in one read transaction of its own,
off the writer. Only when a snapshot is due does it write, in one short write transaction
that decides again on the state it finds there (compare-and-set): two readers racing store one
snapshot, never two closer than ``step``. The table is created by its first write, so stores
made before it open unchanged.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from contextlib import closing
from typing import Any, Protocol

import numpy as np

from aggregator.store.releases import Cell, Snapshot
from aggregator.store.sqlite import design_releases, release_history
from aggregator.store.sqlite.connection import has_table
from aggregator.store.sqlite.file_kind import open_read_only
from aggregator.store.sqlite.schema import STORE_KIND
from aggregator.store.sqlite.statistics import read_side

_SCHEMA = """CREATE TABLE IF NOT EXISTS releases (
    survey_id TEXT NOT NULL,
    question_id TEXT NOT NULL,
    side INTEGER NOT NULL,
    group_value TEXT NOT NULL,
    n INTEGER NOT NULL,
    sums BLOB NOT NULL,
    PRIMARY KEY (survey_id, question_id, side, group_value)
)"""


class Writer(Protocol):
    """The store as :func:`release` needs it: its file, and one write transaction (the
    in-process ReportStore's writer thread, or a ``--workers`` worker's own connection)."""

    @property
    def path(self) -> str: ...

    def run_in_writer(self, fn: Callable[[sqlite3.Connection], Any]) -> Any: ...


def release(store: Writer, cells: Sequence[Cell], step: int) -> dict[Cell, Snapshot | None]:
    """Each cell's released snapshot (None: the cell has never held ``step`` reports), after
    moving those that are due (see the module docstring). Blocking: call it in a thread."""
    step = max(step, 1)
    with closing(open_read_only(store.path, STORE_KIND)) as conn:
        conn.execute("BEGIN")  # the snapshots and the statistics of one committed state
        try:
            snapshots, due = _decide(conn, cells, step)
        finally:
            conn.execute("COMMIT")
    if not due:
        return snapshots
    return store.run_in_writer(lambda conn: _advance(conn, cells, step))


def _decide(
    conn: sqlite3.Connection, cells: Sequence[Cell], step: int
) -> tuple[dict[Cell, Snapshot | None], dict[Cell, Snapshot]]:
    """(each cell's snapshot, the new snapshot of each cell that is due) on ``conn``."""
    stored = _snapshots(conn, cells)
    due = {}
    for cell in cells:
        current = read_side(conn, *cell)
        before = stored[cell]
        if current[0] >= (before[0] if before is not None else 0) + step:
            due[cell] = current
    return stored, due


def _advance(conn: sqlite3.Connection, cells: Sequence[Cell], step: int) -> dict:
    """Inside a write transaction: decide again on what is committed now, store the snapshots
    that are due, and return every cell's snapshot."""
    conn.execute(_SCHEMA)
    snapshots, due = _decide(conn, cells, step)
    for cell, (n, sums) in due.items():
        blob = np.array(sums, dtype="<i8").tobytes()
        conn.execute("INSERT OR REPLACE INTO releases VALUES (?, ?, ?, ?, ?, ?)", (*cell, n, blob))
        release_history.append(conn, cell, snapshots[cell], n, blob)  # the looks of monitoring
        design_releases.snapshot(conn, cell)  # its design rows, for design-based answers
    return {**snapshots, **due}


def _snapshots(conn: sqlite3.Connection, cells: Sequence[Cell]) -> dict[Cell, Snapshot | None]:
    found: dict[Cell, Snapshot | None] = dict.fromkeys(cells)
    if not has_table(conn, "releases"):
        return found
    sql = (
        "SELECT n, sums FROM releases WHERE survey_id = ? AND question_id = ? AND side = ?"
        " AND group_value = ?"
    )
    for cell in cells:
        row = conn.execute(sql, cell).fetchone()
        if row is not None:
            found[cell] = (row[0], np.frombuffer(row[1], dtype="<i8").tolist())
    return found
