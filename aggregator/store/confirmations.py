"""The confirmation side's state in the report store: the preregistered plan (its text, SHA-256
and time), the sealed results, or the reusable holdout's counters and query log.

One mode per survey: a preregistered plan ("plan") or SparseValidate ("holdout"), whichever is
used first; the other is then refused. A registered plan is final (registering the identical
text again is a no-op). The confirmation side is readable (estimates, tests, reports) only once
a plan's results are sealed, never in holdout mode. Sealing and holdout queries compute their
tests from a read snapshot (:func:`snapshot`), never inside a write transaction; the result is
committed in a short write transaction that first checks the state is still the one read
(compare-and-set: same plan, not sealed, same confirmation-side counts; the holdout's counters
unchanged), and sealing closes the confirmation side to new reports in that same transaction.

The statistics are computed by the caller (``compute``), since the store never imports them.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

import numpy as np

from aggregator.errors import ConfirmationError
from aggregator.histogram import Histogram
from aggregator.store.definitions import has_table
from aggregator.store.ingest import histogram
from aggregator.store.sqlite.file_kind import open_read_only
from aggregator.store.sqlite.report_store import (
    CONFIRMATION,
    STORE_KIND,
    StoreError,
    read_side,
)
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

#: The holdout's family-wise level, m queries and B rejections when nothing else is asked for.
DEFAULT_HOLDOUT = {"alpha": 0.05, "m": 20, "budget": 3}
#: (question id, group value) -> its histogram on one side; group '' pools every group, and a
#: survey with a group label also has each of its groups.
Histograms = dict[tuple[str, str], Histogram]


@dataclass(frozen=True)
class Confirmation:
    """A survey's row: its mode, plan, sealed record (JSON text) or holdout state (dict)."""

    survey_id: str
    mode: str
    plan_sha256: str | None
    plan: str | None
    registered_at: str
    sealed: str | None
    sealed_at: str | None
    holdout: dict | None

    def plan_text(self) -> str:
        """The registered plan (mode "plan"); a plan row without one is a damaged store."""
        if self.plan is None:
            raise StoreError(f"survey {self.survey_id}: a confirmation plan row without its plan")
        return self.plan

    def sealed_record(self) -> str:
        """The sealed results (JSON text) of a sealed plan; asked of an unsealed row, a bug."""
        if self.sealed is None:
            raise StoreError(f"survey {self.survey_id}: its confirmatory results are not sealed")
        return self.sealed

    def holdout_state(self) -> dict:
        """The holdout's state (mode "holdout"); a holdout row without one is a damaged store."""
        if self.holdout is None:
            raise StoreError(f"survey {self.survey_id}: a holdout row without its state")
        return self.holdout


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


def check_state_readable(survey: SurveySpec, current: Confirmation | None) -> None:
    """ConfirmationError unless the confirmation side of ``survey``, in state ``current``, may
    be read directly (every engine's rule: only once a preregistered plan is sealed)."""
    if current is not None and current.sealed is not None:
        return
    if current is not None and current.mode == "holdout":
        why = "it is a reusable holdout: only `holdout` queries may use it"
    elif current is None:
        why = "no confirmatory plan is registered (`preregister`, then `confirm`)"
    else:
        why = "its preregistered plan has not run yet (`confirm` runs it once and seals it)"
    raise ConfirmationError(
        f"survey {survey.id}: the confirmation side cannot be read before its results are "
        f"sealed; {why}"
    )


def side_histograms(conn: sqlite3.Connection, survey: SurveySpec, side: int) -> Histograms:
    """The histogram of every question of ``survey`` on ``side``, pooled and per group."""
    groups = ("", *(survey.group_label.values if survey.group_label else ()))
    out = {}
    for question in survey.questions:
        for group in groups:
            n, sums = read_side(conn, survey.id, question.id, side, group)
            out[question.id, group] = histogram(question, n, np.array(sums, dtype=np.int64))
    return out


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


@dataclass(frozen=True)
class Snapshot:
    """What a seal or a holdout query is computed from: the survey's confirmation state and its
    confirmation-side histograms, read in one read transaction (one consistent snapshot), off
    the store's writer."""

    state: Confirmation | None
    histograms: Histograms

    def counts(self) -> dict[tuple[str, str], int]:
        """n of every (question, group) read: what a seal's commit checks is still current."""
        return {key: hist.n for key, hist in self.histograms.items()}


class StateChangedError(ConfirmationError):
    """The state read for a seal or holdout query changed before its result was committed (a
    concurrent query, seal or confirmation-side upload): nothing was written; compute again
    from a fresh snapshot."""


#: How many times seal and holdout_query compute again after a concurrent change.
ATTEMPTS = 3


