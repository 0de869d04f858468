"""Analysis never runs on the ingest path (issue 24, item 3): seals and holdout queries are
computed from a read snapshot and committed by compare-and-set, analyses run on their own
executor with admission, cost and deadline limits, and a locked store is UNAVAILABLE (retried by
devices), never INTERNAL. Real threads, real processes, a real SQLite file."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import sqlite3
import threading
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from confirm.test_confirm_flow import CONFIG, CONFIRMATION, EXPLORATION, MOOD, PLAN, fill, reports
from conftest import ServerThread

from aggregator.confirm.plan import parse_plan
from aggregator.confirm.run import holdout_answer, sealed_record
from aggregator.service.analyst.execution import (
    AnalysisExecutor,
    AnalysisLimits,
    AnalysisRefusedError,
    AnalysisStoppedError,
    analysis_cost,
)
from aggregator.service.server.app import open_store
from aggregator.store import ingest
from aggregator.store.sqlite import confirmations
from aggregator.store.sqlite.connection import StoreBusyError, run_in_transaction
from aggregator.survey_file.config import load_surveys
from client.device.transport import TransportError
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

WAIT = 60  # generous: the machine may be loaded


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "surveys.toml"
    path.write_text(CONFIG.format(fraction=0.5))
    return path


@pytest.fixture
def filled(tmp_path, config):
    """A store with 300 confirmation-side reports of "mood" (and "pair"), plan registered."""
    surveys = load_surveys(config)
    survey = surveys["split"]
    db = tmp_path / "reports.sqlite"
    batch = reports(survey.question("mood"), MOOD, 300, CONFIRMATION, 1)
    batch += reports(survey.question("pair"), [0.4, 0.1, 0.1, 0.4], 300, CONFIRMATION, 2)
    fill(db, surveys, batch)
    return surveys, db


def one_report(surveys, seed):
    mood = surveys["split"].question("mood")
    return ingest.validate_upload(reports(mood, MOOD, 1, CONFIRMATION, seed), surveys).batches


def test_uploads_commit_while_a_seal_computes(filled):
    """The seal's tests run outside any write transaction: an upload commits while they run,
    the commit's compare-and-set sees it, and the plan runs again on the new snapshot (the
    sealed record counts the report; no report is accepted but left out of the seal)."""
    surveys, db = filled
    survey = surveys["split"]
    store = open_store(surveys, str(db))
    runs = []

    def compute(plan, snap):
        runs.append(snap.histograms["mood", ""].n)
        if len(runs) == 1:  # the writer is free: this upload commits now
            flags = store.submit_batches(one_report(surveys, 7)).result(timeout=WAIT)
            assert flags == [1]
        return sealed_record(parse_plan(plan, surveys), survey, snap.histograms)

    try:
        confirmations.preregister(store, survey, PLAN, parse_plan(PLAN, surveys).sha256)
        sealed, already = confirmations.seal(store, survey, compute)
        assert not already and runs == [300, 301]
        assert '"n": 301' in sealed.sealed_record()
        with pytest.raises(Exception, match=r"closed|sealed"):
            store.submit_batches(one_report(surveys, 8)).result(timeout=WAIT)
    finally:
        store.close()


def test_two_concurrent_seals_give_one_answer(filled):
    """Two seals computing at once (real threads, one store file): the first commit wins, the
    second gets the first's sealed record with ``already``, never a second record."""
    surveys, db = filled
    survey = surveys["split"]
    store = open_store(surveys, str(db))
    both_computing = threading.Barrier(2, timeout=WAIT)

    def compute(plan, snap):
        both_computing.wait()  # both read their snapshot before either commits
        return sealed_record(parse_plan(plan, surveys), survey, snap.histograms)

    out: list = []

    def seal():
        out.append(confirmations.seal(store, survey, compute))

    try:
        confirmations.preregister(store, survey, PLAN, parse_plan(PLAN, surveys).sha256)
        threads = [threading.Thread(target=seal) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert sorted(already for _, already in out) == [False, True]
        assert out[0][0].sealed_record() == out[1][0].sealed_record()
    finally:
        store.close()


@dataclass
class _WorkerStore:
    """What a ``--workers`` server's worker seals through: transactions of its own connection."""

    path: str

    def run_in_writer(self, fn):
        return run_in_transaction(self.path, fn)

    def close_confirmation(self, survey_id):
        pass


def _seal_in_process(config: str, db: str, start, answers) -> None:
    surveys = load_surveys(config)
    survey = surveys["split"]

    def compute(plan, snap):
        start.wait(WAIT)
        return sealed_record(parse_plan(plan, surveys), survey, snap.histograms)

    sealed, already = confirmations.seal(_WorkerStore(db), survey, compute)
    answers.put((already, sealed.sealed_record()))


def test_two_processes_seal_once(filled, config):
    """Two processes (as two ``--workers`` workers) seal the same survey at once through their
    own connections: one record, the other answered with it."""
    surveys, db = filled
    survey = surveys["split"]
    store = open_store(surveys, str(db))
    confirmations.preregister(store, survey, PLAN, parse_plan(PLAN, surveys).sha256)
    store.close()
    ctx = multiprocessing.get_context("spawn")
    start, answers = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_seal_in_process, args=(str(config), str(db), start, answers))
        for _ in range(2)
    ]
    for proc in procs:
        proc.start()
    got = [answers.get(timeout=WAIT) for _ in procs]
    for proc in procs:
        proc.join(WAIT)
    assert sorted(already for already, _ in got) == [False, True]
    assert got[0][1] == got[1][1]


