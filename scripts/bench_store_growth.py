"""Store-only ingest rate as the report log grows (no gRPC): how many durable reports per second
the single SQLite writer sustains with 0, 1, 2, ... million reports already stored.

Why: report ids are random, so every insert lands on a random page of the log's B-tree. While
the log is small, the reports of one group commit share pages; once it is large, each report
dirties a page of its own, and the WAL and checkpoint traffic per report grows. The ingest
benchmark starts from an empty store, so this script shows what a long-running study sees.

Each step submits ``--step`` fresh reports (randomized response, k = 4) in uploads of
``--batch`` reports, all queued at once so the writer's group commit is always full, and waits
for every commit (``synchronous = FULL``). Figures per step: reports/s (wall), writer CPU µs per
report (this process, which is the store's writer thread plus a cheap submitting loop), and the
size of the WAL file.
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aggregator.store.report_store import ReportBatch, ReportStore  # noqa: E402
from client.progress import bar  # noqa: E402

K = 4


def upload(batch: int, rows: np.ndarray) -> list[ReportBatch]:
    ids = [os.urandom(16) for _ in range(batch)]
    return [ReportBatch("s", "q", ids, [(1).to_bytes(4, "little")] * batch, rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25, help="number of steps")
    parser.add_argument("--step", type=int, default=200_000, help="reports per step")
    parser.add_argument("--batch", type=int, default=100, help="reports per upload")
    parser.add_argument("--out", type=Path, help="also write the Markdown table here")
    args = parser.parse_args()
    if min(args.steps, args.step, args.batch) < 1 or args.step % args.batch:
        parser.error("--steps, --step and --batch must be positive, --step a multiple of --batch")
    rows = np.zeros((args.batch, K), dtype=np.int64)
    rows[:, 1] = 1
    lines = [
        f"machine: {platform.system()} {platform.release()} {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}",
        f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load average at start: {os.getloadavg()[0]:.2f}",
        f"command: python scripts/bench_store_growth.py --steps {args.steps} "
        f"--step {args.step} --batch {args.batch}",
        "",
        "| reports stored before the step | reports/s | writer CPU µs/report | WAL MiB |",
        "|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "growth.sqlite"
        store = ReportStore(path)
        try:
            store.register_question("s", "q", K)
            stored = 0
            with bar(args.steps, "growth", unit="steps") as progress:
                for _ in range(args.steps):
                    uploads = [upload(args.batch, rows) for _ in range(args.step // args.batch)]
                    wall, cpu = time.perf_counter(), time.process_time()
                    for future in [store.submit_batches(u) for u in uploads]:
                        future.result()
                    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                    wal = Path(f"{path}-wal")
                    wal_mib = wal.stat().st_size / 2**20 if wal.exists() else 0.0
                    line = (
                        f"| {stored:,} | {args.step / wall:,.0f} | {1e6 * cpu / args.step:.1f} "
                        f"| {wal_mib:.0f} |"
                    )
                    lines.append(line)
                    progress.write(line)
                    progress.update(1)
                    stored += args.step
        finally:
            store.close()
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