def snapshot(path: str, survey: SurveySpec) -> Snapshot:
    """The survey's :class:`Snapshot`, on a read-only connection of its own (never the writer's:
    the statistics are computed from it while uploads go on)."""
    with closing(open_read_only(path, STORE_KIND)) as conn:
        conn.execute("BEGIN")  # one read transaction: the state and the histograms agree
        try:
            current = state(conn, survey.id)
            return Snapshot(current, side_histograms(conn, survey, CONFIRMATION))
        finally:
            conn.execute("COMMIT")


def seal_plan(snap: Snapshot, survey: SurveySpec) -> str | None:
    """The plan text to run for a seal from ``snap``; None when it is sealed already (its
    stored record is the answer). No plan registered, or holdout mode: ConfirmationError."""
    current = snap.state
    if current is None or current.mode != "plan":
        what = "no plan is registered" if current is None else "it is a reusable holdout"
        raise ConfirmationError(f"survey {survey.id}: nothing to confirm: {what}")
    return None if current.sealed is not None else current.plan_text()


def unchanged_plan(
    survey_id: str, current: Confirmation | None, before: Confirmation
) -> Confirmation:
    """The compare-and-set check of a seal on the state read in its write transaction: that
    state, holding the plan of ``before`` (sealed meanwhile by another call, or not);
    StateChangedError when the plan changed."""
    if current is None or current.mode != "plan" or current.plan_sha256 != before.plan_sha256:
        raise StateChangedError(f"survey {survey_id}: its plan changed while it was run")
    return current


def check_counts_unchanged(survey_id: str, counts: dict, now: dict) -> None:
    """StateChangedError unless the confirmation side holds the counts the record was computed
    from (``counts``: (question, group) -> n of the snapshot; ``now``: the same, committed)."""
    if now != counts:
        raise StateChangedError(
            f"survey {survey_id}: confirmation-side reports arrived while its plan ran"
        )


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
    store: Writer, survey: SurveySpec, compute: Callable[[str, Histograms], dict]
) -> tuple[Confirmation, bool]:
    """Run the registered plan once: ``compute(plan text, confirmation histograms)`` gives the
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


def seal_with_retries(
    survey: SurveySpec,
    take: Callable[[], Snapshot],
    commit: Callable[[Snapshot, dict], tuple[Confirmation, bool]],
    compute: Callable[[str, Histograms], dict],
    prepare: Callable[[], None] | None = None,
) -> tuple[Confirmation, bool]:
    """The seal loop every engine shares: ``take`` a snapshot, answer an already sealed survey
    with its record, else ``compute`` the record and ``commit`` it (compare-and-set), again from
    a fresh snapshot after a concurrent change, up to ATTEMPTS times. ``prepare`` runs once,
    before the first computation, and the snapshot is taken again after it (an engine that
    closes the side first)."""
    for attempt in range(1, ATTEMPTS + 1):
        snap = take()
        plan = seal_plan(snap, survey)
        if plan is not None and prepare is not None:
            prepare()
            prepare = None
            snap = take()
            plan = seal_plan(snap, survey)
        if plan is None:
            assert snap.state is not None
            return snap.state, True
        try:
            return commit(snap, compute(plan, snap.histograms))
        except StateChangedError:
            if attempt == ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def holdout_state(snap: Snapshot, survey: SurveySpec, parameters: dict | None) -> dict:
    """The holdout state a query computes from (``snap``'s, or a new holdout opened with
    ``parameters``, None: the defaults). A plan registered, or parameters that differ from the
    open holdout's: ConfirmationError."""
    current = snap.state
    if current is not None and current.mode != "holdout":
        raise ConfirmationError(
            f"survey {survey.id}: a confirmatory plan is registered (sha256 "
            f"{current.plan_sha256}); the holdout is not available; one mode per survey"
        )
    if current is None:
        held = {**(parameters or DEFAULT_HOLDOUT), "answered": 0, "rejections": 0}
    else:
        held = current.holdout_state()
    fixed = {key: held[key] for key in DEFAULT_HOLDOUT}
    if parameters is not None and any(parameters[k] != v for k, v in fixed.items()):
        raise ConfirmationError(
            f"survey {survey.id}: the holdout was opened with alpha {fixed['alpha']:g}, "
            f"m {fixed['m']}, B {fixed['budget']}; they cannot change"
        )
    return held


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
    compute: Callable[[dict, Histograms], tuple[dict, bool, float]],
) -> dict:
    """One SparseValidate query ``(question_id, test)``: ``compute(holdout state, confirmation
    histograms)`` gives (new state, reject, level), computed from a read snapshot off the
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
            answer = compute(held, snap.histograms)
            return commit_holdout(store, survey, snap, held, query, answer)
        except StateChangedError:
            if attempt == ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def _create(conn: sqlite3.Connection) -> None:
    for statement in _SCHEMA:
        conn.execute(statement)
