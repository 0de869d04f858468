"""Connections to a report store file (SQLite): the settings every connection of the store
uses, read-only connections, one write transaction (``BEGIN IMMEDIATE``) on a connection, a
transaction of a connection of its own for a process that does not own the writer, and SQLite's
busy answers as a retryable error."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from typing import Any

from aggregator.store.errors import StoreUnavailableError

BUSY_TIMEOUT_MS = 5000


class StoreBusyError(StoreUnavailableError):
    """SQLite's write lock stayed taken past the busy timeout (another connection's write
    transaction): nothing of the operation was written; a retry soon is safe."""


def busy_error(exc: BaseException) -> StoreBusyError | None:
    """A StoreBusyError for SQLite's "database is locked" / "database is busy" (SQLITE_BUSY,
    SQLITE_LOCKED), else None."""
    code = getattr(exc, "sqlite_errorcode", None) if isinstance(exc, sqlite3.Error) else None
    if code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return StoreBusyError(f"the store is busy, try again: {exc}")
    return None


def read_only(path: str) -> sqlite3.Connection:
    conn = connect(path)
    conn.execute("PRAGMA query_only = ON")
    return conn


def run_in_transaction(
    path: str | os.PathLike[str], fn: Callable[[sqlite3.Connection], Any]
) -> Any:
    """``fn(conn)`` in one write transaction of a connection of its own, for a process that does
    not own the store's writer (a ``--workers`` server's worker). SQLite serializes it with the
    writer's transactions; the writer sees a sealed survey by its ``data_version``."""
    try:
        with closing(connect(os.fspath(path))) as conn, transaction(conn):
            return fn(conn)
    except sqlite3.Error as exc:
        busy = busy_error(exc)
        if busy is None:
            raise
        raise busy from None


def connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT; on any error ROLLBACK, so nothing is half-written."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def has_table(conn: sqlite3.Connection, name: str) -> bool:
    sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    return conn.execute(sql, (name,)).fetchone() is not None
