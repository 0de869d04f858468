"""Every snapshot each cell has released, in the order released: the looks of anytime-valid
monitoring (docs/monitoring.md, "Looks are release points").

:mod:`aggregator.store.sqlite.releases` keeps only a cell's latest snapshot; each time it moves one,
it calls :func:`append` in the same write transaction, so the history holds exactly the snapshots
ever released, and nothing a read did not already reveal. Rows are numbered by one global sequence:
several cells (the groups of a pooled read, the two groups of a two-sample monitor) merge into looks
deterministically. The table is created by its first write, so stores made before it open unchanged;
a cell released before it existed starts its history at the snapshot it held then.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import closing

import numpy as np

from aggregator.store.sqlite.connection import has_table
from aggregator.store.sqlite.file_kind import open_read_only
from aggregator.store.sqlite.schema import STORE_KIND

_SCHEMA = """CREATE TABLE IF NOT EXISTS release_history (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    survey_id TEXT NOT NULL,
    question_id TEXT NOT NULL,
    side INTEGER NOT NULL,
    group_value TEXT NOT NULL,
    n INTEGER NOT NULL,
    sums BLOB NOT NULL
)"""

#: (survey_id, question_id, side, group value or ''), as in aggregator.store.releases.
Cell = tuple[str, str, int, str]
#: One look of a stream: n and the int64 sums, summed over the stream's cells.
Look = tuple[int, list[int]]


def append(conn: sqlite3.Connection, cell: Cell, before: tuple | None, n: int, blob: bytes) -> None:
    """Inside the write transaction that moves ``cell``'s snapshot to (n, blob): record it (and
    ``before``, the (n, sums) it replaces, when the cell has no history yet)."""
    conn.execute(_SCHEMA)
    sql = "INSERT INTO release_history (survey_id, question_id, side, group_value, n, sums)"
    sql += " VALUES (?, ?, ?, ?, ?, ?)"
    if before is not None and not _recorded(conn, cell):
        conn.execute(sql, (*cell, before[0], np.array(before[1], dtype="<i8").tobytes()))
    conn.execute(sql, (*cell, n, blob))


def _recorded(conn: sqlite3.Connection, cell: Cell) -> bool:
    sql = (
        "SELECT 1 FROM release_history WHERE survey_id = ? AND question_id = ? AND side = ?"
        " AND group_value = ? LIMIT 1"
    )
    return conn.execute(sql, cell).fetchone() is not None


def read(path: str, cells: Sequence[Cell]) -> list[tuple[Cell, int, list[int]]]:
    """The released snapshots of ``cells`` in release order: (cell, n, sums) (read only)."""
    with closing(open_read_only(path, STORE_KIND)) as conn:
        if not has_table(conn, "release_history"):
            return []
        rows = []
        sql = (
            "SELECT seq, n, sums FROM release_history WHERE survey_id = ? AND question_id = ?"
            " AND side = ? AND group_value = ?"
        )
        for cell in dict.fromkeys(cells):
            for seq, n, blob in conn.execute(sql, cell):
                rows.append((seq, cell, n, np.frombuffer(blob, dtype="<i8").tolist()))
    rows.sort(key=lambda row: row[0])
    return [(cell, n, sums) for _, cell, n, sums in rows]


def looks(
    history: Sequence[tuple[Cell, int, list[int]]], streams: Sequence[Sequence[Cell]], size: int
) -> list[list[Look]]:
    """The looks of one or more streams (each the sum of its cells: a group, or every group of
    a pooled read): after each released snapshot of any of their cells, every stream's sum of
    its cells' latest snapshots. A list per look with one (n, sums) per stream."""
    latest: dict[Cell, tuple[int, list[int]]] = {}
    watched = {cell for stream in streams for cell in stream}
    out: list[list[Look]] = []
    for cell, n, sums in history:
        if cell not in watched:
            continue
        latest[cell] = (n, sums)
        look = []
        for stream in streams:
            held = [latest[c] for c in stream if c in latest]
            total = np.zeros(size, dtype=np.int64)
            for _, s in held:
                total += np.asarray(s, dtype=np.int64)
            look.append((sum(count for count, _ in held), total.tolist()))
        out.append(look)
    return out
