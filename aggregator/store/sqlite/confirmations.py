"""The confirmation side's state in a report store file (SQLite), by the rules of
aggregator/store/confirmations.py: the plan registered, sealed and the holdout's queries
committed in one transaction of the store's single writer (compare-and-set), sealing closing the
confirmation side to new reports in that same transaction; the state and the confirmation-side
histograms read from one read-only snapshot off the writer.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from contextlib import closing
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

import numpy as np

from aggregator.errors import ConfirmationError
from aggregator.store.confirmations import (
    ATTEMPTS,
    Confirmation,
    Designs,
    Histograms,
    Snapshot,
    StateChangedError,
    check_counts_unchanged,
    check_state_readable,
    holdout_state,
    seal_with_retries,
    unchanged_plan,
)
from aggregator.store.ingest import histogram
from aggregator.store.model import CONFIRMATION
from aggregator.store.sqlite import design_statistics
from aggregator.store.sqlite.connection import has_table
from aggregator.store.sqlite.file_kind import open_read_only
from aggregator.store.sqlite.schema import STORE_KIND
from aggregator.store.sqlite.statistics import read_side
from client.survey import SurveySpec


class Writer(Protocol):
    """A SQLite store as the plan, seal and holdout write it: its file, one write transaction
    (ReportStore's writer thread, or a ``--workers`` worker's own connection), and closing the
    confirmation side inside that transaction."""

    @property
    def path(self) -> str: ...

    def run_in_writer(self, fn: Callable[[sqlite3.Connection], Any]) -> Any: ...

    def close_confirmation(self, survey_id: str) -> None: ...


_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS confirmations (
    survey_id TEXT PRIMARY KEY,
    mode TEXT NOT NULL CHECK (mode IN ('plan', 'holdout')),
    plan_sha256 TEXT,
    plan TEXT,
    registered_at TEXT NOT NULL,
    sealed TEXT,
    sealed_at TEXT,
    holdout TEXT
)""",
    """CREATE TABLE IF NOT EXISTS holdout_queries (
    survey_id TEXT NOT NULL,
    query INTEGER NOT NULL,
    question_id TEXT NOT NULL,
    test TEXT NOT NULL,
    level REAL NOT NULL,
    reject INTEGER NOT NULL,
    asked_at TEXT NOT NULL,
    PRIMARY KEY (survey_id, query)
)""",
)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def state(conn: sqlite3.Connection, survey_id: str) -> Confirmation | None:
    """The survey's confirmation state (None: nothing registered), on any connection."""
    if not has_table(conn, "confirmations"):
        return None
    row = conn.execute(
        "SELECT survey_id, mode, plan_sha256, plan, registered_at, sealed, sealed_at, holdout "
        "FROM confirmations WHERE survey_id = ?",
        (survey_id,),
    ).fetchone()
    if row is None:
        return None
    survey, mode, plan_sha256, plan, registered_at, sealed, sealed_at, holdout = row
    held = None if holdout is None else json.loads(holdout)
    return Confirmation(survey, mode, plan_sha256, plan, registered_at, sealed, sealed_at, held)


def read_state(path: str, survey_id: str) -> Confirmation | None:
    """:func:`state` read from the store file on a read-only connection of its own."""
    with closing(open_read_only(path, STORE_KIND)) as conn:
        return state(conn, survey_id)


def check_readable_at(path: str, survey: SurveySpec, side: int) -> None:
    """:func:`check_readable` on the store file, read only."""
    if side == CONFIRMATION:
        with closing(open_read_only(path, STORE_KIND)) as conn:
            check_readable(conn, survey, side)


def check_readable(conn: sqlite3.Connection, survey: SurveySpec, side: int) -> None:
    """ConfirmationError unless ``side`` of ``survey`` may be read directly: the exploration
    side always; the confirmation side only once a preregistered plan's results are sealed."""
    if side == CONFIRMATION:
        check_state_readable(survey, state(conn, survey.id))


