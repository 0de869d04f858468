"""PostgresStore: the report store's contract (ReportStore's, as the service uses it through
aggregator/store/contract.py) on a PostgreSQL database that any number of nodes share.

* Ack after commit: a writer thread per node takes everything queued (up to ``max_batch``
  reports, waiting at most ``max_delay`` seconds) into ONE transaction and resolves the callers'
  futures only after COMMIT returned. A node killed at any moment loses nothing acknowledged.
* Exact DUPLICATE / CONFLICT across nodes: ``reports.report_id`` is the primary key. A commit
  inserts its reports with ``ON CONFLICT DO NOTHING`` in report_id order (two nodes inserting
  the same ids wait on each other in one order, never in a cycle) and reads back the ids it did
  not insert to tell an identical resend (DUPLICATE) from another report under that id
  (CONFLICT). A concurrent insert of the same id is waited for, so exactly one node stores it.
* No hot row: each transaction adds its reports' contributions to one randomly chosen shard of
  each question's statistics (schema.py), and of each design key's (design.py); reads sum the
  shards.
* A sealed confirmation side is refused on every node: a commit with confirmation-side reports
  holds the survey's confirmation-side lock shared and reads whether the side is closed in its
  own transaction; a seal closes it holding that lock exclusively
  (aggregator/store/postgres/confirm.py). So a report is either committed before the side
  closed (and counted by the seal) or sees it closed and is refused.
"""

from __future__ import annotations

import logging
import operator
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import psycopg
from psycopg import errors

from aggregator.store.errors import ConfirmationClosedError, StoreError, StoreUnavailableError
from aggregator.store.model import (
    CONFIRMATION,
    CONFLICT,
    DUPLICATE,
    RECEIVED_RESOLUTION,
    REPORT_ID_BYTES,
    STORED,
    ReportBatch,
    StoredReport,
    batches_of,
)
from aggregator.store.postgres import design
from aggregator.store.postgres.analysis import PostgresAnalysis
from aggregator.store.postgres.confirmation_lock import lock_confirmation_side
from aggregator.store.postgres.connection import connect, redacted
from aggregator.store.postgres.log import read_reports
from aggregator.store.postgres.schema import migrate
from aggregator.store.postgres.statistics import read_side

log = logging.getLogger(__name__)

#: Shards of each question's statistics: concurrent commits pick one at random each.
DEFAULT_SHARDS = 16
#: Readers' connections kept open between calls (stored_ids runs on every capped upload).
IDLE_READERS = 4
#: Times a transaction is run again after a deadlock or serialization failure.
RETRIES = 5
_INT64 = np.dtype(np.int64)

_INSERT = """INSERT INTO reports
    (report_id, survey_id, question_id, payload, received_at, side, group_value)
SELECT * FROM unnest(%s::bytea[], %s::text[], %s::text[], %s::bytea[], %s::bigint[],
    %s::smallint[], %s::text[]) ORDER BY 1
ON CONFLICT (report_id) DO NOTHING RETURNING report_id"""
_ADD = """INSERT INTO statistic_shards AS s
    (survey_id, question_id, side, group_value, shard, n, sums)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (survey_id, question_id, side, group_value, shard) DO UPDATE SET
    n = s.n + excluded.n,
    sums = ARRAY(SELECT a + b FROM unnest(s.sums, excluded.sums) WITH ORDINALITY AS t(a, b, i)
        ORDER BY i)"""


@dataclass(slots=True)
class _Submit:
    batches: list[ReportBatch]
    size: int
    future: Future[list[int]]


class _Stop:
    """Queued by close(): everything before it is committed, then the writer exits."""