def test_concurrent_holdout_queries_lose_no_update(filled):
    """Three holdout queries at once: each is committed against the state it was computed
    from, so the counters reach 3 and the log holds queries 1, 2, 3 (none overwritten)."""
    surveys, db = filled
    survey = surveys["split"]
    store = open_store(surveys, str(db))
    computing = threading.Barrier(3, timeout=WAIT)

    def compute(held, snap):
        if held["answered"] == 0:
            computing.wait()  # all three computed from the same (empty) state at first
        return holdout_answer(held, survey, snap.histograms, "mood", "goodness_of_fit", [0.25] * 4)

    def query():
        confirmations.holdout_query(store, survey, None, ("mood", "goodness_of_fit"), compute)

    try:
        threads = [threading.Thread(target=query) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        state = confirmations.read_state(str(db), "split")
        assert state is not None and state.holdout_state()["answered"] == 3
        with closing(sqlite3.connect(db)) as conn:
            rows = conn.execute("SELECT query FROM holdout_queries ORDER BY query").fetchall()
        assert rows == [(1,), (2,), (3,)]
    finally:
        store.close()


def test_a_locked_store_is_busy_not_a_failure(filled):
    """Another connection holding SQLite's write lock past the busy timeout: the upload fails
    with StoreBusyError (UNAVAILABLE on the wire), the store keeps working afterwards."""
    surveys, db = filled
    store = open_store(surveys, str(db))
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreBusyError):
            store.submit_batches(one_report(surveys, 3)).result(timeout=WAIT)
        holder.execute("ROLLBACK")
        assert store.failure is None
        assert store.submit_batches(one_report(surveys, 4)).result(timeout=WAIT) == [1]
    finally:
        holder.close()
        store.close()


def test_a_locked_store_answers_unavailable_with_a_hint(filled, config):
    surveys, db = filled
    server = ServerThread(config, db).start()
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        collector = ldp_pb2_grpc.CollectorStub(grpc.insecure_channel(server.target))
        upload = ldp_pb2.UploadRequest(
            reports=reports(surveys["split"].question("mood"), MOOD, 2, CONFIRMATION, 5)
        )
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(grpc.RpcError) as info:
            collector.Upload(upload, timeout=WAIT)
        holder.execute("ROLLBACK")
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
        assert ("retry-after-ms", "5000") in tuple(info.value.trailing_metadata())
        assert len(collector.Upload(upload, timeout=WAIT).results) == 2  # the retry works
    finally:
        holder.close()
        server.stop()


@pytest.mark.parametrize(
    ("code", "hint", "retryable"),
    [
        (grpc.StatusCode.INTERNAL, None, True),
        (grpc.StatusCode.UNKNOWN, None, True),
        (grpc.StatusCode.ABORTED, None, True),
        (grpc.StatusCode.UNAVAILABLE, None, True),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 1.0, True),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, None, False),
        (grpc.StatusCode.INVALID_ARGUMENT, None, False),
        (grpc.StatusCode.FAILED_PRECONDITION, None, False),
        (grpc.StatusCode.NOT_FOUND, None, False),
        (grpc.StatusCode.OUT_OF_RANGE, None, False),
    ],
)
def test_the_device_retries_all_but_documented_refusals(code, hint, retryable):
    assert TransportError(code, "x", hint).retryable is retryable


class _Context:
    """What the executor asks of a call: its deadline and its peer."""

    def __init__(self, remaining=None, peer="ipv4:127.0.0.1:5555"):
        self._remaining, self._peer = remaining, peer

    def time_remaining(self):
        return self._remaining

    def auth_context(self):
        return {}

    def peer(self):
        return self._peer


def test_admission_limits_per_caller_and_globally():
    executor = AnalysisExecutor(AnalysisLimits(max_concurrent=3, per_caller=2))

    async def scenario():
        async with executor.admitted("a"), executor.admitted("a"):
            with pytest.raises(AnalysisRefusedError) as per_caller:
                async with executor.admitted("a"):
                    pass
            async with executor.admitted("b"):
                with pytest.raises(AnalysisRefusedError) as overall:
                    async with executor.admitted("c"):
                        pass
        return per_caller.value, overall.value

    try:
        per_caller, overall = asyncio.run(scenario())
        assert per_caller.retry_after_ms == overall.retry_after_ms == 1000
        assert executor.inflight == 0
        with pytest.raises(AnalysisRefusedError) as costly:
            executor.check_cost(analysis_cost("goodness_of_fit", 4096, 10_000, "auto"))
        assert costly.value.retry_after_ms is None
        executor.check_cost(analysis_cost("goodness_of_fit", 4096, 10_000, "asymptotic"))
    finally:
        executor.close()


