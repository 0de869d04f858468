"""Store-only ingest rate as the report log grows (no gRPC): how many durable reports per second
the single SQLite writer sustains with 0, 1, 2, ... million reports already stored, beside a
plain append-only SQLite table written with the same rows and commit size in the same run.

Why: a log keyed by random report ids lands every insert on a random page of its B-tree, so once
it is large each report dirties a page of its own. The store now appends its log in ``seq`` order
(random places within blocks of 4,096) and keeps the duplicate check in memory
(aggregator/store/sqlite/id_index.py); this script shows whether its rate stays flat as a
long-running
study's log grows, against the rate of a table that only appends (the ceiling for these rows on
this machine).

Each step submits ``--step`` fresh reports (randomized response, k = 4) in uploads of
``--batch`` reports, all queued at once so the writer's group commit is always full, and waits
for every commit (``synchronous = FULL``). Figures per step: reports/s (wall), writer CPU µs per
report (this process, which is the store's writer thread plus a cheap submitting loop), and the
size of the WAL file. The reference (``--reference-steps`` steps before the store's first step
and as many after its last) writes the same rows to a rowid table of its own file, in
transactions of the store's group-commit size, also WAL and ``synchronous = FULL``. At the end
the store is closed and opened again: the start-up time (reading the id index saved at the
close) and the resident memory (VmRSS, VmHWM) are reported with the index's own size, then the
start-up time of a copy of the files taken while the store ran (as a kill leaves them: the index
saved periodically plus the log rows after it), and with the saved index deleted (every id is
read from the log).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aggregator.store.model import ReportBatch  # noqa: E402
from aggregator.store.sqlite.report_store import ReportStore  # noqa: E402
from client.cli.progress import bar  # noqa: E402

K = 4
COMMIT = 2000  # the store's default max_batch: reports per group commit when the queue is full
PAYLOAD = (1).to_bytes(4, "little")


def upload(batch: int, rows: np.ndarray) -> list[ReportBatch]:
    ids = [os.urandom(16) for _ in range(batch)]
    return [ReportBatch("s", "q", ids, [PAYLOAD] * batch, rows)]


def memory() -> tuple[float, float]:
    """(VmRSS, VmHWM) of this process in MiB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value
    return tuple(int(fields[name].split()[0]) / 1024 for name in ("VmRSS", "VmHWM"))


