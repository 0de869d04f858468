"""The Analyst's state in a SQLite store (aggregator/store/contract.py's AnalysisStore): released
snapshots, their history and design rows, and the confirmation side, written through the store's
writer (ReportStore's, or a ``--workers`` worker's own connection:
aggregator/service/server/store_link.py)."""

from __future__ import annotations

from collections.abc import Sequence

from aggregator.store.confirmations import Confirmation, Snapshot
from aggregator.store.design_statistics import KeyStatistics
from aggregator.store.releases import Cell
from aggregator.store.releases import Snapshot as Released
from aggregator.store.sqlite import confirmations, design_releases, release_history, releases
from aggregator.store.sqlite.confirmations import Writer
from client.survey import SurveySpec


class SqliteAnalysis:
    """The AnalysisStore of a SQLite store: reads on read-only connections of their own, writes
    in one transaction of the store's writer (ReportStore.run_in_writer) or of a ``--workers``
    worker's own connection."""

    def __init__(self, store: Writer) -> None:
        self._store = store

    def release(self, cells: Sequence[Cell], step: int) -> dict[Cell, Released | None]:
        return releases.release(self._store, cells, step)

    def release_history(self, cells: Sequence[Cell]) -> list[tuple[Cell, int, list[int]]]:
        return release_history.read(self._store.path, cells)

    def design_release(self, cells: Sequence[Cell]) -> dict[Cell, tuple[int, list[KeyStatistics]]]:
        """Of each released cell: its released n and design rows (design_releases.released)."""
        return design_releases.released(self._store.path, cells)

    def check_readable(self, survey: SurveySpec, side: int) -> None:
        confirmations.check_readable_at(self._store.path, survey, side)

    def preregister(self, survey: SurveySpec, plan: str, sha256: str) -> tuple[str, bool]:
        return confirmations.preregister(self._store, survey, plan, sha256)

    def confirmation_snapshot(self, survey: SurveySpec) -> Snapshot:
        return confirmations.snapshot(self._store.path, survey)

    def prepare_seal(self, survey: SurveySpec) -> None:
        """Nothing: the single writer closes the side in the seal's own transaction."""

    def abandon_seal(self, survey: SurveySpec) -> None:
        """Nothing: a seal that did not commit never closed the side."""

    def commit_seal(
        self, survey: SurveySpec, snap: Snapshot, record: dict
    ) -> tuple[Confirmation, bool]:
        return confirmations.commit_seal(self._store, survey, snap, record)

    def commit_holdout(
        self,
        survey: SurveySpec,
        snap: Snapshot,
        held: dict,
        query: tuple[str, str],
        answer: tuple[dict, bool, float],
    ) -> dict:
        return confirmations.commit_holdout(self._store, survey, snap, held, query, answer)
