"""The design rows of each released snapshot in the shared PostgreSQL store (docs/designs.md,
docs/threat-model.md "What is released"): what the SQLite engine's design_releases.py keeps.

When a node moves a cell's release (aggregator/store/postgres/analysis.py), the same transaction
replaces the cell's rows here by its per key statistics (design.py's shards, summed), read with
the cell's (n, sums) in ONE statement: in READ COMMITTED a statement sees one committed state,
and an ingest commit adds to the statistics and the key rows together, so the released n is the
sum of the released rows' n whatever the other nodes commit meanwhile. A design-based answer of
the Analyst service reads only these rows, on any node: its n is the released n, and it moves
exactly when the release does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import psycopg

from aggregator.store.design_statistics import KeyStatistics
from aggregator.store.errors import StoreError
from aggregator.store.releases import Cell
from aggregator.store.releases import Snapshot as Released

_WHERE = "survey_id = %s AND question_id = %s AND side = %s AND group_value = %s"
#: The cell's statistic shards (key NULL) and design key shards, and a zero row of the
#: question's length (so a cell without reports reads (0, zeros)), from one snapshot.
_CURRENT = f"""SELECT NULL::text AS design_key, 0::bigint AS n,
    array_fill(0::bigint, ARRAY[k]) AS sums, NULL::double precision[] AS squares, -1 AS shard
FROM questions WHERE survey_id = %s AND question_id = %s
UNION ALL
SELECT NULL, n, sums, NULL, shard FROM statistic_shards WHERE {_WHERE}
UNION ALL
SELECT design_key, n, sums, squares, shard FROM design_statistic_shards WHERE {_WHERE}
ORDER BY shard"""
_INSERT = "INSERT INTO design_releases VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"


def current(conn: psycopg.Connection, cell: Cell) -> tuple[Released, list[KeyStatistics]]:
    """The cell's committed (n, sums) and its per key statistics in key order, their shards
    summed in shard order, of one committed state (one statement); StoreError for an unknown
    question."""
    rows = conn.execute(_CURRENT, (*cell[:2], *cell, *cell)).fetchall()
    if not rows:
        raise StoreError(f"unknown question {cell[0]}/{cell[1]}")
    n, sums = 0, [0] * len(rows[0][2])
    keys: dict[str, tuple[int, list[int], np.ndarray]] = {}
    for key, shard_n, shard_sums, shard_squares, _ in rows:
        if key is None:
            n += shard_n
            sums = [a + b for a, b in zip(sums, shard_sums, strict=True)]
            continue
        before = keys.get(key, (0, [0] * len(sums), np.zeros(len(sums))))
        keys[key] = (
            before[0] + shard_n,
            [a + b for a, b in zip(before[1], shard_sums, strict=True)],
            before[2] + np.asarray(shard_squares, dtype=np.float64),
        )
    group = cell[3]
    stats = [_statistics(group, key, *keys[key]) for key in sorted(keys)]  # as SQLite's order
    return (n, sums), stats


def replace(conn: psycopg.Connection, cell: Cell, rows: Sequence[KeyStatistics]) -> None:
    """Inside the transaction that moves ``cell``'s release: its design rows become ``rows``."""
    conn.execute(f"DELETE FROM design_releases WHERE {_WHERE}", cell)
    if rows:
        conn.cursor().executemany(
            _INSERT,
            [
                (*cell, row.key, row.n, [int(x) for x in row.sums], row.squares.tolist())
                for row in rows
            ],
        )


def released(
    conn: psycopg.Connection, cells: Sequence[Cell]
) -> dict[Cell, tuple[int, list[KeyStatistics]]]:
    """On the caller's (REPEATABLE READ) transaction: of each cell with a released snapshot, its
    released n and design rows in key order (none: a release taken before design rows were
    snapshotted, or of a survey without a design; the Analyst tells them apart by the n)."""
    found = {}
    for cell in dict.fromkeys(cells):
        row = conn.execute(f"SELECT n FROM releases WHERE {_WHERE}", cell).fetchone()
        if row is None:
            continue
        rows = conn.execute(
            "SELECT design_key, n, sums, squares FROM design_releases"
            f' WHERE {_WHERE} ORDER BY design_key COLLATE "C"',
            cell,
        )
        found[cell] = (
            int(row[0]),
            [_statistics(cell[3], key, n, sums, squares) for key, n, sums, squares in rows],
        )
    return found


def _statistics(group: str, key: str, n: int, sums: list[int], squares) -> KeyStatistics:
    return KeyStatistics(
        group,
        key,
        int(n),
        np.array(sums, dtype=np.int64),
        np.asarray(squares, dtype=np.float64),
    )
