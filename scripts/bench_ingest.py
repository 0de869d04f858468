"""Durable ingest benchmark: throughput, latency and CPU cost of uploads over loopback gRPC.

For every (server workers, reports per RPC) pair it starts a real aggregator process
(``ldp-aggregator serve --workers N``: SQLite in WAL mode with synchronous=FULL, every upload
acknowledged only after its transaction committed) and drives it from several load-generator
processes that share the machine with it. Every request is serialized before the clock starts
(fresh random 16-byte report ids) and sent as raw bytes, so the generators do no protobuf work
while timed. Two generators exist: ``cpp`` (scripts/ingest_load.cc, gRPC C++, compiled on the
fly when g++ and Debian's libgrpc++-dev are installed; the cheapest, so the server gets most of
the cores) and ``python`` (grpc.aio). The table gives the CPU time per RPC of the server (all its
processes) and of the generators, so it shows where the cores go. After each run the store is
opened and must hold exactly the acknowledged reports.

Usage: python scripts/bench_ingest.py [--seconds 8] [--workers 1,2] [--batches 1,100,1000]
           [--generator auto|cpp|python] [--generators 2] [--out FILE.md] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import resource
import shutil
import signal
import sqlite3
import struct
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

from aggregator.store.model import ReportBatch  # noqa: E402
from aggregator.store.sqlite.report_store import ReportStore  # noqa: E402
from client.cli.progress import bar  # noqa: E402
from client.device.transport import MAX_MESSAGE_BYTES  # noqa: E402
from protos.ldp.v1 import ldp_pb2  # noqa: E402

UPLOAD = "/ldp.v1.Collector/Upload"
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

#: reports per RPC -> (concurrent calls in flight over all generators, target text, target value)
SCENARIOS = {
    1: (48, "RPC/s >= 2,000", 2000.0),
    100: (48, "reports/s >= 50,000", 50_000.0),
    1000: (8, "reports/s >= 50,000", 50_000.0),
}
#: upper bound of the request rate a generator may reach, to size its pre-built requests
MAX_REPORTS_PER_S = 150_000
MAX_RPCS_PER_S = 8_000


@dataclass
class Figures:
    workers: int
    batch: int
    generator: str
    generators: int
    callers: int
    rpcs: int
    reports: int
    seconds: float
    rpc_per_s: float
    reports_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    server_cpu_us_per_rpc: float
    writer_cpu_us_per_rpc: float  # the server's main process: the store writer (and, with one
    # process, everything else too)
    client_cpu_us_per_rpc: float
    cores_busy: float  # (server + generator CPU seconds) / wall seconds
    stored_as_acked: bool
    target: str
    met: bool


@dataclass
class GeneratorResult:
    latencies: bytes  # float64 seconds, one per acknowledged RPC
    acked_reports: int  # including warm-up calls
    errors: int
    cpu_seconds: float
    seconds: float


def start_server(workdir: Path, *serve_options: str) -> tuple[subprocess.Popen, str, Path]:
    """An aggregator subprocess (``serve`` with ``serve_options``) on a free loopback port;
    returns (process, target, db path). The Analyst's port is in ``workdir/port.analyst``."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "survey.toml"
    config.write_text(SURVEY)
    port_file = workdir / "port"
    db = workdir / "bench.sqlite"
    command = [sys.executable, "-m", "aggregator.cli", "serve", "--config", str(config)]
    command += ["--db", str(db), "--port", "0", "--port-file", str(port_file), "--insecure"]
    command += ["--analyst-port-file", f"{port_file}.analyst"]
    command += serve_options
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    deadline = time.time() + 60
    while not (port_file.exists() and port_file.read_text().strip()):
        if process.poll() is not None or time.time() > deadline:
            raise SystemExit("the aggregator did not start")
        time.sleep(0.05)
    return process, f"127.0.0.1:{port_file.read_text().strip()}", db


def process_tree_cpu_seconds(pid: int) -> tuple[float, float]:
    """User + system CPU seconds of a live process and all its live descendants, and of the
    process alone (/proc)."""
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # fields after "pid (comm)"
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += cpu.get(current, 0.0)
        todo += children.get(current, [])
    return total, cpu.get(pid, 0.0)


