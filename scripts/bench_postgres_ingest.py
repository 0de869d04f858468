"""Ingest on a shared PostgreSQL store with 1 and 2 nodes, beside the embedded SQLite store, in
the same run on the same machine (docs/scaling.md).

Each scenario starts real ``ldp-aggregator serve`` processes (SQLite: one process on its file;
PostgreSQL: one or two ``--store`` nodes on a throwaway server, tests/postgres_server.py, with
fsync on) and drives them from grpc.aio load-generator processes that spread their connections
over the nodes, sending pre-serialized uploads of fresh reports (scripts/bench_ingest.py's
requests). It reports reports/s, latency percentiles, CPU per report of the nodes and of
PostgreSQL, PostgreSQL's commits and bytes per report, and checks that the store holds exactly
the acknowledged reports.

With ``--limits`` the survey has per-device limits (never reached) that every upload is counted
against, so the difference to a run without is their cost.

Usage: python scripts/bench_postgres_ingest.py [--seconds 6] [--batch 100] [--callers 24]
           [--generators 2] [--limits] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

import grpc
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "tests")]

from bench_ingest import (  # noqa: E402
    SURVEY,
    UPLOAD,
    encode_requests,
    machine,
    process_tree_cpu_seconds,
    run_together,
)
from postgres_server import PostgresServer, binaries  # noqa: E402


@dataclass
class Figures:
    store: str
    nodes: int
    reports: int
    seconds: float
    reports_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    node_cpu_us: float  # per report, all nodes
    database_cpu_us: float  # per report, the PostgreSQL server's processes
    commits_per_1000: float  # database transactions per 1,000 reports
    bytes_per_report: float  # table + index bytes per stored report
    stored_as_acked: bool


#: --limits: per-device limits every upload is checked against (never reached: the cost of
#: counting them, on one device's rows, since every upload comes from one loopback host)
LIMITS = "rate_per_minute = 1000000000\nburst = 1000000\nmax_reports_per_device = 1000000000000\n"


def start_node(
    workdir: Path, name: str, *options: str, limits: bool = False
) -> tuple[subprocess.Popen, str]:
    config = workdir / "survey.toml"
    config.write_text(
        SURVEY.replace("min_batch_size = 1\n", "min_batch_size = 1\n" + LIMITS)
        if limits
        else SURVEY
    )
    secret = workdir / "node0.sqlite.limits-secret"
    if name != "node0" and secret.exists():  # the nodes of one store share the limits secret
        shutil.copy(secret, workdir / f"{name}.sqlite.limits-secret")
    port_file = workdir / f"{name}.port"
    command = [sys.executable, "-m", "aggregator.cli", "serve", "--config", str(config)]
    command += ["--db", str(workdir / f"{name}.sqlite"), "--port", "0", "--insecure"]
    command += ["--port-file", str(port_file), "--analyst-port-file", f"{port_file}.analyst"]
    process = subprocess.Popen([*command, *options], cwd=ROOT, stdout=subprocess.DEVNULL)
    deadline = time.time() + 60
    while not (port_file.exists() and port_file.read_text().strip()):
        if process.poll() is not None or time.time() > deadline:
            raise SystemExit("a node did not start")
        time.sleep(0.05)
    return process, f"127.0.0.1:{port_file.read_text().strip()}"


def generator(targets, batch, callers, count, seconds, ready, start, results) -> None:
    requests = encode_requests(batch, count)
    results.put(asyncio.run(drive(targets, requests, batch, callers, seconds, ready, start)))


async def drive(targets, requests, batch, callers, seconds, ready, start) -> tuple:
    """``callers`` connections spread over ``targets``, each sending one upload at a time:
    (latencies, acknowledged reports incl. warm-up, errors, CPU seconds, seconds)."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [
        grpc.aio.insecure_channel(targets[i % len(targets)], options=options)
        for i in range(callers)
    ]
    calls = [channel.unary_unary(UPLOAD) for channel in channels]
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

    async def caller(call) -> None:
        nonlocal errors
        while requests and time.perf_counter() < began + seconds:
            request = requests.pop()
            sent = time.perf_counter()
            try:
                await call(request, timeout=60)
            except grpc.aio.AioRpcError:
                errors += 1
                continue
            latencies.append(time.perf_counter() - sent)

    await asyncio.gather(*(caller(call) for call in calls))
    elapsed = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_SELF)
    for channel in channels:
        await channel.close()
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return np.array(latencies).tobytes(), warm + len(latencies) * batch, errors, cpu, elapsed