def reference_step(conn: sqlite3.Connection, size: int) -> tuple[float, float]:
    """Append ``size`` rows like the store's to a rowid table, COMMIT rows per transaction:
    (reports/s, CPU µs per report)."""
    day = int(time.time()) // 86_400 * 86_400
    chunks = [
        [(os.urandom(16), "s", "q", PAYLOAD, day, 0, "") for _ in range(COMMIT)]
        for _ in range(size // COMMIT)
    ]
    wall, cpu = time.perf_counter(), time.process_time()
    for chunk in chunks:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO log VALUES (?, ?, ?, ?, ?, ?, ?)", chunk)
        conn.execute("COMMIT")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return size / wall, 1e6 * cpu / size


def open_reference(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute(
        "CREATE TABLE log (report_id BLOB NOT NULL, survey_id TEXT NOT NULL, question_id TEXT"
        " NOT NULL, payload BLOB NOT NULL, received_at INTEGER NOT NULL, side INTEGER NOT NULL,"
        " group_value TEXT NOT NULL)"
    )
    return conn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=51, help="number of steps")
    parser.add_argument("--step", type=int, default=200_000, help="reports per step")
    parser.add_argument("--batch", type=int, default=100, help="reports per upload")
    parser.add_argument(
        "--reference-steps", type=int, default=1, help="append-only steps before and after"
    )
    parser.add_argument("--dir", type=Path, help="put the files here (default: a temporary dir)")
    parser.add_argument("--out", type=Path, help="also write the Markdown table here")
    args = parser.parse_args()
    if min(args.steps, args.step, args.batch) < 1 or args.step % args.batch:
        parser.error("--steps, --step and --batch must be positive, --step a multiple of --batch")
    if args.step % COMMIT:
        parser.error(f"--step must be a multiple of {COMMIT} (the reference's commit size)")
    rows = np.zeros((args.batch, K), dtype=np.int64)
    rows[:, 1] = 1
    lines = [
        f"machine: {platform.system()} {platform.release()} {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}",
        f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load average at start: {os.getloadavg()[0]:.2f}",
        f"command: python scripts/bench_store_growth.py --steps {args.steps} "
        f"--step {args.step} --batch {args.batch} --reference-steps {args.reference_steps}",
        "",
        "| reports stored before the step | reports/s | writer CPU µs/report | WAL MiB |",
        "|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    reference: list[tuple[str, float, float]] = []
    rates: list[float] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "growth.sqlite"
        ref = open_reference(Path(tmp) / "reference.sqlite")
        for _ in range(args.reference_steps):
            reference.append(("before", *reference_step(ref, args.step)))
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
                    del uploads
                    wal = Path(f"{path}-wal")
                    wal_mib = wal.stat().st_size / 2**20 if wal.exists() else 0.0
                    rates.append(args.step / wall)
                    line = (
                        f"| {stored:,} | {args.step / wall:,.0f} | {1e6 * cpu / args.step:.1f} "
                        f"| {wal_mib:.0f} |"
                    )
                    lines.append(line)
                    progress.write(line)
                    progress.update(1)
                    stored += args.step
            for _ in range(args.reference_steps):
                reference.append(("after", *reference_step(ref, args.step)))
            running_rss, running_peak = memory()
            index_mib = store._index.nbytes / 2**20
            crashed = path.with_name(f"crashed-{path.name}")

            def copy_files(conn: object) -> None:
                """The files as a kill of the running server leaves them, copied on the writer
                thread after its periodic index saves, so no checkpoint runs between copies."""
                for suffix in ("", "-wal"):
                    if Path(f"{path}{suffix}").exists():
                        shutil.copyfile(f"{path}{suffix}", f"{crashed}{suffix}")

            store.run_in_writer(copy_files)
        finally:
            store.close()
            ref.close()
        del store
        gc.collect()
        before_open = memory()[0]
        started = time.perf_counter()
        reopened = ReportStore(path)
        startup = time.perf_counter() - started
        after_open, _ = memory()
        runs = reopened._index.runs
        reopened.close()
        db_mib = path.stat().st_size / 2**20
        started = time.perf_counter()
        ReportStore(crashed).close()
        crash_startup = time.perf_counter() - started
        with sqlite3.connect(path) as conn:  # as after a crash with no saved index at all
            conn.execute("DELETE FROM id_index")
        started = time.perf_counter()
        ReportStore(path).close()
        rebuild = time.perf_counter() - started
    lines += [
        "",
        f"| append-only reference (same rows, commits of {COMMIT:,}) | reports/s | CPU µs/report |",
        "|---|---|---|",
    ]
    lines += [
        f"| {when} the store's steps | {rate:,.0f} | {cpu:.1f} |" for when, rate, cpu in reference
    ]
    young, last = rates[0], rates[-1]
    best_ref = max(rate for _, rate, _ in reference) if reference else float("nan")
    lines += [
        "",
        f"young store {young:,.0f} reports/s; last step (after {stored - args.step:,} stored) "
        f"{last:,.0f} reports/s = {last / young:.2f} of young, "
        f"{last / best_ref:.2f} of the reference's best step",
        f"at {stored:,} stored reports: database file {db_mib:,.0f} MiB; id index "
        f"{index_mib:,.0f} MiB; process RSS while running {running_rss:,.0f} MiB "
        f"(peak {running_peak:,.0f} MiB); start-up (open, rebuild the index from the log) "
        f"{startup:.1f} s, +{after_open - before_open:,.0f} MiB RSS, {runs} index runs; "
        f"start-up after a crash (periodically saved index + the rows after it) "
        f"{crash_startup:.1f} s; start-up with no saved index (every id read from the log) "
        f"{rebuild:.1f} s",
        f"load average at the end: {os.getloadavg()[0]:.2f}",
    ]
    print("\n".join(lines[-(len(reference) + 8) :]), flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
