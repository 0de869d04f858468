"""Per-device cap counts at rest: their own file (``<db>.caps``), written in batches, never in the
report log's transactions.

Why: counts written in the same transaction as the reports they count put a device's pseudonym
and its reports in one WAL commit, so anyone holding the store files could group the stored
reports by device (and, with the pseudonym secret, name the device). Here the report database
and its WAL hold no pseudonym at all, and the counts file holds no report id and no time: every
:data:`FLUSH_SECONDS` the counts that changed are written in one transaction, sorted by
pseudonym, so its writes follow a clock, not the uploads, and a batch mixes every device that
uploaded meanwhile.

What a crash costs: the counts of the last flush interval. After a restart a device may store
that many reports above its cap (at most what it uploaded in :data:`FLUSH_SECONDS`, which its
rate limit bounds when one is set). A graceful stop flushes everything.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
from collections.abc import Callable, Mapping
from contextlib import closing
from pathlib import Path

from aggregator.errors import LdpError
from aggregator.store.errors import StoreError
from aggregator.store.sqlite.file_kind import (
    REPORT_STORE,
    FileKindError,
    check_kind,
    create_private,
    open_file,
)

log = logging.getLogger(__name__)

#: How often changed counts are written: the most a crash can lose, and the coarseness of any
#: timing link between the counts file and the report log.
FLUSH_SECONDS = 2.0

CountKey = tuple[str, str, str]  # (pseudonym, survey id, question id)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cap_counts (
    pseudonym TEXT NOT NULL,
    survey_id TEXT NOT NULL,
    question_id TEXT NOT NULL,
    accepted INTEGER NOT NULL,
    PRIMARY KEY (pseudonym, survey_id, question_id)
) WITHOUT ROWID
"""
_LEGACY_TABLE = "limit_counts"  # where earlier versions kept the counts: the report database


class CapFileError(LdpError):
    """The counts file cannot be read or written."""


class CapFile:
    """The counts file of one report store."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        try:
            create_private(self.path)
            with closing(self._connect()) as conn:
                conn.execute(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise CapFileError(f"cannot open the cap counts file {self.path}: {exc}") from None

    @classmethod
    def beside(cls, db_path: str | os.PathLike[str]) -> CapFile:
        return cls(f"{os.fspath(db_path)}.caps")

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA secure_delete = ON")  # replaced values do not linger in free pages
        return conn

    def load(self) -> dict[CountKey, int]:
        with closing(self._connect()) as conn:
            rows = conn.execute("SELECT * FROM cap_counts")
            return {(k, s, q): n for k, s, q, n in rows}

    def save(self, counts: Mapping[CountKey, int]) -> None:
        """Write these counts (absolute values) in one transaction, in key order."""
        rows = [(*key, n) for key, n in sorted(counts.items())]
        with closing(self._connect()) as conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT OR REPLACE INTO cap_counts VALUES (?, ?, ?, ?)", rows)
            conn.execute("COMMIT")

    def adopt_legacy(self, db_path: str | os.PathLike[str]) -> None:
        """Move counts an earlier version kept in the report database into this file and drop
        them there (with secure_delete, so they do not stay readable in free pages). Call it
        before the report store opens."""
        if not Path(db_path).exists():
            return
        try:
            conn = open_file(db_path, REPORT_STORE)
        except FileKindError as exc:
            raise StoreError(str(exc)) from None
        with closing(conn):
            try:
                check_kind(conn, REPORT_STORE, db_path)  # only a report store is touched
            except FileKindError as exc:
                raise StoreError(str(exc)) from None
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (_LEGACY_TABLE,)
            ).fetchone()
            if found is None:
                return
            legacy = {(k, s, q): n for k, s, q, n in conn.execute(f"SELECT * FROM {_LEGACY_TABLE}")}
            counts = self.load()
            self.save({key: max(n, counts.get(key, 0)) for key, n in legacy.items()})
            conn.execute("PRAGMA secure_delete = ON")
            conn.execute(f"DROP TABLE {_LEGACY_TABLE}")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


class CapPersistence:
    """Writes the counts that changed every :data:`FLUSH_SECONDS` (``changed()`` hands them over
    and forgets them; ``keep(counts)`` takes back what could not be written)."""

    def __init__(
        self,
        file: CapFile,
        changed: Callable[[], dict[CountKey, int]],
        keep: Callable[[Mapping[CountKey, int]], None],
        interval: float = FLUSH_SECONDS,
    ) -> None:
        self._file = file
        self._changed = changed
        self._keep = keep
        self._interval = interval
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.flush()

    async def flush(self) -> None:
        counts = self._changed()
        if not counts:
            return
        try:
            await asyncio.to_thread(self._file.save, counts)
        except (OSError, sqlite3.Error) as exc:
            log.error("cannot write the cap counts (kept in memory, retried): %s", exc)
            self._keep(counts)

    async def close(self) -> None:
        """Stop the timer and write what is left."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.flush()