def run(targets, batch, callers, generators, seconds, on_start) -> list[tuple]:
    count = int(60_000 * seconds / batch / generators) + callers + 10
    args = (targets, batch, callers // generators, count, seconds)
    return run_together(generator, args, generators, seconds, on_start)


def database_figures(url: str) -> tuple[int, int, int]:
    """(stored reports, committed transactions so far, table + index bytes) of the database."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        stored = conn.execute("SELECT count(*) FROM reports").fetchone()[0]
        commits = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()[0]
        size = conn.execute(
            "SELECT pg_total_relation_size('reports') + pg_total_relation_size('statistic_shards')"
        ).fetchone()[0]
    return stored, commits, size


def scenario(
    tmp: Path, server: PostgresServer | None, nodes: int, args: argparse.Namespace
) -> Figures:
    workdir = tmp / f"{'pg' if server else 'sqlite'}-{nodes}"
    workdir.mkdir()
    url = server.new_database() if server else None
    options = ("--store", url) if url else ()
    started = [start_node(workdir, f"node{i}", *options, limits=args.limits) for i in range(nodes)]
    marks: dict[str, float] = {}

    def cpu() -> tuple[float, float]:
        node = sum(process_tree_cpu_seconds(p.pid)[0] for p, _ in started)
        database = 0.0
        if server is not None and server.process is not None:
            database = process_tree_cpu_seconds(server.process.pid)[0]
        return node, database

    def on_start() -> None:
        marks["node"], marks["db"] = cpu()
        if url:
            marks["commits"] = database_figures(url)[1]

    try:
        outcomes = run(
            [t for _, t in started], args.batch, args.callers, args.generators, args.seconds,
            on_start,
        )  # fmt: skip
        node_cpu, db_cpu = np.subtract(cpu(), (marks["node"], marks["db"]))
        commits = database_figures(url)[1] - marks["commits"] if url else 0
    finally:
        for process, _ in started:
            process.send_signal(signal.SIGTERM)
        for process, _ in started:
            process.wait(timeout=60)
    if url:
        stored, _, size = database_figures(url)
    else:
        with sqlite3.connect(workdir / "node0.sqlite") as conn:
            stored = conn.execute("SELECT count(*) FROM reports").fetchone()[0]
        size = sum(f.stat().st_size for f in workdir.glob("node0.sqlite*"))
    latencies = np.concatenate([np.frombuffer(o[0]) for o in outcomes]) * 1000
    reports = latencies.size * args.batch
    elapsed = max(o[4] for o in outcomes)
    return Figures(
        store="PostgreSQL" if url else "SQLite",
        nodes=nodes,
        reports=reports,
        seconds=elapsed,
        reports_per_s=reports / elapsed,
        p50_ms=float(np.percentile(latencies, 50)),
        p99_ms=float(np.percentile(latencies, 99)),
        errors=sum(o[2] for o in outcomes),
        node_cpu_us=1e6 * node_cpu / max(reports, 1),
        database_cpu_us=1e6 * db_cpu / max(reports, 1),
        commits_per_1000=1000 * commits / max(reports, 1),
        bytes_per_report=size / max(stored, 1),
        stored_as_acked=stored == sum(o[1] for o in outcomes),
    )


def table(results: list[Figures]) -> str:
    lines = [
        "| store | nodes | reports/s | p50 ms | p99 ms | errors | node CPU µs/report "
        "| database CPU µs/report | commits per 1,000 reports | bytes/report | stored = acked |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        database = "– | –"
        if r.store != "SQLite":
            database = f"{r.database_cpu_us:,.0f} | {r.commits_per_1000:.1f}"
        lines.append(
            f"| {r.store} | {r.nodes} | {r.reports_per_s:,.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} "
            f"| {r.errors} | {r.node_cpu_us:,.0f} | {database} | {r.bytes_per_report:,.0f} "
            f"| {'yes' if r.stored_as_acked else 'NO'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="timed seconds per scenario")
    parser.add_argument("--batch", type=int, default=100, help="reports per upload")
    parser.add_argument("--callers", type=int, default=24, help="uploads in flight, in all")
    parser.add_argument("--generators", type=int, default=2, help="load-generator processes")
    parser.add_argument("--out", type=Path, help="also write the report (Markdown) here")
    parser.add_argument(
        "--limits",
        action="store_true",
        help="give the survey per-device limits (rate, burst, cap) that every upload is counted "
        "against: on PostgreSQL in the shared store, in one transaction per upload",
    )
    args = parser.parse_args()
    bindir = binaries()
    if bindir is None:
        raise SystemExit("no PostgreSQL server binaries: apt-get install postgresql")
    load = Path("/proc/loadavg").read_text().split()[0]
    server = PostgresServer(bindir, fsync=True)
    server.start()
    results = []
    try:
        with TemporaryDirectory() as tmp:
            results.append(scenario(Path(tmp), None, 1, args))
            for nodes in (1, 2):
                results.append(scenario(Path(tmp), server, nodes, args))
    finally:
        server.stop()
    report = "\n".join(
        [
            f"machine: {machine()}",
            f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average at "
            f"start: {load}",
            f"command: python scripts/bench_postgres_ingest.py {' '.join(sys.argv[1:])}".strip(),
            f"uploads of {args.batch} reports, {args.callers} in flight from {args.generators} "
            "grpc.aio generator processes on the same machine"
            + (", per-device limits counted (--limits)" if args.limits else ""),
            "",
            table(results),
        ]
    )
    print(report)
    if args.out:
        args.out.write_text(report + "\n")


if __name__ == "__main__":
    main()
