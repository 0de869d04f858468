"""Overload benchmark: does the aggregator shed load at twice its saturation rate?

Starts a real aggregator process (``ldp-aggregator serve``, SQLite WAL, synchronous=FULL), then

1. measures saturation: closed-loop callers uploading batches as fast as it answers;
2. drives it open-loop at ``--factor`` (default 2) times that rate: calls start on a fixed
   schedule whether or not earlier ones finished, each with a deadline, as real devices would;
3. probes the health service every 50 ms from another thread throughout.

It reports goodput (accepted reports/s), the fraction shed (RESOURCE_EXHAUSTED), any other
outcome (DEADLINE_EXCEEDED would mean the server queued instead of shedding), p50/p99 latency of
accepted and of shed calls, health-check latency during overload, and checks that the store
holds exactly the acknowledged reports.

Usage: python scripts/bench_overload.py [--seconds 10] [--batch 100] [--max-inflight-reports N]
       [--json PATH]   (smoke run: --measure-seconds 1 --seconds 2)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_ingest import start_server  # noqa: E402  (same folder)

from aggregator.service.collector.limits import DEFAULT_MAX_INFLIGHT_REPORTS  # noqa: E402
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc  # noqa: E402

DEADLINE = 5.0  # seconds per upload, half a device's default
HEALTH_EVERY = 0.05


@dataclass
class Figures:
    batch: int
    max_inflight_reports: int
    saturation_rpc_per_s: float
    offered_rpc_per_s: float
    seconds: float
    calls: int
    accepted_calls: int
    shed_calls: int
    other_outcomes: dict[str, int]
    goodput_reports_per_s: float
    shed_fraction: float
    accepted_p50_ms: float
    accepted_p99_ms: float
    shed_p50_ms: float
    shed_p99_ms: float
    health_probes: int
    health_p50_ms: float
    health_p99_ms: float
    health_max_ms: float
    health_failures: int
    generator_lag_p99_ms: float
    stored_equals_acknowledged: bool


def request(batch: int) -> ldp_pb2.UploadRequest:
    ids = os.urandom(16 * batch)
    return ldp_pb2.UploadRequest(
        reports=[
            ldp_pb2.Report(
                report_id=ids[16 * i : 16 * i + 16],
                survey_id="bench",
                question_id="q",
                payload=(i % 4).to_bytes(4, "little"),
            )
            for i in range(batch)
        ]
    )


async def saturation(stub, batch: int, seconds: float, callers: int = 32) -> tuple[float, int]:
    """Closed-loop RPC/s, and how many reports were acknowledged meanwhile."""
    done = [0]
    stop = time.monotonic() + seconds

    async def caller() -> None:
        while time.monotonic() < stop:
            try:
                await stub.Upload(request(batch), timeout=DEADLINE)
                done[0] += 1
            except grpc.aio.AioRpcError:
                pass

    start = time.monotonic()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return done[0] / (time.monotonic() - start), done[0] * batch


async def overload(stub, batch: int, rate: float, seconds: float):
    """Open loop: start a call every 1/rate s. Returns (outcomes, acknowledged report count,
    lateness of the generator's own event loop): a late generator inflates the latencies."""
    outcomes: list[tuple[str, float]] = []
    acknowledged = [0]
    lateness: list[float] = []
    running = True

    async def ticker() -> None:
        while running:
            start = time.perf_counter()
            await asyncio.sleep(0.01)
            lateness.append(time.perf_counter() - start - 0.01)

    async def one() -> None:
        message = request(batch)
        start = time.perf_counter()
        try:
            await stub.Upload(message, timeout=DEADLINE)
            code = "OK"
            acknowledged[0] += batch
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
        outcomes.append((code, time.perf_counter() - start))

    tasks = []
    tick = asyncio.ensure_future(ticker())
    start = time.monotonic()
    for i in range(int(rate * seconds)):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one()))
    await asyncio.gather(*tasks)
    running = False
    await tick
    return outcomes, acknowledged[0], lateness