def side_histograms(conn: sqlite3.Connection, survey: SurveySpec, side: int) -> Histograms:
    """The histogram of every question of ``survey`` on ``side``, pooled and per group."""
    groups = ("", *(survey.group_label.values if survey.group_label else ()))
    out = {}
    for question in survey.questions:
        for group in groups:
            n, sums = read_side(conn, survey.id, question.id, side, group)
            out[question.id, group] = histogram(question, n, np.array(sums, dtype=np.int64))
    return out


def side_designs(conn: sqlite3.Connection, survey: SurveySpec, side: int) -> Designs:
    """Every question's per design key statistics on ``side`` (none without a design)."""
    if survey.design is None:
        return {}
    return {q.id: design_statistics.read(conn, survey.id, q.id, side) for q in survey.questions}


def preregister(store: Writer, survey: SurveySpec, plan: str, sha256: str) -> tuple:
    """Register the plan: (registered_at, already). The identical plan again is a no-op; any
    other plan, a plan after holdout use, or a survey that is not split is a ConfirmationError."""
    if not survey.split:
        raise ConfirmationError(f"survey {survey.id} has no confirmation side (not split)")

    def register(conn: sqlite3.Connection) -> tuple[str, bool]:
        _create(conn)
        current = state(conn, survey.id)
        if current is None:
            when = _now()
            conn.execute(
                "INSERT INTO confirmations (survey_id, mode, plan_sha256, plan, registered_at)"
                " VALUES (?, 'plan', ?, ?, ?)",
                (survey.id, sha256, plan, when),
            )
            return when, False
        if current.mode == "holdout":
            raise ConfirmationError(
                f"survey {survey.id}: its confirmation side is a reusable holdout already "
                f"({current.holdout_state()['answered']} queries answered); one mode per survey"
            )
        if current.plan_sha256 == sha256:
            return current.registered_at, True
        sealed = "and its results are sealed" if current.sealed else "(final once registered)"
        raise ConfirmationError(
            f"survey {survey.id}: another plan is registered, sha256 {current.plan_sha256} "
            f"{sealed}; a different plan is refused"
        )

    return store.run_in_writer(register)


def snapshot(path: str, survey: SurveySpec) -> Snapshot:
    """The survey's :class:`Snapshot`, on a read-only connection of its own (never the writer's:
    the statistics are computed from it while uploads go on)."""
    with closing(open_read_only(path, STORE_KIND)) as conn:
        conn.execute("BEGIN")  # one read transaction: the state and the histograms agree
        try:
            current = state(conn, survey.id)
            return Snapshot(
                current,
                side_histograms(conn, survey, CONFIRMATION),
                side_designs(conn, survey, CONFIRMATION),
            )
        finally:
            conn.execute("COMMIT")


def commit_seal(
    store: Writer, survey: SurveySpec, snap: Snapshot, record: dict
) -> tuple[Confirmation, bool]:
    """Store ``record`` (computed from ``snap``) and close the confirmation side, in one short
    write transaction that first checks nothing changed since ``snap`` (compare-and-set): the
    same plan, not sealed, the same confirmation-side counts. Sealed meanwhile by another call:
    (that sealed state, True), and ``record`` is dropped. Anything else changed:
    StateChangedError, nothing written."""
    before = snap.state
    counts = snap.counts()
    if before is None:  # seal_plan refused this snapshot already
        raise ConfirmationError(f"survey {survey.id}: nothing to confirm: no plan is registered")

    def run(conn: sqlite3.Connection) -> tuple[Confirmation, bool]:
        current = unchanged_plan(survey.id, state(conn, survey.id), before)
        if current.sealed is not None:
            return current, True
        now = {key: read_side(conn, survey.id, key[0], CONFIRMATION, key[1])[0] for key in counts}
        check_counts_unchanged(survey.id, counts, now)
        text = json.dumps(record, sort_keys=True)
        conn.execute(
            "UPDATE confirmations SET sealed = ?, sealed_at = ? WHERE survey_id = ?",
            (text, record["sealed_at"], survey.id),
        )
        store.close_confirmation(survey.id)
        return replace(current, sealed=text, sealed_at=record["sealed_at"]), False

    return store.run_in_writer(run)


