"""How long `ldp-aggregator report` takes and how large its page is (docs/performance.md,
"Survey report").

Usage: python scripts/bench_report.py --config FILE --db FILE --survey ID [--out PAGE]
[--repeats N]

Runs the command's own ``main`` in this process: first the imports it needs (timed once, as
start-up), then the report ``--repeats`` times, each timed in wall-clock and CPU seconds (CPU
time is what a loaded machine does not inflate); prints the medians and the size of the page
and of the files written beside it. Works on any checkout (run it with that checkout first on
``PYTHONPATH`` to measure it), since it only calls the command line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


def timed(call) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of ``call()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--survey", required=True)
    parser.add_argument("--out", type=Path, default=Path("bench-report.html"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    def load() -> None:
        import matplotlib.figure  # noqa: F401

        import aggregator.cli
        import aggregator.report
        import aggregator.stats  # noqa: F401

    start_wall, start_cpu = timed(load)
    from aggregator.cli import main as cli

    argv = ["report", "--config", args.config, "--db", args.db, "--survey", args.survey]
    argv += ["--out", str(args.out)]
    runs = []
    for _ in range(args.repeats):
        runs.append(timed(lambda: cli(argv)))
    beside = sorted(args.out.parent.glob(f"{args.out.stem}-*.csv"))
    print(f"start-up (imports): {start_wall:.2f} s wall, {start_cpu:.2f} s CPU")
    print(
        f"report, median of {args.repeats}: {statistics.median(w for w, _ in runs):.2f} s wall, "
        f"{statistics.median(c for _, c in runs):.2f} s CPU"
    )
    print(f"{args.out}: {args.out.stat().st_size:,} bytes")
    for path in beside:
        print(f"{path}: {path.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