class PostgresStore:
    """Reports and statistics in a shared PostgreSQL database; see the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        max_batch: int = 2000,
        max_delay: float = 0.002,
        shards: int = DEFAULT_SHARDS,
        on_commit: Callable[[float, int], None] | None = None,
    ) -> None:
        """``on_commit(seconds, reports)`` runs in the writer thread after each committed group."""
        if max_batch < 1 or max_delay < 0 or not 1 <= shards <= 1024:
            raise ValueError("max_batch must be >= 1, max_delay >= 0 and shards in 1..1024")
        self._url = url
        self._max_batch = max_batch
        self._max_delay = max_delay
        self._shards = shards
        self._on_commit = on_commit
        self._conn: psycopg.Connection | None = connect(url)
        try:
            migrate(self._conn)
            self._k = self._read_ks()
        except psycopg.Error as exc:
            self._conn.close()
            raise StoreError(f"{self.path} is not a usable report store: {exc}") from None
        except BaseException:
            self._conn.close()
            raise
        self._queue: queue.SimpleQueue[_Submit | _Stop] = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders "closed" against enqueueing; guards _idle
        self._closed = False
        self._idle: list[psycopg.Connection] = []
        self._writer = threading.Thread(target=self._run, name="postgres-store-writer", daemon=True)
        self._writer.start()

    @property
    def path(self) -> str:
        """The database's URL without its password."""
        return redacted(self._url)

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- writes --------------------------------------------------------------------------------

    def register_question(self, survey_id: str, question_id: str, k: int) -> None:
        """Record the question's statistic length if missing. Idempotent; another k for a
        registered question is a StoreError."""
        k = operator.index(k)
        if k < 1:
            raise StoreError(f"k must be >= 1, got {k}")
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO questions VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                (survey_id, question_id, k),
            )
            (stored,) = conn.execute(
                "SELECT k FROM questions WHERE survey_id = %s AND question_id = %s",
                (survey_id, question_id),
            ).fetchone() or (k,)
        if stored != k:
            raise StoreError(
                f"question {survey_id}/{question_id} is registered with k={stored}, not {k}"
            )
        self._k[(survey_id, question_id)] = k

    def submit(self, reports: Sequence[StoredReport]) -> Future[list[int]]:
        """Queue reports for the next group commit; see ReportStore.submit."""
        for report in reports:
            k = self._k_of(report.survey_id, report.question_id)
            vector = report.contribution
            if not isinstance(vector, np.ndarray) or vector.dtype != _INT64 or vector.shape != (k,):
                raise StoreError(f"contribution must be an int64 vector of length {k}")
        return self.submit_batches(batches_of(reports))

    def submit_batches(self, batches: Sequence[ReportBatch]) -> Future[list[int]]:
        """Queue validated batches without blocking; the future resolves after COMMIT with one
        flag per report (STORED, DUPLICATE, CONFLICT) in the batches' order."""
        batches = list(batches)
        for batch in batches:
            self._check(batch)
        item = _Submit(batches, sum(len(b) for b in batches), Future())
        with self._lock:
            if self._closed:
                raise StoreError("store is closed")
            self._queue.put(item)
        return item.future

    def put(self, reports: Sequence[StoredReport]) -> list[int]:
        """Blocking submit: the flags once the reports are durable."""
        return self.submit(reports).result()

    def analysis(self) -> PostgresAnalysis:
        """The Analyst's state in this database (releases, plans, seals, the holdout), shared
        by every node: aggregator/store/contract.py's AnalysisStore."""
        return PostgresAnalysis(self)

    def close(self) -> None:
        """Stop accepting, commit everything already submitted, stop the writer. Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_Stop())
        self._writer.join()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # -- reads (connections of their own, never the writer's) -----------------------------

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection]:
        """A reader's connection (not the writer's) inside one transaction (READ COMMITTED):
        an idle one kept from an earlier call (if it still answers), or a new one. A lost
        connection or an unreachable database is StoreUnavailableError, and that connection is
        not kept."""
        if self._closed:
            raise StoreError("store is closed")
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is not None:
            try:
                conn.execute("SELECT 1")  # kept idle: the server may have ended its session
            except psycopg.Error:
                conn.close()
                conn = None
        if conn is None:
            conn = connect(self._url)
        try:
            with conn.transaction():
                yield conn
        except psycopg.OperationalError as exc:
            conn.close()
            raise StoreUnavailableError(f"the PostgreSQL store is unreachable: {exc}") from None
        except BaseException:
            conn.close()
            raise
        with self._lock:
            if self._closed or len(self._idle) >= IDLE_READERS:
                conn.close()
            else:
                self._idle.append(conn)

    def statistics(
        self, survey_id: str, question_id: str, side: int = 0, group: str = ""
    ) -> tuple[int, np.ndarray]:
        """The question's committed (n, int64 sums) on ``side``, of one ``group`` ('': pooled)."""
        with self.transaction() as conn:
            return read_side(conn, survey_id, question_id, side, group)

    def stored_ids(self, report_ids: Sequence[bytes]) -> set[bytes]:
        """Which of ``report_ids`` the log holds (committed, by any node)."""
        ids = [i for i in report_ids if isinstance(i, bytes) and len(i) == REPORT_ID_BYTES]
        if not ids:
            return set()
        with self.transaction() as conn:
            rows = conn.execute("SELECT report_id FROM reports WHERE report_id = ANY(%s)", (ids,))
            return {bytes(row[0]) for row in rows}

    def count_reports(self, survey_id: str | None = None) -> int:
        """Reports in the log (one survey's, or all)."""
        with self.transaction() as conn:
            if survey_id is None:
                row = conn.execute("SELECT count(*) FROM reports").fetchone()
            else:
                sql = "SELECT count(*) FROM reports WHERE survey_id = %s"
                row = conn.execute(sql, (survey_id,)).fetchone()
        return int(row[0]) if row else 0

    def iter_reports(
        self,
        survey_id: str,
        question_id: str | None = None,
        batch: int = 10000,
        side: int | None = None,
    ) -> Iterator[tuple[bytes, str, bytes, str]]:
        """Stream (report_id, question_id, payload, group) in report_id order from one snapshot
        (a server-side cursor)."""
        with self.transaction() as conn:
            yield from read_reports(conn, survey_id, question_id, batch, side)

    # -- internals -----------------------------------------------------------------------------

    def _read_ks(self) -> dict[tuple[str, str], int]:
        assert self._conn is not None
        rows = self._conn.execute("SELECT survey_id, question_id, k FROM questions")
        return {(s, q): k for s, q, k in rows}

    def _k_of(self, survey_id: str, question_id: str) -> int:
        k = self._k.get((survey_id, question_id))
        if k is None:
            raise StoreError(f"unknown question {survey_id}/{question_id}")
        return k

    def _check(self, batch: ReportBatch) -> None:
        """Reject a malformed batch before anything is queued."""
        k = self._k_of(batch.survey_id, batch.question_id)
        m = len(batch.report_ids)
        if any(type(i) is not bytes or len(i) != REPORT_ID_BYTES for i in batch.report_ids):
            raise StoreError(f"report_id must be {REPORT_ID_BYTES} bytes")
        if len(batch.payloads) != m or any(type(p) is not bytes for p in batch.payloads):
            raise StoreError("payload must be bytes, one per report")
        rows = batch.contributions
        if not isinstance(rows, np.ndarray) or rows.dtype != _INT64 or rows.shape != (m, k):
            raise StoreError(f"contributions must be an int64 matrix of shape ({m}, {k})")

    def _run(self) -> None:
        """The writer thread: group submits into transactions until the stop marker."""
        while True:
            item = self._queue.get()
            if isinstance(item, _Stop):
                return
            group, size = [item], item.size
            deadline = time.monotonic() + self._max_delay
            stop = False
            while size < self._max_batch:
                try:
                    more = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if isinstance(more, _Stop):
                    stop = True
                    break
                group.append(more)
                size += more.size
            self._commit(group)
            if stop:
                return

    def _commit(self, group: list[_Submit]) -> None:
        """Write a group in one transaction, then resolve its futures. If it fails, retry each
        submit alone, so one caller's refused reports do not fail the others'."""
        group = [submit for submit in group if submit.future.set_running_or_notify_cancel()]
        if not group:
            return
        try:
            started = time.perf_counter()
            flags = self._write([batch for submit in group for batch in submit.batches])
        except StoreUnavailableError as exc:
            for submit in group:
                submit.future.set_exception(exc)
            return
        except StoreError as exc:
            if len(group) == 1:
                group[0].future.set_exception(exc)
                return
            for submit in group:  # alone: a survey sealed meanwhile refuses only its reports
                self._commit_alone(submit)
            return
        if self._on_commit is not None:
            self._on_commit(time.perf_counter() - started, len(flags))
        start = 0
        for submit in group:
            submit.future.set_result(flags[start : start + submit.size])
            start += submit.size

    def _commit_alone(self, submit: _Submit) -> None:
        try:
            submit.future.set_result(self._write(submit.batches))
        except StoreError as exc:
            submit.future.set_exception(exc)

    def _write(self, batches: list[ReportBatch]) -> list[int]:
        """One transaction, run again after a deadlock or serialization failure, and once on a
        new connection after the connection was lost (a database restart or failover, an
        administrator ending sessions). Running it again is safe even if the lost transaction
        committed: its reports are then found stored, DUPLICATE, and counted once. The
        connection lost again: StoreUnavailableError, nothing acknowledged, the device resends."""
        if not any(len(b) for b in batches):
            return []
        reconnected = False
        for attempt in range(1, RETRIES + 1):
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = connect(self._url)
                with self._conn.transaction():
                    return self._write_once(self._conn, batches)
            except (errors.DeadlockDetected, errors.SerializationFailure):
                if attempt == RETRIES:
                    raise StoreUnavailableError("the store is busy, try again") from None
            except errors.NumericValueOutOfRange:
                raise StoreError("the statistics' sums would overflow int64") from None
            except psycopg.OperationalError as exc:
                self._drop_connection()
                if reconnected:
                    raise StoreUnavailableError(
                        f"the PostgreSQL store is unreachable: {exc}"
                    ) from None
                reconnected = True
            except psycopg.Error as exc:
                raise StoreError(f"commit failed: {exc}") from None
        raise StoreUnavailableError("the PostgreSQL store is unreachable, try again")

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def _write_once(self, conn: psycopg.Connection, batches: list[ReportBatch]) -> list[int]:
        _refuse_closed_sides(conn, batches)
        now = int(time.time()) // RECEIVED_RESOLUTION * RECEIVED_RESOLUTION
        ids = [i for b in batches for i in b.report_ids]
        contents = [
            (b.survey_id, b.question_id, p, b.side, b.group) for b in batches for p in b.payloads
        ]
        first: dict[bytes, int] = {}
        for i, report_id in enumerate(ids):
            first.setdefault(report_id, i)
        fresh = list(first.values())
        columns = [[ids[i] for i in fresh], *([contents[i][c] for i in fresh] for c in range(3))]
        cursor = conn.execute(
            _INSERT,
            (
                *columns,
                [now] * len(fresh),
                [contents[i][3] for i in fresh],
                [contents[i][4] for i in fresh],
            ),
        )
        inserted = {bytes(row[0]) for row in cursor.fetchall()}
        known = {report_id: contents[i][:3] for report_id, i in first.items()}
        others = [report_id for report_id in first if report_id not in inserted]
        if others:
            sql = (
                "SELECT report_id, survey_id, question_id, payload FROM reports "
                "WHERE report_id = ANY(%s)"
            )
            for report_id, *content in conn.execute(sql, (others,)):
                known[bytes(report_id)] = (content[0], content[1], bytes(content[2]))
        flags = []
        for i, report_id in enumerate(ids):
            if first[report_id] == i and report_id in inserted:
                flags.append(STORED)
            else:
                flags.append(DUPLICATE if contents[i][:3] == known[report_id] else CONFLICT)
        self._add_statistics(conn, batches, flags)
        return flags

    def _add_statistics(
        self, conn: psycopg.Connection, batches: list[ReportBatch], flags: list[int]
    ) -> None:
        """Add the stored reports' contributions to one random shard of each statistic they
        touch, pooled and per group; the rows in one order, so commits never wait in a cycle."""
        parts: dict[tuple[str, str, int, str], list[np.ndarray]] = {}
        start = 0
        for b in batches:
            mask = np.array([f == STORED for f in flags[start : start + len(b)]], dtype=bool)
            start += len(b)
            rows = b.contributions[mask]
            if len(rows):
                parts.setdefault((b.survey_id, b.question_id, b.side, ""), []).append(rows)
                if b.group:
                    parts.setdefault((b.survey_id, b.question_id, b.side, b.group), []).append(rows)
        shard = random.randrange(self._shards)
        for key in sorted(parts):
            rows = np.concatenate(parts[key])
            conn.execute(_ADD, (*key, shard, len(rows), exact_sums(rows)))
        if any(b.design_keys for b in batches):  # a survey with a sampling design
            design.add(conn, batches, flags, shard)


