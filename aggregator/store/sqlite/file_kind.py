"""The aggregator's SQLite files (report store, device registry) know what they are: opened only
as their kind, created 0600, read-only opens that change nothing. The mechanics live in
``client.device.filekind`` (devices stamp their state files the same way)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from client.device.filekind import (
    DEVICE_REGISTRY,
    REPORT_STORE,
    FileKind,
    FileKindError,
    claim,
    create_private,
    open_read_only,
    stamp,
)
from client.device.filekind import check as check_kind

__all__ = [
    "DEVICE_REGISTRY",
    "REPORT_STORE",
    "FileKindError",
    "check_kind",
    "claim",
    "create_private",
    "open_file",
    "open_read_only",
    "stamp_kind",
]

stamp_kind = stamp


def open_file(path: str | os.PathLike[str], kind: FileKind = REPORT_STORE) -> sqlite3.Connection:
    """A writable connection to ``path`` (created empty, mode 0600, if missing): autocommit,
    ``synchronous=FULL``, a 5 s busy timeout. The caller checks and stamps the kind."""
    parent = Path(path).parent
    if not parent.is_dir():
        raise FileKindError(f"cannot create {kind.name} {path}: folder {parent} does not exist")
    if Path(path).is_dir():
        raise FileKindError(f"{path} is a directory, not a {kind.name} file")
    create_private(path)
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute("PRAGMA synchronous = FULL")
    except sqlite3.Error as exc:
        raise FileKindError(f"cannot open {kind.name} {path}: {exc}") from None
    return conn
