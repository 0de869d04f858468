"""The device's SQLite database, shared by the ledger, the outbox and the survey cache."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from client.device.filekind import DEVICE_STATE, FileKindError, claim, create_private


def connect(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """Open (or create, mode 0600) the device database: checked to be a device state file,
    autocommit (explicit transactions), WAL, fsync on commit. Raises FileKindError for a file
    of another kind, a corrupt file, a directory or a missing folder."""
    parent = Path(path).parent
    if not parent.is_dir():
        raise FileKindError(f"cannot create device state {path}: folder {parent} does not exist")
    if Path(path).is_dir():
        raise FileKindError(f"{path} is a directory, not a device state file")
    create_private(path)
    try:
        conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
    except sqlite3.Error as exc:
        raise FileKindError(f"cannot open device state {path}: {exc}") from None
    try:
        claim(conn, DEVICE_STATE, path)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise FileKindError(f"{path} is not a usable device state (SQLite: {exc})") from None
    except BaseException:
        conn.close()
        raise
    return conn


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """A write transaction that takes the database's write lock before reading anything."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:  # SQLite may already have rolled back (e.g. disk full)
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
