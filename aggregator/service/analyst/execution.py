"""Where the Analyst's work runs, and how much of it at once (docs/limits.md, "Analysis limits").

Analyses never run on the threads that serve uploads, nor inside a write transaction
(docs/architecture.md): cheap work (estimates, snapshot reads) runs on a small thread pool of
its own, CPU-heavy work (tests, which may simulate a Monte Carlo null or a bootstrap; sealing;
holdout queries) in worker processes at a lower CPU priority (``nice`` +10). Admission counts
every analysis in flight, globally and per caller, and refuses beyond the limits with
RESOURCE_EXHAUSTED and a ``retry-after-ms`` trailer; a test whose k × draws × n passes the
ceiling is refused before it starts. An analysis stops when its caller goes away: the RPC's
cancellation or deadline (or ``max_seconds``) interrupts the worker process running it, which
is killed (and replaced for the next analysis) if it does not stop within a second; work of
the threads that has not started is dropped, and work already running there (which cannot be
interrupted) stays counted against its caller's admission until it ends, so abandoned work
never piles up. ``warm`` starts the worker processes and waits until they have imported SciPy,
so the first test after start-up does not pay for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import multiprocessing
import os
import signal
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, TypeVar, TypeVarTuple

from aggregator.errors import LdpError
from aggregator.service.analyst.auth import CALLER

log = logging.getLogger(__name__)

T = TypeVar("T")
Args = TypeVarTuple("Args")

#: Monte Carlo draws of a test that simulates its null (the statistics' defaults): goodness of
#: fit and two-sample 999, composite nulls (independence) 199 bootstrap replicates.
DRAWS = {"goodness_of_fit": 999, "two_sample": 999, "independence": 199}
#: How much lower a worker process's CPU priority is than the server's (``nice``): uploads
#: first, analyses get the CPU they leave.
NICE = 10
#: How long past a call's deadline its analysis is stopped, if gRPC has not cancelled it.
DEADLINE_SLACK_SECONDS = 0.25
#: How long an interrupted worker process has to answer before it is killed.
INTERRUPT_GRACE_SECONDS = 1.0
#: How many grace periods a worker still starting gets to reach (and skip) a stopped task.
_STARTING_CHECKS = 60
#: How long a worker process may take to die once killed.
_KILL_WAIT_SECONDS = 2.0
#: Idle worker processes of closed executors, kept (at most _MAX_SPARE) for the next executor
#: of this process: a server restarted in one process (the tests) skips the start-up (SciPy).
_SPARE: list[_Worker] = []
_SPARE_LOCK = threading.Lock()
_MAX_SPARE = 2
#: The longest start-up waits for the worker processes to import SciPy (``warm``); past it the
#: server serves anyway and the first test waits for the rest of the import.
WARM_UP_SECONDS = 30.0


@dataclass(frozen=True)
class AnalysisLimits:
    """Per server process (each ``--workers`` process has its own)."""

    max_concurrent: int = 4  # analyses in flight, all callers
    per_caller: int = 2  # analyses in flight per caller (identity: see caller_of)
    processes: int = 1  # worker processes for CPU-heavy analyses
    threads: int = 2  # threads for cheap analyses and snapshot reads
    max_cost: float = 2e10  # k x draws x n of one test that may simulate
    max_seconds: float = 300.0  # the longest one analysis runs, deadline or not
    retry_after_ms: int = 1000  # the hint of a refusal for too many analyses

    def __post_init__(self) -> None:
        counts = (self.max_concurrent, self.per_caller, self.processes, self.threads)
        if min(counts) < 1 or not self.max_cost > 0 or not self.max_seconds > 0:
            raise ValueError("analysis limits must be positive")


class AnalysisRefusedError(LdpError):
    """An analysis not admitted; ``retry_after_ms`` is None when waiting cannot help."""

    def __init__(self, message: str, retry_after_ms: int | None) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class AnalysisStoppedError(LdpError):
    """An analysis stopped before it finished: its caller went away or its time ran out."""


def analysis_cost(function: str, k: int, n: int, calibration: str) -> float:
    """k x draws x n of a test that may simulate its null ("auto" may: it is counted as
    Monte Carlo), 0 for an asymptotic one."""
    if calibration == "asymptotic":
        return 0.0
    return float(k) * DRAWS.get(function, 999) * float(n)


def caller_of(context: Any) -> str:
    """Whom a call is counted against: the analyst the gate identified (token name, certificate
    CN or ``loopback``: aggregator/service/analyst/auth.py); outside the gate, its TLS peer
    identity (certificate SAN, else CN), else its peer address without the port."""
    identity = CALLER.get()
    if identity is not None:
        return identity
    auth = context.auth_context() or {}
    for key in ("x509_subject_alternative_name", "x509_common_name"):
        names = auth.get(key)
        if names:
            return "tls:" + names[0].decode(errors="replace")
    peer = context.peer() or ""
    host = peer.rpartition(":")[0] if peer.startswith(("ipv4:", "ipv6:")) else peer
    return host or "unknown"


class _Admission:
    """One admitted analysis of ``caller``: counted while its block runs (``held`` starts at 1)
    and while thread work its caller stopped waiting for still runs."""

    def __init__(self, caller: str) -> None:
        self.caller = caller
        self.held = 1


#: The admission of the analysis the current task runs (in_thread holds it for work it leaves).
_ADMISSION: contextvars.ContextVar[_Admission | None] = contextvars.ContextVar(
    "ldp_analysis_admission", default=None
)


class AnalysisExecutor:
    """The Analyst's own threads and worker processes, and its admission counts."""

    def __init__(self, limits: AnalysisLimits | None = None) -> None:
        self.limits = limits or AnalysisLimits()
        self._threads = ThreadPoolExecutor(self.limits.threads, "ldp-analysis")
        # One waiting thread per worker process (a blocking receive on its pipe).
        # (twice: an interrupted worker's waiter may still wait while its successor starts)
        self._waiters = ThreadPoolExecutor(2 * self.limits.processes, "ldp-analysis-wait")
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._slots: asyncio.Semaphore | None = None
        self._lock = threading.Lock()
        self._inflight: Counter[str] = Counter()
        self._running_threads = 0
        self._closed = False
        self.stopped = 0  # analyses stopped early (cancelled, deadline, max_seconds)

    @property
    def inflight(self) -> int:
        """Analyses admitted and not finished (work left running on the threads included)."""
        return sum(self._inflight.values())

    @property
    def running(self) -> int:
        """Work running now: on the analysis threads, and in busy worker processes."""
        return self._running_threads + len(self._busy)

    @contextlib.asynccontextmanager
    async def admitted(self, caller: str) -> AsyncIterator[None]:
        """Count one analysis of ``caller`` while the block runs, and while work of the threads
        it started still runs; AnalysisRefusedError (with a retry hint) beyond the global or
        the per-caller limit."""
        limits = self.limits
        with self._lock:
            if self._closed:
                raise AnalysisRefusedError("the server is stopping", limits.retry_after_ms)
            if sum(self._inflight.values()) >= limits.max_concurrent:
                raise AnalysisRefusedError(
                    f"too many analyses in progress ({limits.max_concurrent}); retry after "
                    f"{limits.retry_after_ms} ms",
                    limits.retry_after_ms,
                )
            if self._inflight[caller] >= limits.per_caller:
                raise AnalysisRefusedError(
                    f"this caller has {limits.per_caller} analyses in progress; retry after "
                    f"{limits.retry_after_ms} ms",
                    limits.retry_after_ms,
                )
            self._inflight[caller] += 1
        admission = _Admission(caller)
        token = _ADMISSION.set(admission)
        try:
            yield
        finally:
            _ADMISSION.reset(token)
            self._release(admission)

    def _hold(self, admission: _Admission) -> None:
        with self._lock:
            admission.held += 1

    def _release(self, admission: _Admission) -> None:
        """One holder of ``admission`` is done; the last one frees its count."""
        with self._lock:
            admission.held -= 1
            if admission.held:
                return
            caller = admission.caller
            self._inflight[caller] -= 1
            if not self._inflight[caller]:
                del self._inflight[caller]

    def check_cost(self, cost: float) -> None:
        """AnalysisRefusedError (no retry hint) for a test above the cost ceiling."""
        if cost > self.limits.max_cost:
            raise AnalysisRefusedError(
                f"the test would cost k x draws x n = {cost:.3g}, above this server's ceiling "
                f"{self.limits.max_cost:.3g}; ask calibration 'asymptotic' (docs/limits.md)",
                None,
            )

    def timeout(self, context: Any) -> float:
        """Seconds this call's analysis may run: until just after its deadline, at most
        ``max_seconds``."""
        remaining = context.time_remaining() if context is not None else None
        if remaining is None:
            return self.limits.max_seconds
        # A moment past the deadline: gRPC cancels the call at its deadline (which stops the
        # analysis), and this timeout is the backstop for a call that is not cancelled.
        return max(0.0, min(float(remaining) + DEADLINE_SLACK_SECONDS, self.limits.max_seconds))

    async def in_thread(self, context: Any, function: Callable[[*Args], T], *args: *Args) -> T:
        """``function(*args)`` on the analysis threads (cheap work: store reads, O(k)
        estimates). When its caller goes away (cancellation, deadline or ``max_seconds``) work
        not started is dropped; work already running cannot be interrupted, and keeps the
        admission it runs under held until it ends."""
        work = self._threads.submit(self._run_thread, function, args)
        try:
            async with asyncio.timeout(self.timeout(context)):
                return await asyncio.wrap_future(work)
        except TimeoutError:
            self.stopped += 1
            raise AnalysisStoppedError("the analysis ran out of time") from None
        finally:
            admission = _ADMISSION.get()
            if not work.cancel() and not work.done() and admission is not None:
                self._hold(admission)
                work.add_done_callback(lambda _: self._release(admission))

    def _run_thread(self, function: Callable[..., T], args: tuple) -> T:
        with self._lock:
            self._running_threads += 1
        try:
            return function(*args)
        finally:
            with self._lock:
                self._running_threads -= 1

    async def in_process(self, context: Any, function: Callable[[*Args], T], *args: *Args) -> T:
        """``function(*args)`` in a worker process (function and arguments are pickled: a
        module-level function). The call's cancellation, its deadline or ``max_seconds`` stop
        it: the worker is interrupted (SIGUSR1), and killed if it has not answered within
        INTERRUPT_GRACE seconds; either way the CPU it used is free within about a second."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limits.processes)
        loop = asyncio.get_running_loop()
        slots = self._slots
        try:
            async with asyncio.timeout(self.timeout(context)):
                await slots.acquire()  # released when the worker is free again
                try:
                    worker = self._send(function, args)
                except BaseException:
                    slots.release()
                    raise
                receiving = loop.run_in_executor(self._waiters, worker.receive)
                try:
                    kind, value = await asyncio.shield(receiving)
                except BaseException:
                    self._interrupt(worker, receiving, slots.release)
                    raise
                self._give_back(worker, answered=kind != "dead")
                slots.release()
        except TimeoutError:
            raise AnalysisStoppedError("the analysis ran out of time") from None
        if kind != "ok":
            raise value
        return value

    def _take(self) -> _Worker:
        while self._idle:
            worker = self._idle.pop()
            if worker.alive():
                break
            worker.kill()
        else:
            worker = _spare() or _Worker()
        self._busy.add(worker)
        return worker

    def _send(self, function: Callable[..., Any], args: tuple) -> _Worker:
        """A worker that took ``function(*args)``: an idle one, or (if it turns out dead) a
        fresh one."""
        worker = self._take()
        try:
            worker.send(function, args)
        except OSError:  # it died idle: start another
            self._give_back(worker, answered=False)
            worker = _Worker()
            self._busy.add(worker)
            worker.send(function, args)
        return worker

    def _give_back(self, worker: _Worker, answered: bool) -> None:
        """An answered worker becomes idle; one that did not answer is killed."""
        self._busy.discard(worker)
        if answered and not self._closed and worker.alive():
            self._idle.append(worker)
        else:
            worker.kill()

    def _interrupt(
        self, worker: _Worker, receiving: asyncio.Future, freed: Callable[[], None]
    ) -> None:
        """Stop the analysis a worker runs for a caller that went away: interrupt it, take it
        back when it answers, kill it if it is still running the task INTERRUPT_GRACE_SECONDS
        later; then ``freed()`` (its slot: the next analysis reuses it rather than start
        another). A worker still starting (importing SciPy) is left to finish: it skips the
        stopped task when it reads it, and is then warm for the next analysis."""
        self.stopped += 1
        task = worker.interrupt()
        loop = asyncio.get_running_loop()
        checks = [0]

        def check() -> None:
            checks[0] += 1
            if receiving.done():
                return
            if worker.running() == task or checks[0] > _STARTING_CHECKS:
                worker.kill()  # its waiter wakes, and `answered` gives it back (dead)
            else:
                late[0] = loop.call_later(INTERRUPT_GRACE_SECONDS, check)

        late = [loop.call_later(INTERRUPT_GRACE_SECONDS, check)]

        def answered(future: asyncio.Future) -> None:
            late[0].cancel()
            alive = not future.cancelled() and future.exception() is None
            self._give_back(worker, alive and future.result()[0] != "dead")
            freed()

        receiving.add_done_callback(answered)

    def warm(self, timeout: float = WARM_UP_SECONDS) -> bool:
        """Start the worker processes (or take spares) and wait up to ``timeout`` seconds until
        each has imported SciPy, so the first test does not wait for it; whether all did."""
        missing = self.limits.processes - len(self._idle) - len(self._busy)
        starting = [_spare() or _Worker(warm_up=True) for _ in range(missing)]
        ready = all([worker.started(timeout) for worker in starting])
        with self._lock:
            closed = self._closed
            if not closed:
                self._idle += starting
        if closed:  # closed while they started
            for worker in starting:
                worker.kill()
        return ready

    def workers(self) -> list[int]:
        """The process ids of the live worker processes (the benchmark watches their CPU)."""
        return [w.process.pid for w in (*self._idle, *self._busy) if w.process.pid is not None]

    def close(self) -> None:
        """Kill the busy worker processes (idle ones are kept as spares for the next executor of
        this process) and stop the threads (what runs on them is abandoned)."""
        with self._lock:
            self._closed = True
        for worker in self._busy:
            worker.kill()
        for worker in self._idle:
            with _SPARE_LOCK:
                keep = len(_SPARE) < _MAX_SPARE and worker.alive()
                if keep:
                    _SPARE.append(worker)
            if not keep:
                worker.kill()
        self._idle.clear()
        self._threads.shutdown(wait=False, cancel_futures=True)
        self._waiters.shutdown(wait=False, cancel_futures=True)


def _spare() -> _Worker | None:
    """A live idle worker left by a closed executor, if there is one."""
    with _SPARE_LOCK:
        while _SPARE:
            worker = _SPARE.pop()
            if worker.alive():
                return worker
    return None


class _Worker:
    """One worker process and its end of the pipe."""

    def __init__(self, warm_up: bool = False) -> None:
        """``warm_up``: import SciPy at the server's priority, then lower it (a worker started
        with the server, when uploads do not compete yet); otherwise lower it first."""
        ctx = multiprocessing.get_context("spawn")  # never fork a process running gRPC
        self.conn, child = ctx.Pipe()
        # Shared with the process: the task it runs (0: none), and the task to stop.
        self._running = ctx.RawValue("q", 0)
        self._stop = ctx.RawValue("q", 0)
        self._task = 0
        self.ready = False  # it said it imported SciPy (it says so before any answer)
        self.process = ctx.Process(
            target=_worker_main,
            args=(child, self._running, self._stop, NICE if warm_up else 0),
            name="ldp-analysis",
            daemon=True,
        )
        # The interrupt signal stays blocked in the new process (the mask is inherited) until
        # its handler is installed: before that, SIGUSR1 would kill it.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        try:
            self.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        child.close()
        pid = self.process.pid
        if pid is not None and not warm_up:  # lower its priority before it imports anything
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, pid, os.getpriority(os.PRIO_PROCESS, 0) + NICE)

    def alive(self) -> bool:
        return self.process.is_alive()

    def started(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the worker to say it imported SciPy; whether it
        did (if not, ``receive`` reads it before the first answer)."""
        if not self.ready:
            with contextlib.suppress(EOFError, OSError):
                if self.conn.poll(timeout):
                    self.ready = self.conn.recv() == ("ready", None)
        return self.ready

    def receive(self) -> tuple[str, Any]:
        """The worker's answer: ("ok", result), ("error", exception), or ("dead", exception)
        when it died (killed) before answering."""
        try:
            if not self.ready:
                self.ready = self.conn.recv() == ("ready", None)
            return self.conn.recv()
        except (EOFError, OSError):
            return "dead", AnalysisStoppedError("the analysis worker stopped")

    def send(self, function: Callable[..., Any], args: tuple) -> None:
        self._task += 1
        self.conn.send((self._task, function, args))

    def running(self) -> int:
        """The task the worker runs now (0: none, or still starting)."""
        return int(self._running.value)

    def interrupt(self) -> int:
        """Ask the worker to abandon the last task sent (it answers AnalysisStoppedError, at
        once if it had not started it: e.g. it was still starting); that task's number."""
        self._stop.value = self._task
        pid = self.process.pid
        if pid is not None and self.process.is_alive():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGUSR1)
        return self._task

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(_KILL_WAIT_SECONDS)  # its pipe's other end closes: the waiter wakes


