"""SQLite files that know what they are: every file the project writes carries its kind in
``PRAGMA application_id`` and its schema version in ``PRAGMA user_version``.

A command opens a file only as the kind it expects, so a device state file passed as a report
store (or the other way round), a corrupt file, a directory or a file written by a newer version
is refused in one line instead of being silently given the wrong tables. Files written before the
kinds existed (application_id 0) are recognized by their tables and stamped on the first write.
New files are created with mode 0600 (SQLite gives its -wal and -shm files the same mode).
Read-only opens never create or change anything (see :func:`open_read_only`).
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from dataclasses import dataclass
from pathlib import Path


class FileKindError(ValueError):
    """The file is missing, unreadable, of another kind, or of an unknown schema version."""


@dataclass(frozen=True)
class FileKind:
    """One kind of SQLite file: its name, ``application_id``, current schema version, and the
    tables (any of them) that identify a file written before the kinds were stamped."""

    name: str
    application_id: int
    version: int
    legacy_tables: frozenset[str]


# The 32-bit ids spell the kind in ASCII: "LDPS", "LDPD", "LDPR". The report store's version is
# aggregator/store/sqlite/schema.py's SCHEMA_VERSION (its STORE_KIND replaces the one here).
REPORT_STORE = FileKind("report store", 0x4C445053, 5, frozenset({"reports", "statistics"}))
DEVICE_STATE = FileKind(
    "device state", 0x4C445044, 2, frozenset({"ledger_budget", "outbox", "device_secret"})
)
DEVICE_REGISTRY = FileKind("device registry", 0x4C445052, 1, frozenset({"devices"}))
KINDS = (REPORT_STORE, DEVICE_STATE, DEVICE_REGISTRY)


def create_private(path: str | os.PathLike[str]) -> None:
    """Create ``path`` empty with mode 0600 if it does not exist (before SQLite opens it), or
    tighten it to 0600 if it does (SQLite gives its WAL and journal the database file's mode)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        if os.stat(path).st_mode & 0o077:
            os.chmod(path, 0o600)


def check(conn: sqlite3.Connection, kind: FileKind, path: object) -> bool:
    """Raise FileKindError unless the open file is a ``kind`` file this version can use (or a
    new, empty one); return whether it still needs :func:`stamp` (new or legacy). Writes
    nothing."""
    try:
        app_id, version, tables = _identity(conn)
    except sqlite3.DatabaseError as exc:
        raise FileKindError(f"{path} is not a usable {kind.name} (SQLite: {exc})") from None
    if app_id == kind.application_id:
        if version > kind.version:
            raise FileKindError(
                f"{path} is a {kind.name} of schema version {version}; this version of "
                f"ldp-survey reads up to {kind.version} (upgrade ldp-survey)"
            )
        return version != kind.version
    if app_id != 0:
        raise FileKindError(f"{path} is {_describe(app_id)}, not a {kind.name}")
    if tables and not tables & kind.legacy_tables:
        raise FileKindError(f"{path} is {_guess(tables)}, not a {kind.name}")
    return True


def stamp(conn: sqlite3.Connection, kind: FileKind) -> None:
    """Write the kind and the current schema version into the file's header."""
    conn.execute(f"PRAGMA application_id = {kind.application_id}")
    conn.execute(f"PRAGMA user_version = {kind.version}")


def claim(conn: sqlite3.Connection, kind: FileKind, path: object) -> None:
    """:func:`check`, then :func:`stamp` a new or legacy file. Raises FileKindError."""
    if check(conn, kind, path):
        try:
            stamp(conn, kind)
        except sqlite3.DatabaseError as exc:
            raise FileKindError(f"cannot write {kind.name} {path}: {exc}") from None


def open_read_only(path: str | os.PathLike[str], kind: FileKind) -> sqlite3.Connection:
    """Open an existing ``kind`` file for reading only: nothing is created or changed.

    With no ``-wal`` file beside it (no writer has it open) the file is opened ``immutable``, so
    SQLite does not even create its ``-shm``/``-wal`` companions; otherwise ``mode=ro`` reads the
    writer's committed state. A legacy (unstamped) file of the right kind is accepted."""
    path = Path(path)
    if not path.exists():
        raise FileKindError(f"{kind.name} not found: {path}")
    if not path.is_file():
        raise FileKindError(f"{path} is not a file (a {kind.name} is one SQLite file)")
    live = Path(f"{path}-wal").exists()
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
    if not live:
        uri += "&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise FileKindError(f"cannot open {kind.name} {path}: {exc}") from None
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        app_id, version, tables = _identity(conn)
        if app_id == 0 and tables & kind.legacy_tables:
            return conn  # written before the kinds: read as version 1
        if app_id != kind.application_id:
            what = _describe(app_id) if app_id else _guess(tables)
            raise FileKindError(f"{path} is {what}, not a {kind.name}")
        if version > kind.version:
            raise FileKindError(
                f"{path} is a {kind.name} of schema version {version}; this version of "
                f"ldp-survey reads up to {kind.version} (upgrade ldp-survey)"
            )
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise FileKindError(f"{path} is not a usable {kind.name} (SQLite: {exc})") from None
    except BaseException:
        conn.close()
        raise
    return conn


def _identity(conn: sqlite3.Connection) -> tuple[int, int, frozenset[str]]:
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    return app_id, version, frozenset(name for (name,) in rows)


def _describe(app_id: int) -> str:
    for kind in KINDS:
        if kind.application_id == app_id:
            return f"a {kind.name} file"
    return f"an SQLite file of another application (application_id {app_id:#x})"


def _guess(tables: frozenset[str]) -> str:
    for kind in KINDS:
        if tables & kind.legacy_tables:
            return f"a {kind.name} file"
    if not tables:
        return "an empty SQLite file"
    return f"an SQLite file of another application (tables {', '.join(sorted(tables))})"
