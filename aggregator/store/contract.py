"""The report store as the servicers see it: one type for the in-process store, a worker's link
to the writer process's store and an ingest node's shared PostgreSQL store, so the servicers and
the server need not know which. The Collector writes through :class:`Store`; the Analyst reads
and keeps its state (released snapshots, the plan, the seal, the holdout) through
:class:`AnalysisStore`, which each engine provides (:meth:`Store.analysis`). Neither reads the
live statistics directly: the Analyst releases snapshots (aggregator/service/analyst/release.py).
Engine-neutral: the engines (sqlite/ and postgres/ beside this module) implement it, and it
names neither."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol, runtime_checkable

from aggregator.store import releases
from aggregator.store.confirmations import Confirmation, Snapshot
from aggregator.store.design_statistics import KeyStatistics
from aggregator.store.model import ReportBatch
from client.survey import SurveySpec


class Store(Protocol):
    """What the servicers need from a report store: the in-process ReportStore, a worker
    process's RemoteStore that reaches the writer process's one (``serve --workers N``), or an
    ingest node's PostgresStore on a shared database (``serve --store``)."""

    def submit_batches(self, batches: Sequence[ReportBatch]) -> Future[list[int]]: ...

    def stored_ids(self, report_ids: Sequence[bytes]) -> set[bytes]: ...

    @property
    def path(self) -> str: ...

    def analysis(self) -> AnalysisStore: ...

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
    """An AnalysisStore that snapshots per design key statistics with its releases, in the
    transaction that moves each (sqlite/design_releases.py, postgres/design_releases.py):
    ``design_release`` gives each released cell's n and those rows, for design-based answers."""

    def design_release(
        self, cells: Sequence[releases.Cell]
    ) -> dict[releases.Cell, tuple[int, list[KeyStatistics]]]: ...