def _worker_main(conn: Connection, running: Any, stop: Any, nice: int) -> None:
    """A worker process: import SciPy, lower its priority by ``nice``, say "ready", then run
    what arrives until the pipe closes (the server stopped or died). ``running`` is the task it
    runs (0: none); the server sets ``stop`` to a task to abandon and sends SIGUSR1."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server's Ctrl-C is for the server

    def interrupted(signum: int, frame: object) -> None:
        task = running.value
        if task and stop.value == task:  # between tasks, an interrupt has nothing to stop
            running.value = 0
            raise AnalysisStoppedError("the analysis was stopped: its caller went away")

    signal.signal(signal.SIGUSR1, interrupted)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})  # blocked by the server
    from aggregator import stats  # SciPy: imported once, before the first task

    stats.preload()
    if nice:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) + nice)
    conn.send(("ready", None))
    while True:
        try:
            task, function, args = conn.recv()
        except (EOFError, OSError):
            return
        answer: tuple[str, Any] = ("error", AnalysisStoppedError("the analysis was stopped"))
        if stop.value != task:  # not stopped before it started
            running.value = task
            try:
                answer = ("ok", function(*args))
            except Exception as exc:  # sent back and raised in the server
                answer = ("error", exc)
            finally:
                running.value = 0
        try:
            conn.send(answer)
        except Exception as exc:  # e.g. an answer that cannot be pickled
            conn.send(("error", AnalysisStoppedError(f"the analysis failed: {exc}")))
