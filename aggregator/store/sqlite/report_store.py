"""Durable embedded store of randomized reports: an append-only SQLite log of reports plus each
question's integer sufficient statistic, updated in the same transaction. This module is the
store's writer (group commit on one thread) and its reads; the file's schema is in schema.py,
the log in log.py, the statistics in statistics.py and the saved id index in saved_index.py
(all in aggregator/store/sqlite/).

Why this shape (notes/service-conventions.md §3):

* One writer thread owns the only write connection and does group commit: it takes everything
  queued (up to ``max_batch`` reports, waiting at most ``max_delay`` seconds for more) into ONE
  transaction and resolves the callers' futures only after COMMIT. With WAL and
  ``synchronous=FULL`` an acknowledged report survives a process kill and a power loss.
* The log (``reports``) is appended to: its rows are keyed by ``seq``, so a commit writes the
  pages of the log's current block however large it is (a log keyed by the random report ids
  made each report dirty a page of its own once it was large: docs/performance.md). Within a block
  of BLOCK numbers the places are taken in random order (log.py's :class:`Blocks`), so the log's
  order groups no upload.
* ``report_id`` (16 random bytes chosen by the device) is unique in the log, so a resend is
  reported as a duplicate and counted once: the writer finds the ids a commit may repeat in an
  in-memory hash table of keyed id hashes (aggregator/store/sqlite/id_index.py, 15-30 bytes a
  report, saved at a clean close and rebuilt from the log otherwise), and compares the whole ids
  against the log rows it names. Ids are global, not scoped per survey: an id stored
  with a different survey, question or payload is a conflict (docs/wire.md §6), neither stored
  nor counted, and never mistaken for a resend. No device identity is stored with a report (the
  per-device cap counts of aggregator/service/collector/limits.py live in their own table, with no
  report ids).
* The statistics are derived data: :meth:`ReportStore.rebuild` recomputes them from the log.
* A split survey's reports carry their side (1 exploration, 2 confirmation; 0 for a survey that
  is not split). Side 0 statistics live in ``statistics``, a split survey's per side in
  ``side_statistics``, so nothing that reads ``statistics`` ever sees the confirmation side.
  Once a survey's confirmation side is closed (its results sealed: ``confirmations``, written
  by aggregator/store/sqlite/confirmations.py), the writer refuses its confirmation-side reports.
* A survey with a public group label (docs/two-sample.md) stores each report's group
  (``reports.group_value``; '' for a survey without one). ``statistics`` and ``side_statistics``
  pool all groups; ``group_statistics`` holds each (question, side, group) of a grouped report
  in the same transaction, so a group is read without scanning the log.
* Nothing at rest groups the reports of one upload once ``wal_window`` seconds have passed: a
  report keeps only its arrival *day* (``received_at``, a UTC midnight), it takes a random
  place among those of the BLOCK reports around it, independently of its upload's other
  reports, and the writer checkpoints and truncates the WAL (which holds each transaction's
  reports together) within ``wal_window`` seconds of a commit.

Threading: :meth:`ReportStore.submit` and :meth:`ReportStore.submit_batches` never block (they
validate and enqueue), so an asyncio server calls them on the event loop and awaits
``asyncio.wrap_future(store.submit_batches(batches))``. Every other
method does blocking I/O: call it through ``asyncio.to_thread``. Reads open their own connection per
call and never wait for the writer (WAL readers see the last committed state). Use one ReportStore
per database file (it caches the registered questions).
"""

from __future__ import annotations

import itertools
import logging
import operator
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import closing, suppress
from dataclasses import dataclass
from typing import Any

import numpy as np

