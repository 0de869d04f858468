"""Wall time of ``ldp-aggregator estimate`` and of the default ``test gof`` on a 2,000-category
question (issue 25 item 5): a fresh process each run, as a user types them.

Usage: python scripts/bench_cli_estimate.py [--runs 5] [--store DIR]

Builds (once, in --store, default a temporary folder) a SQLite report store with one Hadamard
response question, k = 2,000, eps = 1, and 60,000 reports simulated from a Zipf(1.1) law, then
runs each command ``--runs`` times and prints the median and the spread of the wall time, and the
median CPU time (user + system) of the child, which a loaded machine inflates less. The code
timed is the one on PYTHONPATH (default: this checkout), so the same file times another tree.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
K, N, EPSILON = 2_000, 60_000, 1.0
SURVEY = """[[survey]]
id = "s"
title = "bench"
min_batch_size = 5

[[survey.question]]
id = "occ"
categories_file = "occ.txt"
mechanism = "hadamard_response"
epsilon = 1.0
"""


def build(folder: Path) -> None:
    """The survey file, its labels, the null (the truth) and the store, unless already there."""
    if (folder / "store.sqlite").exists():
        return
    sys.path.insert(0, str(ROOT))
    from aggregator.store.model import StoredReport
    from aggregator.store.sqlite.report_store import ReportStore
    from client.mechanisms import HadamardResponse

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "occ.txt").write_text("".join(f"occ{j:04d}\n" for j in range(K)))
    (folder / "survey.toml").write_text(SURVEY)
    p = 1 / np.arange(1, K + 1) ** 1.1
    p /= p.sum()
    np.savetxt(folder / "p0.txt", p)
    rng = np.random.default_rng(20261126)
    mech = HadamardResponse(k=K, epsilon=EPSILON)
    reports = mech.simulate(rng.choice(K, size=N, p=p), rng)
    store = ReportStore(folder / "store.sqlite")
    store.register_question("s", "occ", K)
    for start in range(0, N, 2_000):
        chunk = reports[start : start + 2_000]
        rows = mech.support(chunk).astype(np.int64)
        store.put(
            [
                StoredReport((start + i).to_bytes(16, "big"), "s", "occ", mech.encode(int(c)), row)
                for i, (c, row) in enumerate(zip(chunk, rows, strict=True))
            ]
        )
    store.close()


def timed(args: list[str], folder: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall, child CPU) seconds of one ``python -m aggregator.cli ARGS`` run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "aggregator.cli", *args],
        cwd=folder,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per command")
    parser.add_argument("--store", type=Path, help="folder for the benchmark store (kept)")
    args = parser.parse_args(argv)
    folder = args.store or Path(tempfile.mkdtemp(prefix="bench-cli-"))
    build(folder)
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT))}
    where = [
        "--config",
        "survey.toml",
        "--db",
        "store.sqlite",
        "--survey",
        "s",
        "--question",
        "occ",
    ]
    commands = {
        "estimate": ["estimate", *where],
        "test gof (default method)": ["test", *where, "gof", "--p0", "@p0.txt", "--seed", "1"],
    }
    print(f"code: {env['PYTHONPATH']}; load average {os.getloadavg()[0]:.1f}")
    for name, command in commands.items():
        runs = [timed(command, folder, env) for _ in range(args.runs)]
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(
            f"{name}: wall median {statistics.median(walls):.2f} s "
            f"(min {min(walls):.2f}, max {max(walls):.2f}), "
            f"CPU median {statistics.median(cpus):.2f} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
