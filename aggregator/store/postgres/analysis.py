"""The Analyst's state in the PostgreSQL store, shared by every node: released snapshots (the
rule of aggregator/store/releases.py) with their history and design rows (design_releases.py),
the confirmation side's readability, plan, seal and reusable holdout (the rules of
aggregator/store/confirmations.py). Any node's Analyst answers as any other's, and as a SQLite
store holding the same reports.

A release reads the snapshots and statistics in one REPEATABLE READ snapshot; only when one is
due does it write, in a transaction that takes each cell's advisory lock (in one order) and
decides again on what is committed then (compare-and-set), so two nodes releasing at once store
one snapshot, never two closer than ``step``; each snapshot written is read with its design
rows in one statement and stored with them (design_releases.py). A holdout query commits with
the survey's row held FOR UPDATE and checks its counters are the ones it computed from."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime

import psycopg

from aggregator.store.confirmations import (
    Confirmation,
    Snapshot,
    StateChangedError,
    check_state_readable,
)
from aggregator.store.design_statistics import KeyStatistics
from aggregator.store.model import CONFIRMATION
from aggregator.store.postgres import confirm, design_releases
from aggregator.store.postgres.connection import Transactions
from aggregator.store.postgres.statistics import read_side
from aggregator.store.releases import Cell
from aggregator.store.releases import Snapshot as Released
from client.survey import SurveySpec

#: The first key of the releases' advisory locks (the second: the cell's hash).
_RELEASE_LOCKS = 0x4C445052  # "LDPR"


class PostgresAnalysis:
    """aggregator/store/contract.py's AnalysisStore on a PostgreSQL store."""

    def __init__(self, store: Transactions) -> None:
        self._store = store

    def release(self, cells: Sequence[Cell], step: int) -> dict[Cell, Released | None]:
        """Each cell's released snapshot, after moving those due; see releases.release."""
        step = max(step, 1)
        with self._store.transaction() as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            snapshots, due = _decide(conn, cells, step)
        if not due:
            return snapshots
        with self._store.transaction() as conn:
            for cell in sorted(set(cells)):
                key = "\x1f".join(map(str, cell))
                lock = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"
                conn.execute(lock, (_RELEASE_LOCKS, key))
            snapshots, due = _decide(conn, cells, step)
            moved: dict[Cell, Released] = {}
            for cell in due:
                # read again with its design rows, in one statement: released together (at
                # least the reports decided on, so still due)
                (n, sums), keys = design_releases.current(conn, cell)
                moved[cell] = (n, sums)
                conn.execute(
                    "INSERT INTO releases VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT"
                    " (survey_id, question_id, side, group_value) DO UPDATE"
                    " SET n = excluded.n, sums = excluded.sums",
                    (*cell, n, sums),
                )
                _append_history(conn, cell, snapshots[cell], n, sums)
                design_releases.replace(conn, cell, keys)  # for design-based answers
        return {**snapshots, **moved}

    def design_release(self, cells: Sequence[Cell]) -> dict[Cell, tuple[int, list[KeyStatistics]]]:
        """Of each released cell: its released n and design rows, from one snapshot
        (design_releases.released)."""
        with self._store.transaction() as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            return design_releases.released(conn, cells)

    def release_history(self, cells: Sequence[Cell]) -> list[tuple[Cell, int, list[int]]]:
        """The released snapshots of ``cells`` in release order (release_history.read)."""
        rows = []
        with self._store.transaction() as conn:
            for cell in dict.fromkeys(cells):
                found = conn.execute(
                    "SELECT seq, n, sums FROM release_history WHERE survey_id = %s"
                    " AND question_id = %s AND side = %s AND group_value = %s",
                    cell,
                ).fetchall()
                rows += [(int(seq), cell, int(n), [int(x) for x in s]) for seq, n, s in found]
        rows.sort(key=lambda row: row[0])
        return [(cell, n, sums) for _, cell, n, sums in rows]

    def check_readable(self, survey: SurveySpec, side: int) -> None:
        """ConfirmationError unless ``side`` may be read (confirmations.check_readable)."""
        if side == CONFIRMATION:
            with self._store.transaction() as conn:
                current = confirm.state(conn, survey.id)
            check_state_readable(survey, current)

    def preregister(self, survey: SurveySpec, plan: str, sha256: str) -> tuple[str, bool]:
        return confirm.preregister(self._store, survey, plan, sha256)

    def confirmation_snapshot(self, survey: SurveySpec) -> Snapshot:
        return confirm.snapshot(self._store, survey)

    def prepare_seal(self, survey: SurveySpec) -> None:
        """Close the confirmation side on every node before the plan runs (confirm.close_side)."""
        confirm.close_side(self._store, survey)

    def abandon_seal(self, survey: SurveySpec) -> None:
        """Open the side again: the seal prepared did not happen (confirm.reopen_side)."""
        confirm.reopen_side(self._store, survey)

    def commit_seal(
        self, survey: SurveySpec, snap: Snapshot, record: dict
    ) -> tuple[Confirmation, bool]:
        return confirm.commit_seal(self._store, survey, snap, record)

    def commit_holdout(
        self,
        survey: SurveySpec,
        snap: Snapshot,
        held: dict,
        query: tuple[str, str],
        answer: tuple[dict, bool, float],
    ) -> dict:
        """Store one answered query if the holdout is still as read (compare-and-set, the row
        held FOR UPDATE), else StateChangedError and nothing is written; the new state."""
        new, reject, level = answer
        now = datetime.now(UTC).isoformat(timespec="seconds")
        with self._store.transaction() as conn:
            if snap.state is None:
                opened = conn.execute(
                    "INSERT INTO confirmations (survey_id, mode, registered_at, holdout)"
                    " VALUES (%s, 'holdout', %s, %s) ON CONFLICT (survey_id) DO NOTHING"
                    " RETURNING survey_id",
                    (survey.id, now, json.dumps(held)),
                ).fetchone()
                if opened is None:
                    raise StateChangedError(f"survey {survey.id}: its confirmation side was opened")
            else:
                current = confirm.state(conn, survey.id, "FOR UPDATE")
                if current is None or current.mode != "holdout" or current.holdout != held:
                    raise StateChangedError(f"survey {survey.id}: another holdout query came first")
            conn.execute(
                "UPDATE confirmations SET holdout = %s WHERE survey_id = %s",
                (json.dumps(new), survey.id),
            )
            conn.execute(
                "INSERT INTO holdout_queries VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (survey.id, new["answered"], *query, level, bool(reject), now),
            )
        return new