def _refuse_closed_sides(conn: psycopg.Connection, batches: list[ReportBatch]) -> None:
    """Inside the write transaction: take the confirmation-side lock (shared) of the surveys
    with confirmation-side reports, then refuse the commit if one of them is closed (sealed,
    or being sealed)."""
    surveys = sorted({b.survey_id for b in batches if b.side == CONFIRMATION and len(b)})
    if not surveys:
        return
    for survey_id in surveys:
        lock_confirmation_side(conn, survey_id, exclusive=False)
    sql = "SELECT survey_id FROM confirmations WHERE survey_id = ANY(%s) AND closed_at IS NOT NULL"
    sealed = sorted(row[0] for row in conn.execute(sql, (surveys,)))
    if sealed:
        raise ConfirmationClosedError(
            f"survey {sealed[0]!r}: the confirmation side is closed (its confirmatory results "
            "are sealed); the report is not needed"
        )


def exact_sums(rows: np.ndarray) -> list[int]:
    """Column sums of an (m, k) int64 matrix as Python ints, exactly (numpy's int64 sum would
    wrap silently on overflow)."""
    bound = max(int(rows.max()), -int(rows.min())) if rows.size else 0
    if bound * len(rows) < 2**62:
        return [int(x) for x in rows.sum(axis=0)]
    return [int(x) for x in rows.astype(object).sum(axis=0)]
