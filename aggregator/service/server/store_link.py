"""One ReportStore shared by several server processes over pipes (``serve --workers N``).

SQLite allows one writer, so the process that owns the :class:`ReportStore` (the writer) serves
every worker process through its own duplex pipe. A worker's :class:`RemoteStore` has the part
of the store's interface the gRPC servicers use (``submit_batches``, ``stored_ids``,
``analysis``, ``close``: aggregator/store/contract.py's Store); the Analyst's state is written
through ``run_in_writer``, a transaction of the worker's own connection. Uploads cross in bulk
form, and the writer answers only after the transaction holding them committed, so an
acknowledgement still means "durable". Reads go straight to the SQLite file (WAL readers never
wait for the writer); the Analyst reads released snapshots only
(aggregator/service/analyst/release.py).

Why the worker's side lives on its event loop: per upload, a receiving thread cost a GIL
hand-off and a wake-up of the loop, which at one report per upload was a large share of a
worker's CPU. Here the loop itself reads the pipe, and a worker sends what it submitted within
:data:`SEND_DELAY_SECONDS` as one message; the writer stores a message's uploads as one group and
answers them in one message after the commit. The writer waits that long for a group commit
anyway, so the delay costs little latency and saves a message, a wake-up on each side and a
store submit per upload.

Messages are pickled lists, in multiprocessing's framing (a 4-byte big-endian signed length,
or -1 and an 8-byte length): worker to writer ``[(request_id, batches), ...]`` or ``_BYE``;
writer to worker ``[(request_id, flags, error), ...]`` with the store's flags as bytes and error
None or (kind, text) (kind: 0 a store error, 1 the store failed as a whole, 2 a closed
confirmation side), or ``_BYE``
once the writer has seen the worker's ``_BYE``. The pipes are inherited from the parent
process, so only our own processes ever write to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import socket
import sqlite3
import struct
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from functools import partial
from multiprocessing.connection import Connection

from aggregator.store.errors import (
    ConfirmationClosedError,
    StoreError,
    StoreFailedError,
    StoreUnavailableError,
)
from aggregator.store.model import ReportBatch
from aggregator.store.sqlite.analysis import SqliteAnalysis
from aggregator.store.sqlite.connection import StoreBusyError, run_in_transaction
from aggregator.store.sqlite.log import read_stored_ids
from aggregator.store.sqlite.report_store import ReportStore

log = logging.getLogger(__name__)

_BYE = "bye"
#: What the writer answers a worker: per request, its id and either the flags of its reports
#: or the kind and text of the error that refused it.
WriterAnswers = list[tuple[int, bytes | None, tuple[int, str] | None]]
_Reply = Callable[[object], None]
#: How long a worker collects submits before sending them (the writer's default group-commit
#: window: ReportStore's ``max_delay``).
SEND_DELAY_SECONDS = 0.002
_SHORT = struct.Struct("!i")
_LONG = struct.Struct("!Q")


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
        _submit_together(store, message, reply)


def _submit_together(
    store: ReportStore, requests: list[tuple[int, list[ReportBatch]]], reply: _Reply
) -> None:
    """One store submit (one future, one answer) for all the requests of a message; if one of
    them is malformed, each is submitted alone so that only that one fails."""
    try:
        future = store.submit_batches([batch for _, batches in requests for batch in batches])
    except StoreError as exc:
        if len(requests) == 1 or isinstance(exc, StoreFailedError):
            reply([(request_id, None, _error(exc)) for request_id, _ in requests])
        else:
            for request in requests:
                _submit_together(store, [request], reply)
        return
    ids = [request_id for request_id, _ in requests]
    sizes = [sum(len(batch) for batch in batches) for _, batches in requests]
    alone = None
    if len(requests) > 1:  # a refused confirmation-side report fails only its own request

        def alone() -> None:
            for request in requests:
                _submit_together(store, [request], reply)

    future.add_done_callback(partial(_answer, reply, ids, sizes, alone))


#: The store errors a worker rebuilds from their kind (index) and text.
_ERRORS = (StoreError, StoreFailedError, ConfirmationClosedError, StoreBusyError)


def _error(exc: BaseException) -> tuple[int, str]:
    """An error as sent to the worker: its kind (an index of _ERRORS) and the text."""
    kinds = [i for i, kind in enumerate(_ERRORS) if isinstance(exc, kind)]
    return kinds[-1] if kinds else 0, str(exc)


def _answer(
    reply: _Reply,
    ids: list[int],
    sizes: list[int],
    alone: Callable[[], None] | None,
    future: Future[list[int]],
) -> None:
    error = future.exception()
    if isinstance(error, ConfirmationClosedError) and alone is not None:
        alone()
        return
    if error is not None:
        reply([(request_id, None, _error(error)) for request_id in ids])
        return
    flags, answers, start = bytes(future.result()), [], 0
    for request_id, size in zip(ids, sizes, strict=True):
        answers.append((request_id, flags[start : start + size], None))
        start += size
    reply(answers)


class RemoteStore(asyncio.Protocol):
    """A worker's handle on the writer's ReportStore; see the module docstring. Open it with
    :meth:`connect` and submit on the event loop's thread; close it from any other thread."""

    def __init__(
        self, db_path: str | os.PathLike[str], on_lost: Callable[[], None] = lambda: None
    ) -> None:
        self._db_path = db_path
        self._on_lost = on_lost
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._received = bytearray()
        self._outbox: list[tuple[int, list[ReportBatch]]] = []
        self._pending: dict[int, Future[list[int]]] = {}
        self._ids = itertools.count()
        self._closed = False  # no more submits
        self._said_bye = False  # the writer answered our goodbye
        self._ended = threading.Event()  # the link is down, every future resolved

    @classmethod
    async def connect(
        cls,
        conn: Connection,
        db_path: str | os.PathLike[str],
        on_lost: Callable[[], None] = lambda: None,
    ) -> RemoteStore:
        """Take over the worker's end of the pipe; ``on_lost`` runs (on the event loop) if the
        writer disappears."""
        sock = socket.socket(fileno=os.dup(conn.fileno()))
        conn.close()
        loop = asyncio.get_running_loop()
        _, store = await loop.create_unix_connection(lambda: cls(db_path, on_lost), sock=sock)
        return store

    def submit_batches(self, batches: Sequence[ReportBatch]) -> Future[list[int]]:
        """As ReportStore.submit_batches (the writer is another process). The future cannot be
        cancelled: once handed over, the reports may be stored."""
        if self._closed:
            raise StoreUnavailableError("the report store is not reachable")
        future: Future[list[int]] = Future()
        future.set_running_or_notify_cancel()
        request_id = next(self._ids)
        self._pending[request_id] = future
        if not self._outbox:
            self._loop.call_later(SEND_DELAY_SECONDS, self._send_outbox)
        self._outbox.append((request_id, list(batches)))
        return future

    @property
    def path(self) -> str:
        """The database file."""
        return os.fspath(self._db_path)

    def stored_ids(self, report_ids: Sequence[bytes]) -> set[bytes]:
        """Which of ``report_ids`` the log holds (committed)."""
        return read_stored_ids(self._db_path, report_ids)

    def run_in_writer(self, fn: Callable[[sqlite3.Connection], object]) -> object:
        """``fn(conn)`` in one write transaction of this worker's own connection (blocking: call
        it in a thread). The explore-then-confirm RPCs write through it."""
        return run_in_transaction(self._db_path, fn)

    def close_confirmation(self, survey_id: str) -> None:
        """Nothing to do here: the writer reads the sealed surveys again when another connection
        has committed (ReportStore._refuse_closed_sides)."""

    def analysis(self) -> SqliteAnalysis:
        """The Analyst's state in the store, written through this worker's own connection
        (:meth:`run_in_writer`): aggregator/store/contract.py's AnalysisStore."""
        return SqliteAnalysis(self)

    def close(self) -> None:
        """Say goodbye after the last submit and wait for the writer's answers to everything
        still pending. Idempotent; not on the event loop's thread (it waits for the loop)."""
        if self._ended.is_set():
            return
        if _running_loop() is self._loop or not self._loop.is_running():
            raise RuntimeError("close a RemoteStore from another thread while its loop runs")
        self._loop.call_soon_threadsafe(self._say_bye)
        self._ended.wait()

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        """Resolve the futures of every complete answer message received so far."""
        self._received += data
        while (message := self._next_message()) is not None:
            if isinstance(message, str):  # _BYE: the writer is closing the link
                self._said_bye = True
                if self._transport is not None:
                    self._transport.close()
                return
            for request_id, flags, error in message:
                future = self._pending.pop(request_id)
                if error is not None:
                    kind, text = error
                    future.set_exception(_ERRORS[kind](text))
                elif flags is not None:
                    future.set_result(list(flags))  # STORED, DUPLICATE, CONFLICT

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail whatever is left; a link lost without our goodbye stops the worker."""
        self._closed = True
        self._outbox.clear()
        left = list(self._pending.values())
        self._pending.clear()
        for future in left:
            future.set_exception(StoreUnavailableError("the report store went away"))
        if not self._said_bye:
            log.error("lost the connection to the report store's writer")
            self._on_lost()
        self._ended.set()

    # -- internals -------------------------------------------------------------------------------

    def _send_outbox(self) -> None:
        """Send everything submitted since the last call as one message."""
        if self._outbox and self._transport is not None and not self._transport.is_closing():
            self._send(self._outbox)
        self._outbox = []

    def _say_bye(self) -> None:
        """Send what is queued, then goodbye; the writer's goodbye (or a lost link) ends it."""
        if self._closed:
            return
        self._closed = True
        self._send_outbox()
        if self._transport is not None and not self._transport.is_closing():
            self._send(_BYE)

    def _send(self, message: object) -> None:
        assert self._transport is not None
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if len(payload) <= 0x7FFFFFFF:
            head = _SHORT.pack(len(payload))
        else:
            head = _SHORT.pack(-1) + _LONG.pack(len(payload))
        self._transport.write(head + payload)

    def _next_message(self) -> WriterAnswers | str | None:
        """Take one complete message off the receive buffer, if there is one."""
        buffer = self._received
        if len(buffer) < _SHORT.size:
            return None
        (size,) = _SHORT.unpack_from(buffer)
        start = _SHORT.size
        if size == -1:
            if len(buffer) < _SHORT.size + _LONG.size:
                return None
            (size,) = _LONG.unpack_from(buffer, _SHORT.size)
            start += _LONG.size
        if len(buffer) < start + size:
            return None
        message = pickle.loads(bytes(buffer[start : start + size]))
        del buffer[: start + size]
        return message


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
