"""Durable ingest benchmark: throughput and latency of uploads over loopback gRPC.

Starts a real aggregator process (SQLite, WAL, synchronous=FULL, acknowledgement after commit)
and drives it from a grpc.aio load generator in this process, for batch sizes 1, 100 and 1,000.
Usage: python scripts/bench_ingest.py [--seconds 10] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc  # noqa: E402

SURVEY = """
[[survey]]
id = "bench"
min_batch_size = 1

[[survey.question]]
id = "q"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0
"""

#: (batch size, concurrent callers, target)
SCENARIOS = [
    (1, 32, "rpc/s >= 2,000"),
    (100, 16, "reports/s >= 50,000"),
    (1000, 8, "reports/s >= 50,000"),
]


@dataclass
class Figures:
    batch: int
    concurrency: int
    rpcs: int
    reports: int
    seconds: float
    rpc_per_s: float
    reports_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    target: str
    met: bool


def start_server(workdir: Path) -> tuple[subprocess.Popen, str]:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "survey.toml"
    config.write_text(SURVEY)
    port_file = workdir / "port"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aggregator.cli",
            "serve",
            "--config",
            str(config),
            "--db",
            str(workdir / "bench.sqlite"),
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--insecure",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    deadline = time.time() + 30
    while not (port_file.exists() and port_file.read_text().strip()):
        if process.poll() is not None or time.time() > deadline:
            raise SystemExit("the aggregator did not start")
        time.sleep(0.05)
    return process, f"127.0.0.1:{port_file.read_text().strip()}"


def make_requests(batch: int, count: int) -> list[ldp_pb2.UploadRequest]:
    """Pre-built requests of fresh reports (ids and payloads made outside the timed loop)."""
    rng = np.random.default_rng(batch)
    values = rng.integers(0, 4, size=batch * count)
    return [
        ldp_pb2.UploadRequest(
            reports=[
                ldp_pb2.Report(
                    report_id=os.urandom(16),
                    survey_id="bench",
                    question_id="q",
                    payload=int(v).to_bytes(4, "little"),
                )
                for v in values[i * batch : (i + 1) * batch]
            ]
        )
        for i in range(count)
    ]


async def drive(target: str, batch: int, concurrency: int, seconds: float, target_text: str):
    requests = make_requests(batch, max(200, int(60_000 * seconds / batch)))
    latencies: list[float] = []
    errors = 0
    next_request = 0
    async with grpc.aio.insecure_channel(target) as channel:
        stub = ldp_pb2_grpc.CollectorStub(channel)
        await stub.Upload(make_requests(batch, 1)[0], timeout=30)  # warm-up
        stop_at = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal next_request, errors
            while time.perf_counter() < stop_at and next_request < len(requests):
                request = requests[next_request]
                next_request += 1
                started = time.perf_counter()
                try:
                    await stub.Upload(request, timeout=30)
                except grpc.aio.AioRpcError:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - started)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    rpcs = len(latencies)
    lat = np.array(latencies) * 1000
    rpc_rate, report_rate = rpcs / elapsed, rpcs * batch / elapsed
    met = rpc_rate >= 2000 if batch == 1 else report_rate >= 50_000
    return Figures(
        batch,
        concurrency,
        rpcs,
        rpcs * batch,
        elapsed,
        rpc_rate,
        report_rate,
        float(np.percentile(lat, 50)),
        float(np.percentile(lat, 99)),
        errors,
        target_text,
        met,
    )


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, grpcio {grpc.__version__}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="duration per scenario")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for batch, concurrency, target_text in SCENARIOS:
            process, target = start_server(Path(tmp) / f"b{batch}")
            try:
                results.append(
                    asyncio.run(drive(target, batch, concurrency, args.seconds, target_text))
                )
            finally:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)
    header = (
        f"{'batch':>6} {'callers':>7} {'RPC/s':>9} {'reports/s':>11} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'errors':>6}  target"
    )
    print(header)
    for r in results:
        print(
            f"{r.batch:>6} {r.concurrency:>7} {r.rpc_per_s:>9,.0f} {r.reports_per_s:>11,.0f} "
            f"{r.p50_ms:>8.2f} {r.p99_ms:>8.2f} {r.errors:>6}  {r.target}: "
            f"{'PASS' if r.met else 'FAIL'}"
        )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
