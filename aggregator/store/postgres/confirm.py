"""The confirmation side's plan and seal in the PostgreSQL store, consistent across nodes: the
rules of aggregator/store/confirmations.py (one plan per survey, final once registered; a seal
computed from a snapshot and committed by compare-and-set), with locks in place of SQLite's
single writer. A seal first closes the confirmation side holding the survey's
confirmation-side lock (confirmation_lock.py) exclusively; every node's commit of
confirmation-side reports holds it shared and checks the side is open (engine.py), so no node
acknowledges a report the seal did not count.
(The holdout's commit and the Analyst's view of it all: aggregator/store/postgres/analysis.py.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

import psycopg

from aggregator.errors import ConfirmationError
from aggregator.store.confirmations import (
    Confirmation,
    Designs,
    Histograms,
    Snapshot,
    check_counts_unchanged,
    seal_with_retries,
    unchanged_plan,
)
from aggregator.store.ingest import histogram
from aggregator.store.model import CONFIRMATION
from aggregator.store.postgres import design
from aggregator.store.postgres.confirmation_lock import lock_confirmation_side
from aggregator.store.postgres.connection import Transactions
from aggregator.store.postgres.statistics import read_side
from client.survey import SurveySpec

_STATE = (
    "SELECT survey_id, mode, plan_sha256, plan, registered_at, sealed, sealed_at, holdout "
    "FROM confirmations WHERE survey_id = %s"
)


def state(conn: psycopg.Connection, survey_id: str, lock: str = "") -> Confirmation | None:
    """The survey's confirmation state (None: nothing registered); ``lock`` e.g. "FOR UPDATE"."""
    row = conn.execute(f"{_STATE} {lock}", (survey_id,)).fetchone()
    if row is None:
        return None
    survey, mode, plan_sha256, plan, registered_at, sealed, sealed_at, holdout = row
    held = None if holdout is None else json.loads(holdout)
    return Confirmation(survey, mode, plan_sha256, plan, registered_at, sealed, sealed_at, held)


def preregister(store: Transactions, survey: SurveySpec, plan: str, sha256: str) -> tuple:
    """Register the plan: (registered_at, already); see confirmations.preregister."""
    if not survey.split:
        raise ConfirmationError(f"survey {survey.id} has no confirmation side (not split)")
    with store.transaction() as conn:
        when = datetime.now(UTC).isoformat(timespec="seconds")
        inserted = conn.execute(
            "INSERT INTO confirmations (survey_id, mode, plan_sha256, plan, registered_at)"
            " VALUES (%s, 'plan', %s, %s, %s) ON CONFLICT (survey_id) DO NOTHING"
            " RETURNING survey_id",
            (survey.id, sha256, plan, when),
        ).fetchone()
        if inserted is not None:
            return when, False
        current = state(conn, survey.id, "FOR SHARE")
    assert current is not None
    if current.mode == "holdout":
        raise ConfirmationError(
            f"survey {survey.id}: its confirmation side is a reusable holdout already; "
            "one mode per survey"
        )
    if current.plan_sha256 == sha256:
        return current.registered_at, True
    sealed = "and its results are sealed" if current.sealed else "(final once registered)"
    raise ConfirmationError(
        f"survey {survey.id}: another plan is registered, sha256 {current.plan_sha256} "
        f"{sealed}; a different plan is refused"
    )


def side_histograms(conn: psycopg.Connection, survey: SurveySpec, side: int) -> Histograms:
    """Every question's histogram on ``side``, pooled ('') and per group value."""
    groups = ("", *(survey.group_label.values if survey.group_label else ()))
    out: Histograms = {}
    for question in survey.questions:
        for group in groups:
            n, sums = read_side(conn, survey.id, question.id, side, group)
            out[question.id, group] = histogram(question, n, sums)
    return out


def side_designs(conn: psycopg.Connection, survey: SurveySpec, side: int) -> Designs:
    """Every question's per design key statistics on ``side`` (none without a design)."""
    if survey.design is None:
        return {}
    return {q.id: design.read(conn, survey.id, q.id, side) for q in survey.questions}