def probe_health(target: str, stop: threading.Event, out: list[float | None]) -> None:
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(target))
    query = health_pb2.HealthCheckRequest(service="ldp.v1.Collector")
    while not stop.is_set():
        start = time.perf_counter()
        try:
            stub.Check(query, timeout=1.0)
            out.append(time.perf_counter() - start)
        except grpc.RpcError:
            out.append(None)
        time.sleep(HEALTH_EVERY)


def percentile_ms(values: list[float], q: float) -> float:
    return float(np.percentile(values, q) * 1000) if values else float("nan")


async def run(args: argparse.Namespace, target: str) -> tuple[Figures, int]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = ldp_pb2_grpc.CollectorStub(channel)
        saturated, before = await saturation(stub, args.batch, args.measure_seconds)
        rate = args.factor * saturated
        health: list[float | None] = []
        stop = threading.Event()
        prober = threading.Thread(target=probe_health, args=(target, stop, health))
        prober.start()
        try:
            outcomes, acknowledged, lag = await overload(stub, args.batch, rate, args.seconds)
        finally:
            stop.set()
            prober.join()
    accepted = [t for code, t in outcomes if code == "OK"]
    shed = [t for code, t in outcomes if code == "RESOURCE_EXHAUSTED"]
    others: dict[str, int] = {}
    for code, _ in outcomes:
        if code not in ("OK", "RESOURCE_EXHAUSTED"):
            others[code] = others.get(code, 0) + 1
    answered = [t for t in health if t is not None]
    figures = Figures(
        batch=args.batch,
        max_inflight_reports=args.max_inflight_reports,
        saturation_rpc_per_s=round(saturated, 1),
        offered_rpc_per_s=round(rate, 1),
        seconds=args.seconds,
        calls=len(outcomes),
        accepted_calls=len(accepted),
        shed_calls=len(shed),
        other_outcomes=others,
        goodput_reports_per_s=round(len(accepted) * args.batch / args.seconds, 1),
        shed_fraction=round(len(shed) / max(1, len(outcomes)), 4),
        accepted_p50_ms=round(percentile_ms(accepted, 50), 1),
        accepted_p99_ms=round(percentile_ms(accepted, 99), 1),
        shed_p50_ms=round(percentile_ms(shed, 50), 1),
        shed_p99_ms=round(percentile_ms(shed, 99), 1),
        health_probes=len(health),
        health_p50_ms=round(percentile_ms(answered, 50), 1),
        health_p99_ms=round(percentile_ms(answered, 99), 1),
        health_max_ms=round(max(answered, default=float("nan")) * 1000, 1),
        health_failures=len(health) - len(answered),
        generator_lag_p99_ms=round(percentile_ms(lag, 99), 1),
        stored_equals_acknowledged=False,  # filled in once the server has stopped
    )
    return figures, before + acknowledged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="overload phase length")
    parser.add_argument("--measure-seconds", type=float, default=5.0, help="saturation phase")
    parser.add_argument("--batch", type=int, default=100, help="reports per upload")
    parser.add_argument("--factor", type=float, default=2.0, help="offered load / saturation")
    parser.add_argument("--max-inflight-reports", type=int, default=DEFAULT_MAX_INFLIGHT_REPORTS)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ldp-overload-") as tmp:
        workdir = Path(tmp)
        process, target, db = start_server(
            workdir, "--max-inflight-reports", str(args.max_inflight_reports)
        )
        try:
            figures, acknowledged = asyncio.run(run(args, target))
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
        with sqlite3.connect(db) as conn:
            stored = conn.execute("SELECT count(*) FROM reports").fetchone()[0]
        figures.stored_equals_acknowledged = stored == acknowledged
    machine = f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, "
    machine += f"Python {platform.python_version()}, grpcio {grpc.__version__}"
    print(f"# {machine}")
    for name, value in asdict(figures).items():
        print(f"{name:28} {value}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, **asdict(figures)}, indent=2))
    return 0 if figures.stored_equals_acknowledged and not figures.other_outcomes else 1


if __name__ == "__main__":
    sys.exit(main())
