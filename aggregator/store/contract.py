"""The report store as the servicers see it: one type for the in-process store, a worker's link
to the writer process's store and an ingest node's shared PostgreSQL store, so the servicers and
the server need not know which. The Collector writes through :class:`Store`; the Analyst reads
and keeps its state (released snapshots, the plan, the seal, the holdout) through
:class:`AnalysisStore`, which each engine provides (:func:`analysis_of`). Neither reads the live
statistics directly: the Analyst releases snapshots (aggregator/service/analyst/release.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol, cast, runtime_checkable

from aggregator.store import confirmations, releases
from aggregator.store.confirmations import Confirmation, Snapshot
from aggregator.store.design_statistics import KeyStatistics
from aggregator.store.sqlite import design_releases, release_history
from aggregator.store.sqlite.report_store import ReportBatch
from client.survey import SurveySpec


class Store(Protocol):
    """What the servicers need from a report store: the in-process ReportStore, a worker
    process's RemoteStore that reaches the writer process's one (``serve --workers N``), or an
    ingest node's PostgresStore on a shared database (``serve --store``)."""

    def submit_batches(self, batches: Sequence[ReportBatch]) -> Future[list[int]]: ...

    def stored_ids(self, report_ids: Sequence[bytes]) -> set[bytes]: ...

    @property
    def path(self) -> str: ...

    def run_in_writer(self, fn: Callable[[sqlite3.Connection], Any]) -> Any: ...

    def close(self) -> None: ...


class AnalysisStore(Protocol):
    """The Analyst's state in a store, with the same rules on every engine: released snapshots
    (aggregator/store/releases.py) and the confirmation side (aggregator/store/confirmations.py).
    Every method blocks: call them on the analysis threads."""

    def release(
        self, cells: Sequence[releases.Cell], step: int
    ) -> dict[releases.Cell, releases.Snapshot | None]: ...

    def release_history(
        self, cells: Sequence[releases.Cell]
    ) -> list[tuple[releases.Cell, int, list[int]]]: ...

    def check_readable(self, survey: SurveySpec, side: int) -> None: ...

    def preregister(self, survey: SurveySpec, plan: str, sha256: str) -> tuple[str, bool]: ...

    def confirmation_snapshot(self, survey: SurveySpec) -> Snapshot: ...

    def prepare_seal(self, survey: SurveySpec) -> None: ...

    def abandon_seal(self, survey: SurveySpec) -> None: ...

    def commit_seal(
        self, survey: SurveySpec, snap: Snapshot, record: dict
    ) -> tuple[Confirmation, bool]: ...

    def commit_holdout(
        self,
        survey: SurveySpec,
        snap: Snapshot,
        held: dict,
        query: tuple[str, str],
        answer: tuple[dict, bool, float],
    ) -> dict: ...


@runtime_checkable
class ReleasesDesigns(Protocol):
    """An AnalysisStore that snapshots per design key statistics with its releases (SQLite:
    aggregator/store/sqlite/design_releases.py); PostgreSQL keeps no design statistics."""

    def design_release(
        self, cells: Sequence[releases.Cell]
    ) -> dict[releases.Cell, tuple[int, list[KeyStatistics]]]: ...


@runtime_checkable
class ServesAnalysis(Protocol):
    """A store engine that keeps the Analyst's state itself (PostgresStore: shared by nodes)."""

    def analysis(self) -> AnalysisStore: ...


class SqliteStore(Store, Protocol):
    """A SQLite store (ReportStore or RemoteStore): a seal closes the side in its writer."""

    def close_confirmation(self, survey_id: str) -> None: ...


class SqliteAnalysis:
    """:class:`AnalysisStore` of a SQLite store: reads on read-only connections of their own,
    writes in one transaction of the store's writer (ReportStore.run_in_writer) or of a
    ``--workers`` worker's own connection."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    def release(
        self, cells: Sequence[releases.Cell], step: int
    ) -> dict[releases.Cell, releases.Snapshot | None]:
        return releases.release(self._store, cells, step)

    def release_history(
        self, cells: Sequence[releases.Cell]
    ) -> list[tuple[releases.Cell, int, list[int]]]:
        return release_history.read(self._store.path, cells)

    def design_release(
        self, cells: Sequence[releases.Cell]
    ) -> dict[releases.Cell, tuple[int, list[KeyStatistics]]]:
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


def analysis_of(store: Store) -> AnalysisStore:
    """The Analyst's view of ``store``: the engine's own where it keeps the state itself, else
    the SQLite store's through its writer."""
    if isinstance(store, ServesAnalysis):
        return store.analysis()
    return SqliteAnalysis(cast(SqliteStore, store))
