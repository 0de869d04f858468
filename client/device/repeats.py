"""One answer per question on a device: the first report of each (survey, question), kept in
the device's SQLite file so that the rule holds across restarts.

A question's ``repeat`` policy says what a second answer does (docs/config.md, "Repeat
answers"): ``refuse`` raises :class:`AnsweredBefore` before anything is charged or randomized;
``memoize`` resends the first report, byte for byte under the same report id, whatever the new
answer is: the aggregator counts it once (DUPLICATE), the ledger charges nothing, and since the
resend does not depend on the answer it tells the aggregator nothing about whether the answer
changed. The price is that a changed answer is not counted: the first answer stands.

One exception: a first report randomized under a definition the aggregator has since changed,
and refused by it for good (dead-lettered as stale), was never counted; the question may then be
answered again under the new definition (client/device/reporter.py).

The table holds the randomized report only (what the aggregator receives anyway), never the
true answer. A row is claimed in one transaction, with the table's key as the arbiter, so two
racing answers on one device cannot both be queued.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass

from client.device.database import connect, immediate
from client.device.ledger import LedgerError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS answered (
    survey_id TEXT NOT NULL,
    question_id TEXT NOT NULL,
    report_id BLOB NOT NULL CHECK (length(report_id) = 16),
    payload BLOB NOT NULL,
    definition_digest BLOB NOT NULL,
    PRIMARY KEY (survey_id, question_id)
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS answered_kept BEFORE DELETE ON answered
BEGIN SELECT RAISE(ABORT, 'a first answer is kept for good'); END;
"""


class AnsweredBefore(LedgerError):  # noqa: N818 (says what happened, like BudgetExceeded)
    """A second answer to a question whose policy is ``refuse``; nothing was charged or queued."""


@dataclass(frozen=True)
class FirstReport:
    """The report a device sent (or queued) for a question: what ``memoize`` resends."""

    report_id: bytes
    payload: bytes
    definition_digest: bytes


def refusal(survey_id: str, question_id: str) -> AnsweredBefore:
    """The error for a refused second answer (one line, for the CLI too)."""
    return AnsweredBefore(
        f"this device has answered {survey_id}/{question_id} already; the question's repeat "
        "policy is 'refuse' (one answer per device: a changed answer cannot be counted without "
        "counting the device twice)"
    )


class Repeats:
    """The first report of every question this device answered, at ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._conn = connect(path)
        try:
            self._conn.executescript(_SCHEMA)
        except BaseException:
            self._conn.close()
            raise

    def first(self, survey_id: str, question_id: str) -> FirstReport | None:
        """The first report of the question, or None if the device never answered it."""
        row = self._conn.execute(
            "SELECT report_id, payload, definition_digest FROM answered"
            " WHERE survey_id = ? AND question_id = ?",
            (survey_id, question_id),
        ).fetchone()
        return None if row is None else FirstReport(*row)

    def claim(
        self,
        survey_id: str,
        question_id: str,
        report: FirstReport,
        replacing: FirstReport | None = None,
    ) -> None:
        """Record ``report`` as the question's first (in place of ``replacing``, a first report
        that was never counted); AnsweredBefore if another answer got there first (a racing
        answer of the same device)."""
        row = (report.report_id, report.payload, report.definition_digest)
        try:
            with immediate(self._conn):
                if replacing is None:
                    self._conn.execute(
                        "INSERT INTO answered VALUES (?, ?, ?, ?, ?)",
                        (survey_id, question_id, *row),
                    )
                    return
                updated = self._conn.execute(
                    "UPDATE answered SET report_id = ?, payload = ?, definition_digest = ?"
                    " WHERE survey_id = ? AND question_id = ? AND report_id = ?",
                    (*row, survey_id, question_id, replacing.report_id),
                ).rowcount
                if updated != 1:
                    raise refusal(survey_id, question_id)
        except sqlite3.IntegrityError:
            raise refusal(survey_id, question_id) from None

    def close(self) -> None:
        """Close the database connection."""
        self._conn.close()
