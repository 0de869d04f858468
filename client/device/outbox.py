"""The device's durable outbox: randomized reports waiting to be delivered, in SQLite.

A report is randomized once, stored here with its random 16-byte id, and resent byte for byte until
the server acknowledges it (accepted or duplicate); a permanent refusal moves it to a dead-letter
table instead of dropping it. Every write commits with WAL and ``synchronous=FULL``, so a report is
durable once ``add`` returns. The file may be the ledger's database (separate tables).

The first report of each question is kept apart, for good (client/device/repeats.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

from client.device.database import connect, immediate

REPORT_ID_SIZE = 16

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    sequence INTEGER PRIMARY KEY AUTOINCREMENT,
    report_id BLOB NOT NULL UNIQUE CHECK (length(report_id) = 16),
    survey_id TEXT NOT NULL,
    question_id TEXT NOT NULL,
    payload BLOB NOT NULL,
    created_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    definition_digest BLOB NOT NULL DEFAULT x''
);
CREATE TABLE IF NOT EXISTS rejected (
    report_id BLOB PRIMARY KEY CHECK (length(report_id) = 16),
    survey_id TEXT NOT NULL,
    question_id TEXT NOT NULL,
    payload BLOB NOT NULL,
    created_at REAL NOT NULL,
    attempts INTEGER NOT NULL,
    code TEXT NOT NULL,
    reason TEXT NOT NULL,
    rejected_at REAL NOT NULL,
    definition_digest BLOB NOT NULL DEFAULT x''
);
"""

_ITEM_COLUMNS = (
    "report_id, survey_id, question_id, payload, created_at, attempts, definition_digest"
)
_DIGEST_COLUMN = "definition_digest BLOB NOT NULL DEFAULT x''"  # added in device state v2


class OutboxError(Exception):
    """A report id already stored with different content."""


@dataclass(frozen=True)
class OutboxItem:
    """One stored report; ``payload`` is exactly what is (re)sent."""

    report_id: bytes
    survey_id: str
    question_id: str
    payload: bytes
    created_at: float
    attempts: int
    definition_digest: bytes = b""  # of the question definition it was randomized under


def _check_report_id(report_id: object) -> bytes:
    if not isinstance(report_id, bytes) or len(report_id) != REPORT_ID_SIZE:
        raise ValueError(f"report_id must be {REPORT_ID_SIZE} bytes, got {report_id!r}")
    return report_id


def _check_ids(report_ids: Iterable[bytes]) -> list[tuple[bytes]]:
    return [(_check_report_id(report_id),) for report_id in report_ids]


class Outbox:
    """Durable queue of randomized reports and a dead-letter table, at ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._conn = connect(path)
        try:
            self._conn.executescript(_SCHEMA)
            for table in ("outbox", "rejected"):  # a device state file from before v2
                columns = {row[1] for row in self._conn.execute(f"PRAGMA table_info({table})")}
                if "definition_digest" not in columns:
                    self._conn.execute(f"ALTER TABLE {table} ADD COLUMN {_DIGEST_COLUMN}")
        except BaseException:
            self._conn.close()
            raise

    def add(
        self,
        report_id: bytes,
        survey_id: str,
        question_id: str,
        payload: bytes,
        *,
        definition_digest: bytes = b"",
    ) -> None:
        """Store one report in one committed transaction.

        Adding a report id again is a no-op if the content is identical (pending or rejected),
        an ``OutboxError`` otherwise.
        """
        _check_report_id(report_id)
        if not isinstance(payload, bytes):
            raise ValueError("payload must be bytes")
        content = (survey_id, question_id, payload)
        with immediate(self._conn):
            for table in ("outbox", "rejected"):
                stored = self._conn.execute(
                    f"SELECT survey_id, question_id, payload FROM {table} WHERE report_id = ?",
                    (report_id,),
                ).fetchone()
                if stored is not None:
                    if stored != content:
                        raise OutboxError(f"report {report_id.hex()} is stored with other content")
                    return
            self._conn.execute(
                "INSERT INTO outbox (report_id, survey_id, question_id, payload, created_at,"
                " definition_digest) VALUES (?, ?, ?, ?, ?, ?)",
                (report_id, *content, time.time(), definition_digest),
            )

    def pending(self, limit: int = 1000) -> list[OutboxItem]:
        """Up to ``limit`` undelivered reports, oldest first."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit!r}")
        rows = self._conn.execute(
            f"SELECT {_ITEM_COLUMNS} FROM outbox ORDER BY sequence LIMIT ?", (limit,)
        )
        return [OutboxItem(*row) for row in rows]

    def mark_attempt(self, report_ids: Iterable[bytes]) -> None:
        """Count one more delivery attempt for each of these pending reports."""
        params = _check_ids(report_ids)
        with immediate(self._conn):
            self._conn.executemany(
                "UPDATE outbox SET attempts = attempts + 1 WHERE report_id = ?", params
            )

    def acknowledge(self, report_ids: Iterable[bytes]) -> None:
        """Delete reports the server accepted or already had."""
        params = _check_ids(report_ids)
        with immediate(self._conn):
            self._conn.executemany("DELETE FROM outbox WHERE report_id = ?", params)

    def reject(self, report_id: bytes, code: str, reason: str) -> None:
        """Move a pending report the server permanently refused to the ``rejected`` table.

        Idempotent for a report already rejected; ``KeyError`` for an unknown id.
        """
        _check_report_id(report_id)
        with immediate(self._conn):
            moved = self._conn.execute(
                f"INSERT INTO rejected ({_ITEM_COLUMNS}, code, reason, rejected_at)"
                f" SELECT {_ITEM_COLUMNS}, ?, ?, ? FROM outbox WHERE report_id = ?",
                (code, reason, time.time(), report_id),
            ).rowcount
            if moved:
                self._conn.execute("DELETE FROM outbox WHERE report_id = ?", (report_id,))
            elif not self._conn.execute(
                "SELECT 1 FROM rejected WHERE report_id = ?", (report_id,)
            ).fetchone():
                raise KeyError(report_id.hex())

    def dead(self, report_id: bytes) -> bool:
        """Whether the report was refused for good (it is in the dead-letter table)."""
        row = self._conn.execute(
            "SELECT 1 FROM rejected WHERE report_id = ?", (_check_report_id(report_id),)
        ).fetchone()
        return row is not None

    def rejected(self) -> list[tuple[OutboxItem, str, str]]:
        """Dead letters as ``(item, code, reason)``, in the order they were rejected."""
        rows = self._conn.execute(
            f"SELECT {_ITEM_COLUMNS}, code, reason FROM rejected ORDER BY rowid"
        )
        return [(OutboxItem(*row[:7]), row[7], row[8]) for row in rows]

    def __len__(self) -> int:
        """Number of pending reports."""
        return self._conn.execute("SELECT count(*) FROM outbox").fetchone()[0]

    def close(self) -> None:
        """Close the database connection."""
        self._conn.close()

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
