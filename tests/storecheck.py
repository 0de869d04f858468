"""Read-only checks of an aggregator's SQLite file for the crash tests: what the log holds, what the
statistics say, whether the two agree, and whether the file is sound.

It opens the file directly (``mode=ro``) so that it can look at a store whose server was just
killed, or one that a live server is writing, without starting a second writer.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from contextlib import closing
from pathlib import Path

import numpy as np

from aggregator.store import ingest
from client.survey import SurveySpec

Key = tuple[str, str]


def _open(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)


def integrity(db: Path) -> str:
    """``PRAGMA integrity_check``: "ok" for a sound file."""
    with closing(_open(db)) as conn:
        return "\n".join(row[0] for row in conn.execute("PRAGMA integrity_check"))


def stored_reports(db: Path) -> dict[bytes, tuple[str, str, bytes]]:
    """Every logged report: report id -> (survey id, question id, payload)."""
    with closing(_open(db)) as conn:
        rows = conn.execute("SELECT report_id, survey_id, question_id, payload FROM reports")
        return {rid: (survey, question, payload) for rid, survey, question, payload in rows}


def statistics(db: Path) -> dict[Key, tuple[int, list[int]]]:
    """Every question's stored sufficient statistic (n, sums)."""
    with closing(_open(db)) as conn:
        rows = conn.execute("SELECT survey_id, question_id, n, sums FROM statistics")
        return {
            (survey, question): (n, np.frombuffer(sums, dtype="<i8").tolist())
            for survey, question, n, sums in rows
        }


def recount(
    reports: dict[bytes, tuple[str, str, bytes]], surveys: dict[str, SurveySpec]
) -> dict[Key, tuple[int, list[int]]]:
    """(n, sums) per question recomputed from report payloads: each distinct payload is decoded
    once by the aggregator's own ``ingest.contribution`` and weighted by how often it occurs."""
    occurrences = Counter(reports.values())
    totals: dict[Key, tuple[int, np.ndarray]] = {}
    for (survey_id, question_id, payload), times in occurrences.items():
        question = surveys[survey_id].question(question_id)
        n, sums = totals.get((survey_id, question_id), (0, np.zeros(question.k, dtype=np.int64)))
        vector = ingest.contribution(question, payload)
        totals[(survey_id, question_id)] = (n + times, sums + times * vector)
    return {key: (n, sums.tolist()) for key, (n, sums) in totals.items()}


def nonempty(stats: dict[Key, tuple[int, list[int]]]) -> dict[Key, tuple[int, list[int]]]:
    """The statistics of the questions that received at least one report."""
    return {key: value for key, value in stats.items() if value[0] > 0}