def encode_requests(batch: int, count: int) -> list[bytes]:
    """Serialized UploadRequests of fresh randomized-response reports (random 16-byte ids)."""
    values = np.random.default_rng().integers(0, 4, size=batch * count)
    payloads = [int(v).to_bytes(4, "little") for v in range(4)]
    out = []
    for i in range(count):
        request = ldp_pb2.UploadRequest()
        for v in values[i * batch : (i + 1) * batch]:
            request.reports.add(
                report_id=os.urandom(16), survey_id="bench", question_id="q", payload=payloads[v]
            )
        out.append(request.SerializeToString())
    return out


def generator_main(target, batch, callers, count, seconds, ready, start, results) -> None:
    """One load-generator process: build requests, connect, wait for the start, drive."""
    requests = encode_requests(batch, count)
    results.put(asyncio.run(_drive(target, requests, batch, callers, seconds, ready, start)))


async def _drive(target, requests, batch, callers, seconds, ready, start) -> GeneratorResult:
    options = [
        ("grpc.use_local_subchannel_pool", 1),  # one TCP connection per channel
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    # One connection per caller: with --workers N the kernel spreads connections over workers.
    channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(callers)]
    calls = [channel.unary_unary(UPLOAD) for channel in channels]  # bytes in, bytes out
    warm = 0
    for call in calls:
        await call(requests.pop(), timeout=60)
        warm += batch
    ready.put(None)
    await asyncio.get_running_loop().run_in_executor(None, start.wait)
    latencies: list[float] = []
    errors = 0
    before = resource.getrusage(resource.RUSAGE_SELF)
    began = time.perf_counter()
    stop_at = began + seconds

    async def caller(call) -> None:
        nonlocal errors
        clock = time.perf_counter
        while requests and clock() < stop_at:
            request = requests.pop()
            sent = clock()
            try:
                await call(request, timeout=60)
            except grpc.aio.AioRpcError:
                errors += 1
                continue
            latencies.append(clock() - sent)

    await asyncio.gather(*(caller(call) for call in calls))
    elapsed = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_SELF)
    for channel in channels:
        await channel.close()
    if not requests:
        print("warning: a generator ran out of pre-built requests", file=sys.stderr)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return GeneratorResult(
        np.array(latencies).tobytes(), warm + len(latencies) * batch, errors, cpu, elapsed
    )


def run_python_generators(
    target: str, batch: int, callers: int, count: int, seconds: float, generators: int, on_start
) -> list[GeneratorResult]:
    """Run ``generators`` grpc.aio generator processes; ``on_start()`` runs as they are let go."""
    args = (target, batch, callers, count, seconds)
    return run_together(generator_main, args, generators, seconds, on_start)


def run_together(main, args: tuple, processes: int, seconds: float, on_start) -> list:
    """Start ``processes`` spawned processes of ``main(*args, ready, start, results)``, let them
    go at once when all are ready (``on_start()`` just before), and collect one result each."""
    ctx = multiprocessing.get_context("spawn")
    ready, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=main, args=(*args, ready, start, results)) for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=300)
    on_start()
    start.set()
    outcomes = [results.get(timeout=seconds + 120) for _ in procs]
    for proc in procs:
        proc.join()
    return outcomes


def build_cpp_generator(workdir: Path, required: bool) -> Path | None:
    """Compile scripts/ingest_load.cc; None (or SystemExit if required) when it cannot be."""
    binary = workdir / "ingest_load"
    if shutil.which("g++") and shutil.which("pkg-config"):
        flags = subprocess.run(
            ["pkg-config", "--cflags", "--libs", "grpc++"], capture_output=True, text=True
        )
        if flags.returncode == 0:
            source = str(ROOT / "scripts" / "ingest_load.cc")
            command = ["g++", "-O2", "-std=c++17", source, *flags.stdout.split(), "-o"]
            if subprocess.run([*command, str(binary)]).returncode == 0:
                return binary
    if required:
        raise SystemExit("cannot build the C++ generator: needs g++, pkg-config, libgrpc++-dev")
    print("note: C++ generator unavailable, using the Python one", file=sys.stderr)
    return None


