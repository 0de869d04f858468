"""The confirmation side's state in the report store: the preregistered plan (its text, SHA-256
and time), the sealed results, or the reusable holdout's counters and query log.

One mode per survey: a preregistered plan ("plan") or SparseValidate ("holdout"), whichever is
used first; the other is then refused. A registered plan is final (registering the identical
text again is a no-op). The confirmation side is readable (estimates, tests, reports) only once
a plan's results are sealed, never in holdout mode. Sealing and holdout queries run in one write
transaction on the store's writer thread, so they are atomic with respect to uploads, and
sealing closes the confirmation side to new reports in that same transaction.

The statistics are computed by the caller (``compute``), since the store never imports them.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import numpy as np

from aggregator.errors import ConfirmationError
from aggregator.histogram import Histogram
from aggregator.store.definitions import has_table
from aggregator.store.file_kind import open_read_only
from aggregator.store.ingest import histogram
from aggregator.store.report_store import (
    CONFIRMATION,
    STORE_KIND,
    ReportStore,
    StoreError,
    read_side,
)
from client.survey import SurveySpec

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
    if side != CONFIRMATION:
        return
    current = state(conn, survey.id)
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


def preregister(store: ReportStore, survey: SurveySpec, plan: str, sha256: str) -> tuple:
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


def seal(
    store: ReportStore, survey: SurveySpec, compute: Callable[[str, Histograms], dict]
) -> tuple[Confirmation, bool]:
    """Run the registered plan once: ``compute(plan text, confirmation histograms)`` gives the
    record (with its ``sealed_at``),
    stored with the time and the confirmation side closed, atomically. (state, already): a
    sealed survey is answered with its stored record, unchanged, and ``compute`` is not run."""

    def run(conn: sqlite3.Connection) -> tuple[Confirmation, bool]:
        _create(conn)
        current = state(conn, survey.id)
        if current is None or current.mode != "plan":
            what = "no plan is registered" if current is None else "it is a reusable holdout"
            raise ConfirmationError(f"survey {survey.id}: nothing to confirm: {what}")
        if current.sealed is not None:
            return current, True
        record = compute(current.plan_text(), side_histograms(conn, survey, CONFIRMATION))
        text = json.dumps(record, sort_keys=True)
        conn.execute(
            "UPDATE confirmations SET sealed = ?, sealed_at = ? WHERE survey_id = ?",
            (text, record["sealed_at"], survey.id),
        )
        store.close_confirmation(survey.id)
        return replace(current, sealed=text, sealed_at=record["sealed_at"]), False

    return store.run_in_writer(run)


def holdout_query(
    store: ReportStore,
    survey: SurveySpec,
    parameters: dict | None,
    query: tuple[str, str],
    compute: Callable[[dict, Histograms], tuple[dict, bool, float]],
) -> dict:
    """One SparseValidate query ``(question_id, test)``: ``compute(holdout state, confirmation
    histograms)`` gives (new state, reject, level), stored with the query in one transaction.
    The first query opens the holdout with ``parameters`` (alpha, m, budget; None: the
    defaults); later ones give the same or None. Returns the new state."""
    if not survey.split:
        raise ConfirmationError(f"survey {survey.id} has no confirmation side (not split)")

    def run(conn: sqlite3.Connection) -> dict:
        _create(conn)
        current = state(conn, survey.id)
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
        if current is None:
            conn.execute(
                "INSERT INTO confirmations (survey_id, mode, registered_at, holdout)"
                " VALUES (?, 'holdout', ?, ?)",
                (survey.id, _now(), json.dumps(held)),
            )
        new, reject, level = compute(held, side_histograms(conn, survey, CONFIRMATION))
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


def _create(conn: sqlite3.Connection) -> None:
    for statement in _SCHEMA:
        conn.execute(statement)
