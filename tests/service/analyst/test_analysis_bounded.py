"""Every analysis is bounded (issue 37, items 1 and 2): over real gRPC a flood of Monitor calls
with tiny deadlines leaves no analysis running and nothing admitted once their callers are gone,
the kept Monitor stays right; work left on the threads stays counted against its caller until
it ends, work not started is dropped; the server's analysis worker has imported SciPy before
the first call."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import ServerThread

from aggregator.analysis.monitoring import cells, from_history, monitored
from aggregator.service.analyst.execution import (
    AnalysisExecutor,
    AnalysisLimits,
    AnalysisRefusedError,
    AnalysisStoppedError,
)
from aggregator.store.sqlite import release_history
from aggregator.survey_file.config import load_surveys
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

#: A question whose every look costs a fraction of a second: local hashing at k = 1,024 has
#: dozens of distinct category totals, one interval search each in the confidence sequence.
K = 1024
CONFIG = f"""
[[survey]]
id = "wide"
min_batch_size = 50

[[survey.question]]
id = "q"
categories = [{", ".join(f'"c{i}"' for i in range(K))}]
mechanism = "local_hashing"
epsilon = 2.0
"""
WAIT = 60  # how long a hang may last before the test says so (never reached when it passes)
FLOOD = 12


class _Context:
    """The part of a gRPC context the executor reads: the time left before the deadline."""

    def __init__(self, remaining: float | None) -> None:
        self.deadline = None if remaining is None else time.monotonic() + remaining

    def time_remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()


def _until(condition) -> bool:
    """Whether ``condition()`` comes true before WAIT seconds pass."""
    deadline = time.monotonic() + WAIT
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


@pytest.fixture
def wide(tmp_path: Path):
    config = tmp_path / "surveys.toml"
    config.write_text(CONFIG)
    server = ServerThread(config, tmp_path / "reports.sqlite").start()
    yield load_surveys(config), server
    server.stop()


def _upload(server: ServerThread, question, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    mech = question.mechanism
    values = mech.simulate(rng.integers(0, K, size=n), rng)
    batch = [
        ldp_pb2.Report(
            report_id=os.urandom(16),
            survey_id="wide",
            question_id="q",
            payload=mech.encode(v),
        )
        for v in values
    ]
    with grpc.insecure_channel(server.target) as channel:
        ldp_pb2_grpc.CollectorStub(channel).Upload(
            ldp_pb2.UploadRequest(reports=batch), timeout=WAIT
        )


def test_worker_imported_scipy_before_the_first_call(wide):
    """serve returns (and the CLI announces the server) once the analysis worker is warm."""
    _, server = wide
    executor = server._running.analysis
    pids = executor.workers()
    assert len(pids) == executor.limits.processes
    for pid in pids:
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "/scipy/" in maps  # SciPy's extension modules are loaded in the worker
    assert executor.running == 0 and executor.inflight == 0


def test_a_flood_of_short_monitor_calls_leaves_nothing_running(wide):
    surveys, server = wide
    question = surveys["wide"].question("q")
    executor = server._running.analysis
    _upload(server, question, 200, 1)
    request = ldp_pb2.MonitorRequest(
        survey_id="wide", question_id="q", analysis="goodness_of_fit", p0=[1 / K] * K
    )
    codes: list[grpc.StatusCode] = []
    hints: list[str] = []

    with grpc.insecure_channel(server.analyst_target) as channel:
        analyst = ldp_pb2_grpc.AnalystStub(channel)

        def short() -> None:
            try:
                analyst.Monitor(request, timeout=0.2)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
                metadata = dict(exc.trailing_metadata() or ())
                if "retry-after-ms" in metadata:
                    hints.append(metadata["retry-after-ms"])

        for round_ in range(2):  # a new look between the rounds: both cost a full look
            with ThreadPoolExecutor(FLOOD) as pool:
                for _ in range(FLOOD):
                    pool.submit(short)
            _upload(server, question, 100, 2 + round_)

        assert set(codes) <= {
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.OK,
        }
        assert grpc.StatusCode.DEADLINE_EXCEEDED in codes
        refused = codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert len(hints) == refused and set(hints) <= {"1000"}
        # Every caller is gone: nothing admitted, nothing computing, the worker idle.
        assert _until(lambda: executor.inflight == 0 and executor.running == 0)
        assert executor.stopped >= 1
        # The kept Monitor was never left half advanced: a full call answers as a fresh one.
        answer = analyst.Monitor(request, timeout=WAIT)
    streams = [cells(surveys["wide"], "q", 0, "")]
    fresh = from_history(
        lambda c: release_history.read(str(server.db), c),
        monitored("goodness_of_fit", question, streams, p0=[1 / K] * K),
    )
    assert answer.n == fresh.n == 400
    assert [look.n for look in answer.looks] == list(fresh.look_ns)
    assert answer.evalue == pytest.approx(fresh.test.evalue, rel=1e-12)
    np.testing.assert_allclose(answer.low, fresh.low, rtol=0, atol=1e-12)
    np.testing.assert_allclose(answer.high, fresh.high, rtol=0, atol=1e-12)
    assert executor.inflight == 0 and executor.running == 0


def test_thread_work_its_caller_left_stays_admitted_until_it_ends():
    """Work running on the analysis threads cannot be interrupted: its caller is answered at
    the deadline, but the admission stays counted (a second analysis of the caller is refused)
    until the work ends; work still queued when its caller leaves never runs."""
    executor = AnalysisExecutor(AnalysisLimits(per_caller=1, threads=1))
    running, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def blocking() -> None:
        running.set()
        release.wait(WAIT)

    async def left(function, remaining: float) -> None:
        async with executor.admitted("a" if function is blocking else "b"):
            await executor.in_thread(_Context(remaining), function)

    async def scenario() -> None:
        first = asyncio.ensure_future(left(blocking, 0.3))
        await asyncio.to_thread(running.wait, WAIT)
        with pytest.raises(AnalysisStoppedError):  # queued behind the blocked thread
            await left(lambda: ran.append("queued"), 0.1)
        with pytest.raises(AnalysisStoppedError):
            await first
        assert executor.inflight == 1 and executor.running == 1  # "a"'s work still runs
        with pytest.raises(AnalysisRefusedError) as refused:
            async with executor.admitted("a"):
                pass
        assert refused.value.retry_after_ms == executor.limits.retry_after_ms
        release.set()
        deadline = time.monotonic() + WAIT
        while (executor.inflight or executor.running) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert executor.inflight == 0 and executor.running == 0
        async with executor.admitted("a"):  # admitted again once its work ended
            assert await executor.in_thread(_Context(WAIT), sum, (1, 2)) == 3

    try:
        asyncio.run(scenario())
    finally:
        executor.close()
    assert ran == []  # the queued work was dropped, never run
    assert executor.stopped == 2