def run_cpp_generators(
    binary: Path,
    workdir: Path,
    target: str,
    batch: int,
    callers: int,
    count: int,
    seconds: float,
    generators: int,
    on_start,
) -> list[GeneratorResult]:
    """Run ``generators`` processes of the C++ generator; ``on_start()`` as they are let go."""
    procs = []
    for g in range(generators):
        requests = workdir / f"requests-{g}"
        latencies = workdir / f"latencies-{g}"
        with requests.open("wb") as out:
            for request in encode_requests(batch, count):
                out.write(struct.pack("<I", len(request)) + request)
        command = [str(binary), target, UPLOAD, str(requests), str(callers), str(seconds)]
        proc = subprocess.Popen(
            [*command, str(latencies)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        procs.append((proc, latencies))
    for proc, _ in procs:
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit("the C++ generator failed to start")
    on_start()
    for proc, _ in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outcomes = []
    for proc, latencies in procs:
        summary = json.loads(proc.stdout.readline())
        proc.wait()
        if summary["exhausted"]:
            print("warning: a generator ran out of pre-built requests", file=sys.stderr)
        outcomes.append(
            GeneratorResult(
                latencies.read_bytes(),
                (summary["warm_calls"] + summary["calls"]) * batch,
                summary["errors"],
                summary["cpu_seconds"],
                summary["seconds"],
            )
        )
    return outcomes


def prefilled_store(tmp: Path, reports: int) -> Path:
    """A store of the bench survey already holding ``reports`` reports (a copy of it starts each
    scenario: issue 27's ingest on a store that has grown): the server pins the definitions,
    then the store takes uploads of 100 straight, queued faster than the writer commits."""
    workdir = tmp / "prefill"
    process, _, db = start_server(workdir)
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    rows = np.zeros((100, 4), dtype=np.int64)
    rows[:, 1] = 1  # category "b", the payload below
    payload = (1).to_bytes(4, "little")
    store = ReportStore(db)
    try:
        with bar(reports // 100_000 or 1, "prefill", unit="100k reports") as progress:
            for start in range(0, reports, 100_000):
                size = min(100_000, reports - start)
                futures = [
                    store.submit_batches(
                        [
                            ReportBatch(
                                "bench",
                                "q",
                                [os.urandom(16) for _ in range(n)],
                                [payload] * n,
                                rows[:n],
                            )
                        ]
                    )
                    for n in [100] * (size // 100) + ([size % 100] if size % 100 else [])
                ]
                for future in futures:
                    future.result()
                progress.update(1)
    finally:
        store.close()
    return db


def run_scenario(
    tmp: Path,
    workers: int,
    batch: int,
    generators: int,
    seconds: float,
    cpp: Path | None,
    template: Path | None = None,
) -> Figures:
    callers, target_text, target_value = SCENARIOS[batch]
    per_generator = max(1, callers // generators)
    rate = min(MAX_RPCS_PER_S, MAX_REPORTS_PER_S / batch)
    count = int(rate * seconds / generators) + per_generator + 10
    workdir = tmp / f"w{workers}-b{batch}"
    prefilled = 0
    if template is not None:
        workdir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, workdir / "bench.sqlite")
        with sqlite3.connect(template) as conn:
            prefilled = conn.execute("SELECT count(*) FROM reports").fetchone()[0]
    process, target, db = start_server(workdir, "--workers", str(workers))
    marks: dict[str, float] = {}

    def on_start() -> None:
        marks["cpu"] = process_tree_cpu_seconds(process.pid)
        marks["time"] = time.perf_counter()

    try:
        if cpp is None:
            outcomes = run_python_generators(
                target, batch, per_generator, count, seconds, generators, on_start
            )
        else:
            outcomes = run_cpp_generators(
                cpp, workdir, target, batch, per_generator, count, seconds, generators, on_start
            )
        wall = time.perf_counter() - marks["time"]
        server_cpu, writer_cpu = np.subtract(process_tree_cpu_seconds(process.pid), marks["cpu"])
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    with sqlite3.connect(db) as conn:
        stored = conn.execute("SELECT count(*) FROM reports").fetchone()[0] - prefilled
    latencies = np.concatenate([np.frombuffer(o.latencies) for o in outcomes]) * 1000
    rpcs = latencies.size
    elapsed = max(o.seconds for o in outcomes)
    client_cpu = sum(o.cpu_seconds for o in outcomes)
    rpc_rate, report_rate = rpcs / elapsed, rpcs * batch / elapsed
    measured = rpc_rate if batch == 1 else report_rate
    return Figures(
        workers=workers,
        batch=batch,
        generator="python" if cpp is None else "cpp",
        generators=generators,
        callers=per_generator * generators,
        rpcs=rpcs,
        reports=rpcs * batch,
        seconds=elapsed,
        rpc_per_s=rpc_rate,
        reports_per_s=report_rate,
        p50_ms=float(np.percentile(latencies, 50)) if rpcs else float("nan"),
        p99_ms=float(np.percentile(latencies, 99)) if rpcs else float("nan"),
        errors=sum(o.errors for o in outcomes),
        server_cpu_us_per_rpc=1e6 * server_cpu / max(rpcs, 1),
        writer_cpu_us_per_rpc=1e6 * writer_cpu / max(rpcs, 1),
        client_cpu_us_per_rpc=1e6 * client_cpu / max(rpcs, 1),
        cores_busy=(server_cpu + client_cpu) / wall,
        stored_as_acked=stored == sum(o.acked_reports for o in outcomes),
        target=target_text,
        met=measured >= target_value,
    )


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return (
        f"{platform.system()} {platform.release()} {platform.machine()}, {cpu}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, grpcio {grpc.__version__}, "
        f"SQLite {sqlite3.sqlite_version}"
    )


def table(results: list[Figures]) -> str:
    """The figures as a Markdown table."""
    lines = [
        "| workers | reports/RPC | generator | RPC/s | reports/s | p50 ms | p99 ms | errors "
        "| server CPU µs/RPC | of which main process | generator CPU µs/RPC | cores busy "
        "| stored = acked | target |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        verdict = "PASS" if r.met else "FAIL"
        lines.append(
            f"| {r.workers} | {r.batch:,} "
            f"| {r.generator} {r.generators}×{r.callers // r.generators} "
            f"| {r.rpc_per_s:,.0f} | {r.reports_per_s:,.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} "
            f"| {r.errors} | {r.server_cpu_us_per_rpc:,.0f} | {r.writer_cpu_us_per_rpc:,.0f} "
            f"| {r.client_cpu_us_per_rpc:,.0f} "
            f"| {r.cores_busy:.2f} | {'yes' if r.stored_as_acked else 'NO'} "
            f"| {r.target}: **{verdict}** |"
        )
    return "\n".join(lines)


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="timed seconds per scenario")
    parser.add_argument("--workers", type=int_list, default=[1, 2], help="e.g. 1,2")
    parser.add_argument("--batches", type=int_list, default=[1, 100, 1000], help="e.g. 1,100")
    parser.add_argument("--generators", type=int, default=2, help="load-generator processes")
    parser.add_argument(
        "--generator",
        choices=["auto", "cpp", "python"],
        default="auto",
        help="load generator (auto: cpp if it can be built)",
    )
    parser.add_argument(
        "--prefill",
        type=int,
        default=0,
        metavar="N",
        help="start every scenario on a store already holding N reports (e.g. 5000000)",
    )
    parser.add_argument("--out", type=Path, help="also write the report (Markdown) here")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()
    unknown = set(args.batches) - set(SCENARIOS)
    if unknown:
        parser.error(f"batch sizes must be among {sorted(SCENARIOS)}")
    header = (
        f"machine: {machine()}\n"
        f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load average at start: {os.getloadavg()[0]:.2f}\n"
        f"command: python scripts/bench_ingest.py {' '.join(sys.argv[1:])}\n"
    )
    print(header, flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        cpp = None
        if args.generator != "python":
            cpp = build_cpp_generator(Path(tmp), required=args.generator == "cpp")
        template = prefilled_store(Path(tmp), args.prefill) if args.prefill > 0 else None
        scenarios = [(w, b) for w in args.workers for b in args.batches]
        with bar(len(scenarios), "ingest", unit="scenarios") as progress:
            for workers, batch in scenarios:
                figures = run_scenario(
                    Path(tmp), workers, batch, args.generators, args.seconds, cpp, template
                )
                progress.write(table([figures]).splitlines()[-1])
                progress.update(1)
                results.append(figures)
    report = f"{header}\n{table(results)}\n"
    print("\n" + report)
    if args.out:
        args.out.write_text(report)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