from aggregator.store.errors import ConfirmationClosedError, StoreError, StoreFailedError
from aggregator.store.model import (
    CONFIRMATION,
    RECEIVED_RESOLUTION,
    REPORT_ID_BYTES,
    STORED,
    ReportBatch,
    StoredReport,
    batches_of,
)
from aggregator.store.sqlite import design_statistics
from aggregator.store.sqlite.analysis import SqliteAnalysis
from aggregator.store.sqlite.confirmations import closed_confirmations
from aggregator.store.sqlite.connection import BUSY_TIMEOUT_MS, busy_error, read_only, transaction
from aggregator.store.sqlite.file_kind import FileKindError, check_kind, open_file, stamp_kind
from aggregator.store.sqlite.integrity import FileWatch, failure_message
from aggregator.store.sqlite.log import Blocks, content_rows, contents_at, log_rows, outcomes
from aggregator.store.sqlite.saved_index import (
    index_log,
    open_index,
    save_index,
    save_index_entries,
)
from aggregator.store.sqlite.schema import STORE_KIND, migrate
from aggregator.store.sqlite.statistics import (
    accumulate,
    read_side,
    read_statistics,
    write_statistics,
)

log = logging.getLogger(__name__)

_INT64 = np.dtype(np.int64)
_WRITER_CACHE_KIB = 64 * 1024
#: About 16 MB of WAL between the writer's automatic (passive) checkpoints: the log is written in
#: arrival order, so a checkpoint writes mostly new pages once whatever its size, and small ones
#: keep every stretch of ingest paying the same share (docs/performance.md).
_WAL_AUTOCHECKPOINT_PAGES = 4_000
_CHECKPOINT_BUSY_MS = 200  # a timed checkpoint waits this long for readers, then tries later
#: The id index's new entries are saved once this many log rows past the last save are final, so
#: a start after a crash indexes at most about this many rows from the log (docs/performance.md).
INDEX_SAVE_ROWS = 1 << 18


WriteHook = Callable[[sqlite3.Connection, list[int]], None]


@dataclass(slots=True)
class _Submit:
    batches: list[ReportBatch]
    size: int
    future: Future[list[int]]
    on_write: WriteHook | None = None


@dataclass(slots=True)
class _Call:
    fn: Callable[[sqlite3.Connection], Any]
    future: Future[Any]


class _Stop:
    """Queued by close(): everything before it is drained, then the writer exits."""


_Item = _Submit | _Call | _Stop


