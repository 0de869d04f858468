"""Whether the store's files are still the ones the writer writes to, and what a failed commit
means.

Why: SQLite keeps writing to a database or WAL file that was deleted or replaced under it (it
holds the file open), so commits keep succeeding while nothing reaches a file anyone will ever
open again, and a kill then loses every acknowledged report. :class:`FileWatch` compares the
inode of the database file the writer opened and of the WAL it first committed to with what
the paths name now, after every commit; :func:`failure_message` names SQLite's disk-full,
read-only and I/O errors. The report store turns either into its ``StoreFailedError`` and stops
acknowledging until it is restarted.
"""

from __future__ import annotations

import os
import sqlite3


class FileWatch:
    """The identity (device, inode) of a database file and of its WAL, checked against the
    paths."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._db = _identity(path)
        self._wal: tuple[int, int] | None = None

    def database_intact(self) -> bool:
        """Whether the path still names the database file the writer opened."""
        return _identity(self._path) == self._db

    def check(self) -> str | None:
        """What is wrong if the database or WAL file was deleted or replaced since the first
        call (the WAL's identity is taken at the first check: SQLite creates it lazily)."""
        if not self.database_intact():
            return f"the database file {self._path} was deleted or replaced"
        wal = _identity(self._path + "-wal")
        if self._wal is None:
            self._wal = wal
        if wal is None or wal != self._wal:
            return f"the WAL file {self._path}-wal was deleted or replaced"
        return None


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


_KINDS = (
    (sqlite3.SQLITE_FULL, "the disk holding the store is full"),
    (sqlite3.SQLITE_READONLY, "the store is read-only"),
    (sqlite3.SQLITE_IOERR, "I/O error on the store"),
    (sqlite3.SQLITE_CANTOPEN, "cannot open the store's files"),
    (sqlite3.SQLITE_CORRUPT, "the store is corrupt"),
    (sqlite3.SQLITE_NOTADB, "the store is not a database"),
)


def failure_message(exc: BaseException) -> str | None:
    """What a SQLite error says about the store as a whole (disk full, read-only, I/O error...),
    or None for an error of one request's data."""
    code = getattr(exc, "sqlite_errorcode", None) if isinstance(exc, sqlite3.Error) else None
    if code is None:
        return None
    for primary, message in _KINDS:
        if code & 0xFF == primary:
            return f"{message} ({exc})"
    return None