def _append_history(
    conn: psycopg.Connection, cell: Cell, before: Released | None, n: int, sums: list[int]
) -> None:
    """In the transaction that moves ``cell``'s snapshot: record it in the history of looks
    (and ``before``, the snapshot it replaces, when the cell has no history yet), as
    the SQLite engine's release_history.py does."""
    insert = "INSERT INTO release_history (survey_id, question_id, side, group_value, n, sums)"
    insert += " VALUES (%s, %s, %s, %s, %s, %s)"
    if before is not None:
        recorded = conn.execute(
            "SELECT 1 FROM release_history WHERE survey_id = %s AND question_id = %s"
            " AND side = %s AND group_value = %s LIMIT 1",
            cell,
        ).fetchone()
        if recorded is None:
            conn.execute(insert, (*cell, before[0], before[1]))
    conn.execute(insert, (*cell, n, sums))


def _decide(
    conn: psycopg.Connection, cells: Sequence[Cell], step: int
) -> tuple[dict[Cell, Released | None], dict[Cell, Released]]:
    """(each cell's snapshot, the new snapshot of each cell that is due) on ``conn``."""
    stored: dict[Cell, Released | None] = dict.fromkeys(cells)
    due: dict[Cell, Released] = {}
    for cell in cells:
        row = conn.execute(
            "SELECT n, sums FROM releases WHERE survey_id = %s AND question_id = %s"
            " AND side = %s AND group_value = %s",
            cell,
        ).fetchone()
        if row is not None:
            stored[cell] = (int(row[0]), [int(x) for x in row[1]])
        n, sums = read_side(conn, *cell)
        before = stored[cell]
        if n >= (before[0] if before is not None else 0) + step:
            due[cell] = (n, [int(x) for x in sums])
    return stored, due