def snapshot(store: Transactions, survey: SurveySpec) -> Snapshot:
    """The state, confirmation-side histograms and design statistics from one REPEATABLE READ
    snapshot."""
    with store.transaction() as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        return Snapshot(
            state(conn, survey.id),
            side_histograms(conn, survey, CONFIRMATION),
            side_designs(conn, survey, CONFIRMATION),
        )


def commit_seal(
    store: Transactions, survey: SurveySpec, snap: Snapshot, record: dict
) -> tuple[Confirmation, bool]:
    """Store ``record`` and close the confirmation side on every node, if nothing changed since
    ``snap`` (the row held FOR UPDATE while the counts are compared); see
    confirmations.commit_seal."""
    before = snap.state
    counts = snap.counts()
    if before is None:
        raise ConfirmationError(f"survey {survey.id}: nothing to confirm: no plan is registered")
    with store.transaction() as conn:
        lock_confirmation_side(conn, survey.id, exclusive=True)
        current = unchanged_plan(survey.id, state(conn, survey.id, "FOR UPDATE"), before)
        if current.sealed is not None:
            return current, True
        now = {key: read_side(conn, survey.id, key[0], CONFIRMATION, key[1])[0] for key in counts}
        check_counts_unchanged(survey.id, counts, now)
        text = json.dumps(record, sort_keys=True)
        conn.execute(
            "UPDATE confirmations SET sealed = %s, sealed_at = %s WHERE survey_id = %s",
            (text, record["sealed_at"], survey.id),
        )
    return replace(current, sealed=text, sealed_at=record["sealed_at"]), False


def close_side(store: Transactions, survey: SurveySpec) -> None:
    """Close the survey's confirmation side to new reports on every node (idempotent): the
    first step of a seal. It holds the confirmation-side lock exclusively, so it waits for the
    commits of confirmation-side reports under way, and every later one sees it closed."""
    with store.transaction() as conn:
        lock_confirmation_side(conn, survey.id, exclusive=True)
        current = state(conn, survey.id, "FOR UPDATE")
        if current is None or current.mode != "plan":
            what = "no plan is registered" if current is None else "it is a reusable holdout"
            raise ConfirmationError(f"survey {survey.id}: nothing to confirm: {what}")
        conn.execute(
            "UPDATE confirmations SET closed_at = coalesce(closed_at, %s) WHERE survey_id = %s",
            (datetime.now(UTC).isoformat(timespec="seconds"), survey.id),
        )


def reopen_side(store: Transactions, survey: SurveySpec) -> None:
    """Open the confirmation side again after :func:`close_side` when no seal followed (its
    plan could not run, e.g. on too little data), so that reports can still arrive, as on
    SQLite, where a refused seal never closed it. A sealed side stays closed."""
    with store.transaction() as conn:
        lock_confirmation_side(conn, survey.id, exclusive=True)
        conn.execute(
            "UPDATE confirmations SET closed_at = NULL WHERE survey_id = %s AND sealed IS NULL",
            (survey.id,),
        )


def seal(
    store: Transactions, survey: SurveySpec, compute: Callable[[str, Snapshot], dict]
) -> tuple[Confirmation, bool]:
    """Run the registered plan once and seal its results; see confirmations.seal. Unlike the
    single-writer SQLite store, it first closes the confirmation side (:func:`close_side`), so
    that uploads going on at many nodes cannot keep changing the counts the plan runs on:
    the snapshot after the close is final, and reports refused from then on would have been
    refused after the seal anyway. A seal that fails opens the side again (:func:`reopen_side`)."""
    if not survey.split:
        raise ConfirmationError(f"survey {survey.id} has no confirmation side (not split)")
    try:
        return seal_with_retries(
            survey,
            lambda: snapshot(store, survey),
            lambda snap, record: commit_seal(store, survey, snap, record),
            compute,
            prepare=lambda: close_side(store, survey),
        )
    except BaseException:
        reopen_side(store, survey)
        raise