def _warm() -> int:
    """Nothing, once this module is imported in the worker: its process id."""
    return os.getpid()


def _stubborn(seconds: float) -> None:
    """An analysis that does not heed the interrupt (as a long call into C would not)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    time.sleep(seconds)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


async def _waited(condition, seconds: float = WAIT) -> bool:
    """Whether ``condition()`` comes true within ``seconds`` (the event loop keeps running)."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return condition()


def test_a_deadline_interrupts_the_analysis():
    """An analysis past its deadline stops; the interrupted worker answers and serves the next
    analysis (no new process to start)."""
    executor = AnalysisExecutor()

    async def scenario():
        assert await executor.in_process(_Context(WAIT), sum, (1, 2)) == 3
        [pid] = executor.workers()
        with pytest.raises(AnalysisStoppedError):
            await executor.in_process(_Context(0.5), time.sleep, 600)
        for _ in range(int(WAIT / 0.05)):  # it answers the interrupt and is idle again
            if [w.process.pid for w in executor._idle] == [pid]:
                break
            await asyncio.sleep(0.05)
        assert await executor.in_process(_Context(WAIT), sum, (2, 2)) == 4
        return pid

    try:
        pid = asyncio.run(scenario())
        assert executor.stopped == 1 and executor.workers() == [pid]
    finally:
        executor.close()


@pytest.mark.parametrize("how", ["deadline", "cancel"])
def test_a_worker_that_does_not_stop_is_killed(how):
    """A stopped analysis (deadline passed, or call cancelled) whose worker ignores the
    interrupt: the worker is killed within the grace, and the next analysis gets a new one."""
    executor = AnalysisExecutor()

    async def scenario():
        # This module imported in the worker first: the stop must find _stubborn running (a
        # task stopped before it starts is skipped, and the worker stays).
        pid = await executor.in_process(_Context(WAIT), _warm)
        assert executor.workers() == [pid]
        context = _Context(0.5 if how == "deadline" else None)
        task = asyncio.ensure_future(executor.in_process(context, _stubborn, 600))
        if how == "cancel":
            await asyncio.sleep(0.5)
            task.cancel()
        with pytest.raises(asyncio.CancelledError if how == "cancel" else AnalysisStoppedError):
            await task
        assert await _waited(lambda: not _alive(pid))
        assert await executor.in_process(_Context(WAIT), sum, (2, 2)) == 4
        return pid

    try:
        pid = asyncio.run(scenario())
        assert executor.stopped == 1 and pid not in executor.workers()
    finally:
        executor.close()


def test_over_grpc_a_costly_test_and_a_flood_are_refused(filled, config):
    """Over real gRPC: a test above the cost ceiling is RESOURCE_EXHAUSTED without a hint; past
    the concurrency limit an analysis is RESOURCE_EXHAUSTED with ``retry-after-ms``."""
    surveys, db = filled
    fill(db, surveys, reports(surveys["split"].question("mood"), MOOD, 100, EXPLORATION, 3))
    server = ServerThread(config, db).start()
    try:
        executor = server._running.analysis
        analyst = ldp_pb2_grpc.AnalystStub(grpc.insecure_channel(server.analyst_target))
        request = ldp_pb2.GoodnessOfFitRequest(survey_id="split", question_id="mood", p0=[0.25] * 4)
        assert analyst.GoodnessOfFit(request, timeout=WAIT).n == 100
        executor.limits = AnalysisLimits(max_cost=1.0)
        with pytest.raises(grpc.RpcError) as costly:
            analyst.GoodnessOfFit(request, timeout=WAIT)
        assert costly.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "ceiling" in costly.value.details()
        assert not [k for k, _ in costly.value.trailing_metadata() if k == "retry-after-ms"]
        asymptotic = ldp_pb2.GoodnessOfFitRequest(
            survey_id="split", question_id="mood", p0=[0.25] * 4, calibration="asymptotic"
        )
        assert analyst.GoodnessOfFit(asymptotic, timeout=WAIT).n == 100
        executor.limits = AnalysisLimits(max_concurrent=1)
        release = asyncio.run_coroutine_threadsafe(_hold(executor), server._loop).result(WAIT)
        estimate = ldp_pb2.EstimateRequest(survey_id="split", question_id="mood")
        with pytest.raises(grpc.RpcError) as busy:
            analyst.Estimate(estimate, timeout=WAIT)
        assert busy.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert ("retry-after-ms", "1000") in tuple(busy.value.trailing_metadata())
        server._loop.call_soon_threadsafe(release.set)
        deadline = time.monotonic() + WAIT
        while executor.inflight and time.monotonic() < deadline:
            time.sleep(0.05)
        assert analyst.Estimate(estimate, timeout=WAIT).n == 100
    finally:
        server.stop()


async def _hold(executor) -> asyncio.Event:
    """Take one analysis slot (as a long analysis would) until the returned event is set."""
    release = asyncio.Event()
    admitted = asyncio.Event()

    async def hold():
        async with executor.admitted("someone else"):
            admitted.set()
            await release.wait()

    _HELD.append(asyncio.ensure_future(hold()))
    await admitted.wait()
    return release


_HELD: list[asyncio.Future] = []
