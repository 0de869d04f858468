"""One ReportStore shared by several server processes over pipes (``serve --workers N``).

SQLite allows one writer, so the process that owns the :class:`ReportStore` (the writer) serves
every worker process through its own duplex pipe. A worker's :class:`RemoteStore` has the part
of the store's interface the gRPC servicers use (``submit_batches``, ``statistics``,
``stored_ids``, ``close``): a submit is pickled across in bulk form (one message per upload, not
per report), the writer hands it to its group commit, and answers with the per-report flags
only after the transaction committed, so an acknowledgement still means "durable". Statistics
are read straight from the SQLite file (WAL readers never wait for the writer).

Messages, worker to writer: ``(request_id, batches)`` or ``_BYE``; writer to worker:
``(request_id, flags, error)`` with flags as bytes of 0/1, or ``_BYE`` once the writer has seen
the worker's ``_BYE``. The pipes are inherited from the parent process, so only our own
processes ever write to them.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from functools import partial
from multiprocessing.connection import Connection

import numpy as np

from aggregator.storage import (
    ReportBatch,
    ReportStore,
    StoreError,
    StoreUnavailableError,
    WriteHook,
    read_statistics,
    read_stored_ids,
)

log = logging.getLogger(__name__)

_BYE = "bye"
_Reply = Callable[[object], None]


def serve_link(store: ReportStore, conn: Connection) -> None:
    """The writer's side of one worker's pipe: submit everything it sends to ``store`` and
    answer after commit. Returns when the worker says goodbye or its pipe breaks; run it in a
    thread per worker."""
    lock = threading.Lock()  # replies come from this thread and from the store's writer thread

    def reply(message: object) -> None:
        # OSError: the worker is gone; what it submitted is committed regardless.
        with lock, contextlib.suppress(OSError):
            conn.send(message)

    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message == _BYE:
            reply(_BYE)
            return
        request_id, batches = message
        try:
            future = store.submit_batches(batches)
        except StoreError as exc:
            reply((request_id, None, str(exc)))
            continue
        future.add_done_callback(partial(_answer, reply, request_id))


def _answer(reply: _Reply, request_id: int, future: Future[list[bool]]) -> None:
    error = future.exception()
    if error is None:
        reply((request_id, bytes(future.result()), None))
    else:
        reply((request_id, None, str(error)))


class RemoteStore:
    """A worker's handle on the writer's ReportStore; see the module docstring."""

    def __init__(
        self,
        conn: Connection,
        db_path: str | os.PathLike[str],
        on_lost: Callable[[], None] = lambda: None,
    ) -> None:
        """``on_lost`` runs (on the receiving thread) if the writer disappears."""
        self._conn = conn
        self._db_path = db_path
        self._on_lost = on_lost
        self._pending: dict[int, Future[list[bool]]] = {}
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self._closed = False
        self._receiver = threading.Thread(target=self._receive, name="store-link", daemon=True)
        self._receiver.start()

    def submit_batches(
        self, batches: Sequence[ReportBatch], on_write: WriteHook | None = None
    ) -> Future[list[bool]]:
        """As ReportStore.submit_batches, without a write hook: the writer is another process,
        which is why per-device limits (whose counts the hook writes) need a single process."""
        if on_write is not None:
            raise StoreError("a write hook cannot cross to the writer process")
        future: Future[list[bool]] = Future()
        with self._send_lock:
            if self._closed:
                raise StoreUnavailableError("the report store is not reachable")
            request_id = next(self._ids)
            self._pending[request_id] = future
            try:
                self._conn.send((request_id, list(batches)))
            except OSError:
                del self._pending[request_id]
                raise StoreUnavailableError("the report store is not reachable") from None
        return future

    def statistics(self, survey_id: str, question_id: str) -> tuple[int, np.ndarray]:
        """The question's committed (n, int64 sums)."""
        return read_statistics(self._db_path, survey_id, question_id)

    def stored_ids(self, report_ids: Sequence[bytes]) -> set[bytes]:
        """Which of ``report_ids`` the log holds (committed)."""
        return read_stored_ids(self._db_path, report_ids)

    def close(self) -> None:
        """Say goodbye after the last submit and wait for the writer's answers to everything
        still pending. Idempotent."""
        with self._send_lock:
            if not self._closed:
                self._closed = True
                with contextlib.suppress(OSError):  # a lost writer: the receiver has stopped
                    self._conn.send(_BYE)
        self._receiver.join()
        self._conn.close()

    def _receive(self) -> None:
        """Resolve futures from the writer's answers; on a lost writer fail whatever is left."""
        said_bye = False
        try:
            while True:
                message = self._conn.recv()
                if message == _BYE:
                    said_bye = True
                    return
                request_id, flags, error = message
                future = self._pending.pop(request_id)
                if error is None:
                    future.set_result([bool(flag) for flag in flags])
                else:
                    future.set_exception(StoreError(error))
        except (EOFError, OSError):
            pass
        finally:
            with self._send_lock:
                self._closed = True
                left = list(self._pending.values())
                self._pending.clear()
            for future in left:
                future.set_exception(StoreUnavailableError("the report store went away"))
            if not said_bye:
                log.error("lost the connection to the report store's writer")
                self._on_lost()