class ReportStore:
    """Reports and statistics in one SQLite file; see the module docstring for the guarantees."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_batch: int = 2000,
        max_delay: float = 0.002,
        wal_window: float = 5.0,
        on_commit: Callable[[float, int], None] | None = None,
    ) -> None:
        """``on_commit(seconds, reports)`` runs in the writer thread after each committed group
        (the service's metrics). ``wal_window``: the longest a commit stays in the WAL."""
        if max_batch < 1 or max_delay < 0 or not wal_window > 0:
            raise ValueError("max_batch must be >= 1, max_delay >= 0 and wal_window > 0")
        self._wal_window = wal_window
        self._path = os.fspath(path)
        self._max_batch = max_batch
        self._max_delay = max_delay
        self._on_commit = on_commit
        try:
            conn = open_file(self._path)
        except FileKindError as exc:
            raise StoreError(str(exc)) from None
        try:
            unstamped = check_kind(conn, STORE_KIND, self._path)
            # A bigger page cache for the writer, and small passive checkpoints (above).
            conn.execute(f"PRAGMA cache_size = -{_WRITER_CACHE_KIB}")
            conn.execute(f"PRAGMA wal_autocheckpoint = {_WAL_AUTOCHECKPOINT_PAGES}")
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode != "wal":
                raise StoreError(f"cannot put {self._path} in WAL mode (got {mode!r})")
            migrate(conn, self._path)
            if unstamped:
                stamp_kind(conn, STORE_KIND)
            rows = conn.execute("SELECT survey_id, question_id, k FROM statistics")
            self._k = {(s, q): k for s, q, k in rows}
            self._closed_sides = closed_confirmations(conn)
            self._data_version = conn.execute("PRAGMA data_version").fetchone()[0]
            self._index, self._index_saved = open_index(conn)
            self._blocks = Blocks.read(conn)
            self._watch = FileWatch(self._path)
        except FileKindError as exc:
            conn.close()
            raise StoreError(str(exc)) from None
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(f"{self._path} is not a usable report store (SQLite: {exc})") from None
        except BaseException:
            conn.close()
            raise
        self._conn = conn  # used only by the writer thread from here on
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders "closed" against enqueueing
        self._closed = False
        self._failure: str | None = None  # set once by the writer; then nothing is acknowledged
        self._writer = threading.Thread(target=self._run, name="report-store-writer", daemon=True)
        self._writer.start()

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    def __enter__(self) -> ReportStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- writes --------------------------------------------------------------------------------

    def register_question(self, survey_id: str, question_id: str, k: int) -> None:
        """Create the question's statistics row (n = 0, zero sums) if missing. Idempotent; a
        different k for an existing question is a StoreError. ``k`` (the column ``k``) is the
        length of the statistic, ``QuestionSpec.statistic_size``: the number of categories, or
        2L for public-coin one-bit reports."""
        k = operator.index(k)
        if k < 1:
            raise StoreError(f"k must be >= 1, got {k}")

        def create(conn: sqlite3.Connection) -> None:
            row = conn.execute(
                "SELECT k FROM statistics WHERE survey_id = ? AND question_id = ?",
                (survey_id, question_id),
            ).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO statistics VALUES (?, ?, ?, 0, ?)",
                    (survey_id, question_id, k, bytes(8 * k)),
                )
            elif row[0] != k:
                raise StoreError(
                    f"question {survey_id}/{question_id} is registered with k={row[0]}, not {k}"
                )

        self._call(create)
        self._k[(survey_id, question_id)] = k

    def submit(
        self, reports: Sequence[StoredReport], on_write: WriteHook | None = None
    ) -> Future[list[int]]:
        """Queue reports for the next group commit without blocking. The future resolves after
        their transaction committed, with one flag per report: STORED, DUPLICATE (the identical
        report was stored earlier or earlier in the same transaction) or CONFLICT (its id was,
        with another survey, question or payload; the first occurrence wins). A malformed
        report raises StoreError here and nothing is queued.
        A future cancelled before the writer takes it up is not written.

        ``on_write(connection, flags)`` runs on the writer thread inside the transaction that
        stores these reports, so what it writes (e.g. per-device counts) commits with them or
        not at all."""
        for report in reports:
            _check_contribution(
                report.contribution, self._k_of(report.survey_id, report.question_id)
            )
        return self.submit_batches(batches_of(reports), on_write)

    def submit_batches(
        self, batches: Sequence[ReportBatch], on_write: WriteHook | None = None
    ) -> Future[list[int]]:
        """:meth:`submit` for reports in bulk form; the flags follow the batches' order."""
        batches = list(batches)
        for batch in batches:
            self._check(batch)
        item = _Submit(batches, sum(len(b) for b in batches), Future(), on_write)
        self._enqueue(item)
        return item.future

    def run_in_writer(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``fn(connection)`` in one write transaction on the writer thread; its result."""
        return self._call(fn)

    def analysis(self) -> SqliteAnalysis:
        """The Analyst's state in this store (releases, plans, seals, the holdout), written
        through this writer: aggregator/store/contract.py's AnalysisStore."""
        return SqliteAnalysis(self)

    def put(self, reports: Sequence[StoredReport]) -> list[int]:
        """Blocking submit: returns the flags once the reports are durable."""
        return self.submit(reports).result()

    def rebuild(
        self,
        contribution: Callable[[str, str, bytes], np.ndarray],
        progress: Callable[[int], object] | None = None,
    ) -> dict[tuple, tuple[int, np.ndarray]]:
        """Recompute every registered question's (n, sums) from the report log (keys (survey,
        question); a split survey's sides as (survey, question, side); each group of a grouped
        survey as (survey, question, side, group)), using
        ``contribution(survey_id, question_id, payload)``, and store them in one transaction;
        ``progress(count)`` hears of each chunk of reports read (on the writer thread).

        It runs on the writer thread, so it is atomic with respect to submits: reports submitted
        meanwhile wait and are committed after it (ingestion pauses for the whole scan)."""

        def recompute(conn: sqlite3.Connection) -> dict[tuple, tuple[int, np.ndarray]]:
            registered = conn.execute("SELECT survey_id, question_id, k FROM statistics")
            ks = {(survey_id, question_id): k for survey_id, question_id, k in registered}
            totals: dict[tuple, tuple[int, list[int]]] = {
                (*key, 0): (0, [0] * k) for key, k in ks.items()
            }
            conn.execute("DELETE FROM side_statistics")
            conn.execute("DELETE FROM group_statistics")
            sql = "SELECT survey_id, question_id, side, group_value, payload FROM reports"
            cursor = conn.execute(sql)
            while rows := cursor.fetchmany(10000):
                pending: dict[tuple, list[np.ndarray]] = {}
                for survey_id, question_id, side, group_value, payload in rows:
                    if (survey_id, question_id) not in ks:
                        raise StoreError(
                            f"log holds unregistered question {survey_id}/{question_id}"
                        )
                    vector = contribution(survey_id, question_id, payload)
                    _check_contribution(vector, ks[(survey_id, question_id)])
                    pending.setdefault((survey_id, question_id, side), []).append(vector)
                    if group_value:
                        key = (survey_id, question_id, side, group_value)
                        pending.setdefault(key, []).append(vector)
                for key, vectors in pending.items():
                    start = totals.get(key, (0, [0] * ks[key[:2]]))
                    totals[key] = accumulate(*start, np.stack(vectors))
                if progress is not None:
                    progress(len(rows))
            for key, (n, sums) in totals.items():
                write_statistics(conn, *key[:2], n, sums, *key[2:])
            return {
                key[:2] if key[2:] == (0,) else key: (n, np.array(sums, dtype=np.int64))
                for key, (n, sums) in totals.items()
            }

        return self._call(recompute)

    def close(self) -> None:
        """Stop accepting, commit everything already submitted, stop the writer, checkpoint and
        truncate the WAL. Idempotent. Do not call it from a future's done-callback (those run on
        the writer thread)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_Stop())
        self._writer.join()

    # -- reads (own connection per call, never the writer's) -----------------------------------

    def statistics(
        self, survey_id: str, question_id: str, side: int = 0, group: str = ""
    ) -> tuple[int, np.ndarray]:
        """The question's committed (n, int64 sums) on ``side`` (0: a survey that is not split),
        of one ``group`` ('' : all groups pooled)."""
        if self._closed:
            raise StoreError("store is closed")
        return read_statistics(self._path, survey_id, question_id, side, group)

    def close_confirmation(self, survey_id: str) -> None:
        """From now on refuse the survey's confirmation-side reports. Call it only on the writer
        thread, inside the transaction that seals the survey's results (run_in_writer)."""
        self._closed_sides.add(survey_id)

    def stored_ids(self, report_ids: Sequence[bytes]) -> set[bytes]:
        """Which of ``report_ids`` the log holds (committed): the in-memory index's candidates,
        confirmed against the log."""
        if self._closed:
            raise StoreError("store is closed")
        ids = [i for i in report_ids if isinstance(i, bytes) and len(i) == REPORT_ID_BYTES]
        candidates = self._index.candidates(self._index.keys(ids))
        if not candidates:
            return set()
        with closing(self._reader()) as conn:
            found = contents_at(conn, sorted({s for seqs in candidates.values() for s in seqs}))
        return {ids[i] for i in candidates if ids[i] in found}

    def count_reports(self, survey_id: str | None = None) -> int:
        """Reports in the log (one survey's, or all); a scan of the log."""
        with closing(self._reader()) as conn:
            if survey_id is None:
                return conn.execute("SELECT count(*) FROM reports").fetchone()[0]
            sql = "SELECT count(*) FROM reports WHERE survey_id = ?"
            return conn.execute(sql, (survey_id,)).fetchone()[0]

    def iter_reports(
        self,
        survey_id: str,
        question_id: str | None = None,
        batch: int = 10000,
        side: int | None = None,
    ) -> Iterator[tuple[bytes, str, bytes, str]]:
        """Stream (report_id, question_id, payload, group) in report_id order, ``batch`` rows at
        a time, from one consistent snapshot (a single read statement)."""
        sql = "SELECT report_id, question_id, payload, group_value FROM reports WHERE survey_id = ?"
        params: tuple[str | int, ...] = (survey_id,)
        if question_id is not None:
            sql += " AND question_id = ?"
            params += (question_id,)
        if side is not None:  # one side of a split survey
            sql += " AND side = ?"
            params += (side,)
        with closing(self._reader()) as conn:
            cursor = conn.execute(sql + " ORDER BY report_id", params)
            while rows := cursor.fetchmany(batch):
                yield from rows

    def integrity_check(self) -> str:
        """``PRAGMA integrity_check``: "ok" for a sound database file."""
        with closing(self._reader()) as conn:
            return "\n".join(row[0] for row in conn.execute("PRAGMA integrity_check"))

    # -- internals -----------------------------------------------------------------------------

    def _k_of(self, survey_id: str, question_id: str) -> int:
        k = self._k.get((survey_id, question_id))
        if k is None:
            raise StoreError(f"unknown question {survey_id}/{question_id}")
        return k

    def _check(self, batch: ReportBatch) -> None:
        """Reject a malformed batch before anything is queued (checks run in C where they can:
        this is on the ingest path of every report)."""
        k = self._k_of(batch.survey_id, batch.question_id)
        m = len(batch.report_ids)
        if set(map(type, batch.report_ids)) - {bytes} or set(map(len, batch.report_ids)) - {
            REPORT_ID_BYTES
        }:
            raise StoreError(f"report_id must be {REPORT_ID_BYTES} bytes")
        if len(batch.payloads) != m or set(map(type, batch.payloads)) - {bytes}:
            raise StoreError("payload must be bytes, one per report")
        rows = batch.contributions
        if not isinstance(rows, np.ndarray) or rows.dtype != _INT64 or rows.shape != (m, k):
            raise StoreError(f"contributions must be an int64 matrix of shape ({m}, {k})")

    @property
    def failure(self) -> str | None:
        """Why the store stopped acknowledging (None while it works)."""
        return self._failure

    def _enqueue(self, item: _Item) -> None:
        with self._lock:
            if self._closed:
                raise StoreError("store is closed")
            if self._failure is not None and not isinstance(item, _Stop):
                raise StoreFailedError(self._failure)
            self._queue.put(item)

    def _call(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run fn(write connection) in one transaction on the writer thread; wait for it."""
        item = _Call(fn, Future())
        self._enqueue(item)
        return item.future.result()

    def _reader(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError("store is closed")
        return read_only(self._path)

    def _run(self) -> None:
        """The writer thread: group submits into transactions until the stop marker, and empty
        the WAL within ``wal_window`` seconds of a commit."""
        carry: _Item | None = None
        checkpoint_at: float | None = None  # when the oldest commit still in the WAL expires
        while True:
            if carry is None and checkpoint_at is not None:
                try:
                    carry = self._queue.get(timeout=max(0.0, checkpoint_at - time.monotonic()))
                except queue.Empty:
                    checkpoint_at = None if self._empty_wal() else time.monotonic() + 1.0
                    continue
            item = carry if carry is not None else self._queue.get()
            carry = None
            if isinstance(item, _Stop):
                break
            if isinstance(item, _Call):
                self._run_call(item)
                continue
            group, size = [item], item.size
            deadline = time.monotonic() + self._max_delay
            while size < self._max_batch:
                try:
                    nxt = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if not isinstance(nxt, _Submit) or size + nxt.size > self._max_batch:
                    carry = nxt  # a stop, a call or an overflowing submit: next round
                    break
                group.append(nxt)
                size += nxt.size
            self._commit([s for s in group if s.future.set_running_or_notify_cancel()])
            self._save_new_index_entries()
            if checkpoint_at is None:
                checkpoint_at = time.monotonic() + self._wal_window
            elif time.monotonic() >= checkpoint_at:  # never idle: checkpoint between groups
                checkpoint_at = None if self._empty_wal() else time.monotonic() + 1.0
        try:
            if self._failure is None:
                with suppress(sqlite3.Error):  # only start-up time is lost without it
                    save_index(self._conn, self._index, self._blocks.start - 1)
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self._conn.close()

    def _save_new_index_entries(self) -> None:
        """Between commits, once INDEX_SAVE_ROWS more log rows are final (their block is full),
        append their index entries to the saved index: a crash then costs a start-up that
        indexes only the rows after them, not the whole log since the last clean close."""
        covered = self._blocks.start - 1
        if self._failure is not None or covered - self._index_saved < INDEX_SAVE_ROWS:
            return
        try:
            save_index_entries(self._conn, self._index, self._index_saved, covered)
        except sqlite3.Error as exc:  # only start-up time after a crash is lost: retried later
            log.warning("cannot save the report id index (retried): %s", exc)
            return
        self._index_saved = covered
        self._index.forget_through(covered)

    def _empty_wal(self) -> bool:
        """Copy the WAL into the database file and truncate it to zero bytes, waiting briefly
        for readers of older snapshots: True when it is empty."""
        if self._failure is not None:
            return True
        conn = self._conn
        conn.execute(f"PRAGMA busy_timeout = {_CHECKPOINT_BUSY_MS}")
        try:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error:
            return False
        finally:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        return busy == 0

    def _run_call(self, item: _Call) -> None:
        if not item.future.set_running_or_notify_cancel():
            return
        try:
            with transaction(self._conn):
                result = item.fn(self._conn)
        except Exception as exc:
            item.future.set_exception(busy_error(exc) or exc)
        else:
            item.future.set_result(result)

    def _commit(self, group: list[_Submit]) -> None:
        """Write a group in one transaction, then resolve its futures. If it fails, retry each
        submit alone, so one caller's failure does not fail the other callers' reports."""
        if not group:
            return
        if self._failure is not None:
            for submit in group:
                submit.future.set_exception(StoreFailedError(self._failure))
            return
        try:
            started = time.perf_counter()
            flags = self._write(group)
            if self._on_commit is not None:
                self._on_commit(time.perf_counter() - started, sum(map(len, flags)))
        except Exception as exc:
            failure = failure_message(exc)
            if failure is not None:
                self._fail(failure, group)
                return
            busy = busy_error(exc)
            if busy is not None:  # nothing written: every submit of the group may retry
                for submit in group:
                    submit.future.set_exception(busy)
            elif len(group) > 1:
                for submit in group:
                    self._commit([submit])
            elif isinstance(exc, StoreError):
                group[0].future.set_exception(exc)
            else:
                error = StoreError(f"commit failed: {exc}")
                error.__cause__ = exc
                group[0].future.set_exception(error)
            return
        failure = self._watch.check()
        if failure is not None and not self._rescue():
            self._fail(failure, group)
            return
        if failure is not None:
            self._fail(failure, [])  # this group is durable: rescued into the database file
        for submit, submit_flags in zip(group, flags, strict=True):
            submit.future.set_result(submit_flags)

    def _rescue(self) -> bool:
        """Copy everything committed into the database file (a checkpoint reads the WAL the
        writer still holds open, even if it was deleted): True if all of it got there."""
        if not self._watch.database_intact():
            return False
        try:
            busy, _, _ = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error:
            return False
        return busy == 0

    def _fail(self, failure: str, group: list[_Submit]) -> None:
        """Stop acknowledging: fail ``group`` and, from now on, every submit."""
        self._failure = failure
        for submit in group:
            submit.future.set_exception(StoreFailedError(failure))

    def _write(self, group: list[_Submit]) -> list[list[int]]:
        """One transaction: store the group's reports unless their report_id is stored already
        (or earlier in the group), add the new ones' contributions to their questions' rows;
        after the commit, index the ids that reached the log.

        A new report takes a random free place of the log's current block (:class:`Blocks`).
        The usual case, no duplicates, costs one lookup of the group's id hashes in the
        in-memory index and one insert per report, into the current block's pages. Only ids
        whose hash is indexed (or repeated in the group) are looked up in the log by ``seq``
        and compared whole, to learn which ones were new and which repeat an id with other
        content (conflicts)."""
        conn = self._conn
        batches = [batch for submit in group for batch in submit.batches]
        now = int(time.time()) // RECEIVED_RESOLUTION * RECEIVED_RESOLUTION
        ids = list(itertools.chain.from_iterable(b.report_ids for b in batches))
        index = self._index
        keys = index.keys(ids)
        with transaction(conn):
            self._refuse_closed_sides(batches)
            last = max(conn.execute("SELECT max(seq) FROM reports").fetchone()[0] or 0, 0)
            if last > index.high_water:  # appended by another connection: index those too
                index_log(conn, index, index.high_water)
            candidates = index.candidates(keys)
            new: np.ndarray | None = None  # which reports are new (None: all of them)
            if not candidates and len(set(ids)) == len(ids):
                fresh = [STORED] * len(ids)
            else:
                fresh = outcomes(conn, content_rows(batches), candidates)
                new = np.array(fresh) == STORED
            positions = np.arange(len(ids)) if new is None else np.flatnonzero(new)
            blocks, seqs = self._blocks.take(len(positions))
            conn.executemany(*log_rows(batches, ids, now, positions, seqs))
            self._add_statistics(batches, new)
            out, start = [], 0
            for submit in group:
                out.append(fresh[start : start + submit.size])
                start += submit.size
                if submit.on_write is not None:
                    submit.on_write(conn, out[-1])
        self._blocks = blocks  # committed: from now on these ids are duplicates
        index.add(keys if new is None else keys[new], seqs)
        return out

    def _refuse_closed_sides(self, batches: list[ReportBatch]) -> None:
        """Inside the write transaction: refuse confirmation-side reports of a sealed survey.
        A seal committed by another connection (a ``--workers`` server's worker) changes the
        database's ``data_version``, and the closed sides are read again."""
        version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version:
            self._data_version = version
            self._closed_sides = closed_confirmations(self._conn)
        for batch in batches:
            if batch.side == CONFIRMATION and batch.survey_id in self._closed_sides:
                raise ConfirmationClosedError(
                    f"survey {batch.survey_id!r}: the confirmation side is closed (its "
                    "confirmatory results are sealed); the report is not needed"
                )

    def _add_statistics(self, batches: list[ReportBatch], new: np.ndarray | None) -> None:
        """Add the new reports' contributions (``new``: which reports of the batches, in order,
        are new; None: all) to their questions' rows, pooled and per group (vectorized per
        question)."""
        by_question: dict[tuple, list[np.ndarray]] = {}
        keyed: list[design_statistics.Keyed] = []
        start = 0
        for b in batches:
            rows, keys = b.contributions, list(b.design_keys)
            if new is not None:
                mask = new[start : start + len(b)]
                rows = rows[mask]
                keys = list(itertools.compress(keys, mask))
            start += len(b)
            by_question.setdefault((b.survey_id, b.question_id, b.side), []).append(rows)
            if b.group:
                key = (b.survey_id, b.question_id, b.side, b.group)
                by_question.setdefault(key, []).append(rows)
            if keys:
                where = (b.survey_id, b.question_id, b.side, b.group)
                keyed.append((where, keys, rows))
        for key, parts in by_question.items():
            rows = parts[0] if len(parts) == 1 else np.concatenate(parts)
            if len(rows):
                n, sums = read_side(self._conn, *key)
                n, sums = accumulate(n, sums, rows)
                write_statistics(self._conn, *key[:2], n, sums, *key[2:])
        if keyed:
            design_statistics.add(self._conn, keyed)


def _check_contribution(vector: object, k: int) -> None:
    if not isinstance(vector, np.ndarray) or vector.dtype != _INT64 or vector.shape != (k,):
        raise StoreError(f"contribution must be an int64 vector of length {k}")