def seal(
    store: Writer, survey: SurveySpec, compute: Callable[[str, Snapshot], dict]
) -> tuple[Confirmation, bool]:
    """Run the registered plan once: ``compute(plan text, confirmation-side snapshot)`` gives the
    record (with its ``sealed_at``), computed from a read snapshot off the writer and stored
    with the confirmation side closed by :func:`commit_seal` (compare-and-set; computed again
    from a fresh snapshot after a concurrent change, up to ATTEMPTS times). (state, already): a
    sealed survey is answered with its stored record, unchanged, and ``compute`` is not run."""
    if not survey.split:
        raise ConfirmationError(f"survey {survey.id} has no confirmation side (not split)")
    return seal_with_retries(
        survey,
        lambda: snapshot(store.path, survey),
        lambda snap, record: commit_seal(store, survey, snap, record),
        compute,
    )


def commit_holdout(
    store: Writer,
    survey: SurveySpec,
    snap: Snapshot,
    held: dict,
    query: tuple[str, str],
    answer: tuple[dict, bool, float],
) -> dict:
    """Store one answered query (``answer`` = (new state, reject, level), computed from ``held``
    of ``snap``) in one short write transaction that first checks the holdout is still as read
    (compare-and-set: no other query, plan or holdout opened meanwhile); else StateChangedError
    and nothing is written. Returns the new state."""
    new, reject, level = answer

    def run(conn: sqlite3.Connection) -> dict:
        _create(conn)
        current = state(conn, survey.id)
        if snap.state is None:
            if current is not None:
                raise StateChangedError(f"survey {survey.id}: its confirmation side was opened")
            conn.execute(
                "INSERT INTO confirmations (survey_id, mode, registered_at, holdout)"
                " VALUES (?, 'holdout', ?, ?)",
                (survey.id, _now(), json.dumps(held)),
            )
        elif current is None or current.mode != "holdout" or current.holdout != held:
            raise StateChangedError(f"survey {survey.id}: another holdout query came first")
        conn.execute(
            "UPDATE confirmations SET holdout = ? WHERE survey_id = ?",
            (json.dumps(new), survey.id),
        )
        conn.execute(
            "INSERT INTO holdout_queries VALUES (?, ?, ?, ?, ?, ?, ?)",
            (survey.id, new["answered"], *query, level, int(reject), _now()),
        )
        return new

    return store.run_in_writer(run)


def holdout_query(
    store: Writer,
    survey: SurveySpec,
    parameters: dict | None,
    query: tuple[str, str],
    compute: Callable[[dict, Snapshot], tuple[dict, bool, float]],
) -> dict:
    """One SparseValidate query ``(question_id, test)``: ``compute(holdout state, confirmation-
    side snapshot)`` gives (new state, reject, level), computed from a read snapshot off the
    writer and stored with the query by :func:`commit_holdout` (compare-and-set; computed again
    from a fresh snapshot after a concurrent query, up to ATTEMPTS times). The first query
    opens the holdout with ``parameters`` (alpha, m, budget; None: the defaults); later ones
    give the same or None. Returns the new state."""
    if not survey.split:
        raise ConfirmationError(f"survey {survey.id} has no confirmation side (not split)")
    for attempt in range(1, ATTEMPTS + 1):
        snap = snapshot(store.path, survey)
        held = holdout_state(snap, survey, parameters)
        try:
            answer = compute(held, snap)
            return commit_holdout(store, survey, snap, held, query, answer)
        except StateChangedError:
            if attempt == ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def _create(conn: sqlite3.Connection) -> None:
    for statement in _SCHEMA:
        conn.execute(statement)


def closed_confirmations(conn: sqlite3.Connection) -> set[str]:
    """The surveys whose confirmation side is closed (results sealed)."""
    try:
        rows = conn.execute("SELECT survey_id FROM confirmations WHERE sealed IS NOT NULL")
        return {row[0] for row in rows}
    except sqlite3.OperationalError:  # no confirmations table: nothing was ever sealed
        return set()
