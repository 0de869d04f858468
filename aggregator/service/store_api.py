"""The report store as the servicers see it: one type for the in-process store and a worker's
link to the writer process's store, so the servicers and the server need not know which. It has
no read of the live statistics: the Analyst releases snapshots (aggregator/service/release.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from aggregator.store.report_store import ReportBatch


class Store(Protocol):
    """What the servicers need from a report store: the in-process ReportStore, a worker
    process's RemoteStore that reaches the writer process's one (``serve --workers N``), or an
    ingest node's PostgresStore on a shared database (``serve --store``: the Collector only, so
    its ``run_in_writer`` refuses)."""

    def submit_batches(self, batches: Sequence[ReportBatch]) -> Future[list[int]]: ...

    def stored_ids(self, report_ids: Sequence[bytes]) -> set[bytes]: ...

    @property
    def path(self) -> str: ...

    def run_in_writer(self, fn: Callable[[sqlite3.Connection], Any]) -> Any: ...

    def close(self) -> None: ...
