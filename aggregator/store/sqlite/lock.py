"""One store, one holder: an exclusive lock on ``<db>.lock`` held for the life of a server (or of
a ``--workers`` group's writer), and by a restore while it replaces the store's files.

Why: two servers on one database file each keep their own in-memory cap counts and caches, so a
device could store twice its cap (seen: 20 reports under a cap of 10). SQLite alone allows it
(it serializes the writes, not the bookkeeping). The lock is ``flock`` on a sidecar file, so it is
released by the kernel when the holder dies, even by SIGKILL, and a restart never finds a stale
lock.
"""

from __future__ import annotations

import fcntl
import os

from aggregator.errors import LdpError
from aggregator.store.errors import StoreError


class StoreInUseError(LdpError):
    """Another running aggregator holds the store's lock."""


class StoreLock:
    """The held lock of one database file; :meth:`release` (or process exit) frees it."""

    def __init__(self, db_path: str | os.PathLike[str]) -> None:
        self.path = f"{os.fspath(db_path)}.lock"
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            folder = os.path.dirname(os.path.abspath(self.path))
            raise StoreError(
                f"cannot create report store {os.fspath(db_path)}: folder {folder} does not exist"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreInUseError(
                f"another aggregator is serving {os.fspath(db_path)} (it holds {self.path})"
            ) from None
        self._fd: int | None = fd

    def release(self) -> None:
        """Free the lock (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> StoreLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
