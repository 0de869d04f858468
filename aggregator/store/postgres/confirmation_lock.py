"""The confirmation side's advisory lock in the shared PostgreSQL store, by which every node
orders its commits of confirmation-side reports (shared: engine.py) against a seal closing the
side (exclusive: confirm.py)."""

from __future__ import annotations

import psycopg

#: The first key of the confirmation-side advisory locks (the second: the survey id's hash).
_CONFIRMATION_LOCKS = 0x4C445043  # "LDPC"


def lock_confirmation_side(conn: psycopg.Connection, survey_id: str, exclusive: bool) -> None:
    """Take the survey's confirmation-side lock until the transaction ends: shared by commits
    of its confirmation-side reports, exclusive by a seal. (An advisory lock, not a row lock:
    it exists before any plan row does, and taking it shared writes nothing.)"""
    kind = "" if exclusive else "_shared"
    sql = f"SELECT pg_advisory_xact_lock{kind}(%s, hashtext(%s))"
    conn.execute(sql, (_CONFIRMATION_LOCKS, survey_id))
