"""Import one question of a design survey's export: its reports and its per design key
statistics in one transaction (docs/shard-format.md, "Design statistics").

Shards carry no design keys, so the keys' statistics cannot be recomputed from the reports; they
come from the export's design file, checked to count and sum exactly the exported reports. In
the transaction that stores the question's reports, a (side, group) whose reports are all new
adds its keys' statistics; one whose reports were all stored before (the same export imported
again) adds nothing; anything in between cannot be apportioned to keys and is refused, the whole
question rolled back.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import numpy as np

from aggregator.store.design_statistics import KeyStatistics
from aggregator.store.errors import StoreError
from aggregator.store.model import DUPLICATE, STORED, StoredReport
from aggregator.store.sqlite import design_statistics
from aggregator.store.sqlite.report_store import ReportStore


class DesignImportError(StoreError):
    """The export's design statistics do not fit its reports or the store's."""


def import_question(
    store: ReportStore, reports: Sequence[StoredReport], keys: Sequence[KeyStatistics]
) -> list[int]:
    """Store one question's ``reports`` (all of one survey, question and side, without design
    keys) and restore ``keys``, the export's statistics of that question; the store's flags."""
    if not reports:
        if keys:
            raise DesignImportError("design statistics for a question without exported reports")
        return []
    first = reports[0]
    where = (first.survey_id, first.question_id, first.side)
    groups = [report.group for report in reports]
    check_counts(where, groups, np.stack([r.contribution for r in reports]), keys)

    def restore(conn: sqlite3.Connection, flags: list[int]) -> None:
        outcomes: dict[str, set[int]] = {}
        for group, flag in zip(groups, flags, strict=True):
            outcomes.setdefault(group, set()).add(flag)
        for group, seen in outcomes.items():
            if seen == {STORED}:
                design_statistics.merge(conn, [(where, s) for s in keys if s.group == group])
            elif seen != {DUPLICATE}:
                raise DesignImportError(
                    f"question {where[1]}{_in(group)}: the store holds some of the exported "
                    "reports but not all (or holds some ids with other content), so the design "
                    "statistics cannot be restored; import into a store without them"
                )

    return store.submit(reports, on_write=restore).result()


def check_counts(
    where: tuple[str, str, int],
    groups: Sequence[str],
    rows: np.ndarray,
    keys: Sequence[KeyStatistics],
) -> None:
    """The keys' statistics must count and sum the reports of each group exactly (their squares
    to rounding): DesignImportError otherwise."""
    for group in sorted(set(groups) | {s.group for s in keys}):
        mine = rows[np.array([g == group for g in groups], dtype=bool)]
        stats = [s for s in keys if s.group == group]
        n = sum(s.n for s in stats)
        sums = np.sum([s.sums for s in stats], axis=0, dtype=np.int64) if stats else 0
        squares = np.sum([s.squares for s in stats], axis=0) if stats else 0.0
        expected = np.square(mine.astype(np.float64)).sum(axis=0)
        same = np.array_equal(sums, mine.sum(axis=0)) and np.allclose(squares, expected, 1e-9)
        if n != len(mine) or not same:
            raise DesignImportError(
                f"question {where[1]}{_in(group)}: the design statistics count {n} reports, "
                f"the shards hold {len(mine)} (or their sums differ): not one export"
            )


def _in(group: str) -> str:
    return f" (group {group})" if group else ""
