"""Benchmark of the statistical engine: simulation throughput, secure per-record randomization
latency, and the latency of the local tests and estimates, each compared with its target.

Usage: python scripts/bench_stats.py [--quick] [--json PATH] [--calibrated-only |
--large-domain-only]. Exits 0 whatever the outcome;
the last line counts the targets met. Figures are medians (and p90) over repetitions timed with
``time.perf_counter`` after warm-up calls.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import scipy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aggregator.histogram import Histogram
from aggregator.stats import estimate, goodness_of_fit, independence
from client.cli.progress import track
from client.mechanisms import (
    FlipComponents,
    GaussianNoise,
    HadamardResponse,
    LaplaceNoise,
    Mechanism,
    OptimizedUnaryEncoding,
    RandomizedResponse,
)

EPSILON, RHO, N_HIST, SEED = 1.0, 0.5, 10**6, 20261121
SCALE = {"µs": 1e6, "ms": 1e3, "M reports/s": 1e-6, "hist/s": 1.0}


@dataclass(frozen=True)
class Row:
    """One measured figure in display units; ``target`` is a bound (>= for rates, else <=)."""

    group: str
    name: str
    unit: str
    median: float
    p90: float
    target: float | None = None
    higher_is_better: bool = False

    @property
    def status(self) -> str:
        if self.target is None:
            return "-"
        met = self.median >= self.target if self.higher_is_better else self.median <= self.target
        return "PASS" if met else "FAIL"


def timings(fn: Callable[[], object], repeats: int, number: int = 1, warmup: int = 2) -> np.ndarray:
    """Seconds per call of ``fn``, one entry per batch of ``number`` calls, after warm-up."""
    for _ in range(warmup):
        fn()
    out = np.empty(repeats)
    for i in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        out[i] = (time.perf_counter() - start) / number
    return out


def latency(group: str, name: str, seconds: np.ndarray, unit: str, target: float | None) -> Row:
    """Median and p90 of per-call times, in ``unit``."""
    scaled = seconds * SCALE[unit]
    return Row(
        group, name, unit, float(np.median(scaled)), float(np.percentile(scaled, 90)), target
    )


def rate(
    group: str, name: str, seconds: np.ndarray, items: int, unit: str, target: float | None = None
) -> Row:
    """Items per second; the p90 column is the rate at the p90 time (the slow tail)."""
    rates = items / seconds * SCALE[unit]
    slow = float(np.percentile(rates, 10))
    return Row(group, name, unit, float(np.median(rates)), slow, target, higher_is_better=True)


def mechanisms(k: int) -> dict[str, Mechanism]:
    """The four mechanisms at the benchmark's privacy parameters."""
    return {
        "RR": RandomizedResponse(k, EPSILON),
        "FC": FlipComponents(k, EPSILON),
        "Gaussian": GaussianNoise(k, RHO),
        "Laplace": LaplaceNoise(k, EPSILON),
    }


def histogram(mech: Mechanism, p: np.ndarray, rng: np.random.Generator) -> Histogram:
    """The sufficient statistic of N_HIST reports drawn with the aggregate sampler."""
    return Histogram(mech, N_HIST, mech.simulate_histogram(N_HIST, p, rng))


def bench_simulate(reps: int, rng: np.random.Generator) -> list[Row]:
    """Vectorised simulation (input arrays are built outside the timing) and aggregate sampler."""
    group, rows = "simulate (k=16)", []
    big = rng.integers(0, 16, size=10_000_000)
    small = big[:200_000].copy()
    for label, mech in mechanisms(16).items():
        values = big if label == "RR" else small
        seconds = timings(lambda m=mech, v=values: m.simulate(v, rng), reps, warmup=1)
        target = 10.0 if label == "RR" else None
        name = f"{label}.simulate, {values.size:,} values"
        rows.append(rate(group, name, seconds, values.size, "M reports/s", target))
    p, size = np.full(16, 1 / 16), 1000
    for label, mech in mechanisms(16).items():
        seconds = timings(lambda m=mech: m.simulate_histogram(N_HIST, p, rng, size=size), reps)
        name = f"{label}.simulate_histogram, n=10^6, size={size}"
        rows.append(rate(group, name, seconds, size, "hist/s"))
    return rows


def bench_randomize(scale: float) -> list[Row]:
    """Secure single-record path; per-call median over batches of calls."""
    cases = [
        (RandomizedResponse(16, EPSILON), 20_000, 20.0, "µs"),
        (FlipComponents(64, EPSILON), 2_000, 500.0, "µs"),
        (GaussianNoise(64, RHO), 200, 5.0, "ms"),
        (LaplaceNoise(64, EPSILON), 200, 5.0, "ms"),
    ]
    rows = []
    for mech, calls, target, unit in cases:
        calls = max(20, int(calls * scale))
        seconds = timings(lambda m=mech: m.randomize(3), repeats=20, number=calls // 20)
        name = f"{mech.describe()}, {calls:,} calls"
        rows.append(latency("randomize (secure)", name, seconds, unit, target))
    return rows


def bench_tests(reps: int, rng: np.random.Generator) -> list[Row]:
    """Test and estimate latency on histograms built once, outside the timing."""
    rows = []
    k, group = 1024, "goodness of fit"
    p0 = np.full(k, 1 / k)
    big = mechanisms(k)
    for label, method in [("RR", "pearson"), ("Gaussian", "projected"), ("FC", "projected")]:
        hist = histogram(big[label], p0, rng)
        seconds = timings(lambda h=hist, m=method: goodness_of_fit(h, p0, 0.05, m), 10 * reps)
        rows.append(latency(group, f"{label} {method}, k={k}, n=10^6", seconds, "ms", 10.0))
    p64 = np.full(64, 1 / 64)
    hist = histogram(LaplaceNoise(64, EPSILON), p64, rng)
    seconds = timings(
        lambda: goodness_of_fit(hist, p64, 0.05, "monte-carlo", rng=rng, n_draws=999), reps
    )
    rows.append(latency(group, "Laplace monte-carlo m=999, k=64, n=10^6", seconds, "ms", 1000.0))

    group, p100 = "independence 10x10", np.full(100, 0.01)
    cases = [
        ("RR", "min-chi-square", 250.0),
        ("Gaussian", "projected", 250.0),
        ("FC", "projected", 250.0),
        ("Laplace", "bootstrap", None),
    ]
    table = mechanisms(100)
    for label, method, target in cases:
        hist = histogram(table[label], p100, rng)
        tail = " m=199" if method == "bootstrap" else ""
        seconds = timings(
            lambda h=hist, m=method: independence(h, (10, 10), 0.05, m, rng=rng, n_draws=199),
            reps if method == "bootstrap" else 5 * reps,
        )
        rows.append(latency(group, f"{label} {method}{tail}, n=10^6", seconds, "ms", target))

    for label, mech in big.items():
        hist = histogram(mech, p0, rng)
        seconds = timings(lambda h=hist: estimate(h), 10 * reps)
        rows.append(latency("estimate", f"{label}, k={k}, n=10^6", seconds, "ms", None))
    return rows


def bench_calibrated(reps: int, rng: np.random.Generator) -> list[Row]:
    """Calibrated tests (issue 11 targets): exact Monte Carlo GOF at k = 1,024 with m = 999 on a
    sparse Zipf null, and the parametric-bootstrap independence test of a 10x10 table, m = 199."""
    rows = []
    k = 1024
    weights = 1 / np.arange(1, k + 1)
    p0 = weights / weights.sum()
    for label, mech in mechanisms(k).items():
        hist = Histogram(mech, 1000, mech.simulate_histogram(1000, p0, rng))
        seconds = timings(
            lambda h=hist: goodness_of_fit(h, p0, calibration="monte-carlo", rng=rng, n_draws=999),
            reps,
        )
        name = f"{label}, k={k}, m=999, n=1000"
        rows.append(latency("calibrated goodness of fit", name, seconds, "ms", 1000.0))
    rows_p, cols_p = weights[:10] / weights[:10].sum(), weights[:10] / weights[:10].sum()
    table = np.outer(rows_p, cols_p).ravel()
    for label, mech in mechanisms(100).items():
        hist = Histogram(mech, 20000, mech.simulate_histogram(20000, table, rng))
        seconds = timings(
            lambda h=hist: independence(
                h, (10, 10), calibration="monte-carlo", rng=rng, n_draws=199
            ),
            reps,
        )
        name = f"{label}, m=199, n=20000, Zipf x Zipf"
        rows.append(latency("bootstrap independence 10x10", name, seconds, "ms", 2000.0))
    return rows


def bench_large_domain(reps: int, rng: np.random.Generator) -> list[Row]:
    """Issue 17: decode of n = 10^6 reports into de-biased frequencies at k = 2^10 .. 2^16
    (Hadamard response: column counts, one FWHT; optimized unary encoding: bit sums of the
    packed payloads, per report), and the secure randomizer per report."""
    rows, n = [], N_HIST
    for k in (2**10, 2**12, 2**14, 2**16 - 1, 2**16):
        mech = HadamardResponse(k, EPSILON)
        reports = rng.integers(0, mech.columns, size=n)

        def decode(m=mech, r=reports) -> np.ndarray:
            return (m.support_counts(r) / n - m.offset) / m.slope

        target = 50.0 if k >= 2**16 - 1 else None
        name = f"Hadamard response, k={k:,} (K={mech.columns:,}), n=10^6"
        rows.append(latency("decode", name, timings(decode, reps), "ms", target))
    for k in (2**10, 2**12):
        mech = OptimizedUnaryEncoding(k, EPSILON)
        chunk = 10_000
        packed = rng.integers(0, 256, size=(chunk, mech.payload_size), dtype=np.uint8)
        if k % 8:
            packed[:, -1] &= (1 << (k % 8)) - 1

        def decode(m=mech, b=packed, size=chunk) -> np.ndarray:
            return (m.support_counts(m.decode_many(b)) / size - m.offset) / m.slope

        seconds = timings(decode, reps) * (n / chunk)
        name = f"optimized unary, k={k:,}, n=10^6 (bit sums of payloads, 10^4 per batch)"
        rows.append(latency("decode", name, seconds, "ms", None))
    cases = [
        (OptimizedUnaryEncoding(64, EPSILON), 2_000),
        (OptimizedUnaryEncoding(1024, EPSILON), 500),
        (HadamardResponse(1024, EPSILON), 20_000),
        (HadamardResponse(2**16 - 1, EPSILON), 20_000),
    ]
    for mech, calls in cases:
        calls = max(20, calls // (5 if reps < 5 else 1))
        seconds = timings(lambda m=mech: m.randomize(3), repeats=20, number=calls // 20)
        name = f"{mech.describe()}, {calls:,} calls"
        rows.append(latency("randomize (secure)", name, seconds, "µs", None))
    return rows


def machine() -> dict[str, str]:
    """Platform, CPU model, core count, library versions, date and load average."""
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        models = [ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")]
        cpu = models[0].split(":", 1)[1].strip() if models else cpu
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "load average": load,
    }


def number(x: float) -> str:
    """Four significant digits, without exponents for large rates."""
    return f"{x:,.0f}" if abs(x) >= 1e4 else f"{x:.4g}"


def print_table(info: dict[str, str], rows: list[Row]) -> None:
    """Machine block, then one line per figure with its target and verdict."""
    for key, value in info.items():
        print(f"{key:>13}: {value}")
    header = ("benchmark", "median", "p90", "unit", "target", "status")
    lines = [
        (
            f"{r.group}: {r.name}",
            number(r.median),
            number(r.p90),
            r.unit,
            "no target"
            if r.target is None
            else f"{'>=' if r.higher_is_better else '<='} {r.target:g}",
            r.status,
        )
        for r in rows
    ]
    widths = [max(len(x[i]) for x in [header, *lines]) for i in range(len(header))]
    for line in [header, tuple("-" * w for w in widths), *lines]:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    print("p90: 90th-percentile time per call; for rates, the rate at that time (slow tail).")


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Benchmark the statistical engine against its targets."
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (smoke test)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write figures as JSON")
    parser.add_argument(
        "--calibrated-only", action="store_true", help="only the calibrated tests (issue 11)"
    )
    parser.add_argument(
        "--large-domain-only", action="store_true", help="only decode and randomize (issue 17)"
    )
    args = parser.parse_args()
    reps, scale = (3, 0.1) if args.quick else (15, 1.0)
    rng = np.random.default_rng(SEED)
    started = time.perf_counter()
    info = machine()
    if args.calibrated_only:
        sections = [lambda: bench_calibrated(reps, rng)]
    elif args.large_domain_only:
        sections = [lambda: bench_large_domain(reps, rng)]
    else:
        sections = [
            lambda: bench_simulate(reps, rng),
            lambda: bench_randomize(scale),
            lambda: bench_tests(reps, rng),
            lambda: bench_calibrated(reps, rng),
            lambda: bench_large_domain(reps, rng),
        ]
    rows = [row for section in track(sections, "bench", unit="sections") for row in section()]
    print_table(info, rows)
    targeted = [r for r in rows if r.target is not None]
    met = sum(r.status == "PASS" for r in targeted)
    elapsed = time.perf_counter() - started
    print(f"\n{met} of {len(targeted)} targets met ({elapsed:.0f} s)")
    if args.json:
        payload = {
            "machine": info,
            "quick": args.quick,
            "targets_met": met,
            "targets": len(targeted),
            "results": [asdict(r) | {"status": r.status} for r in rows],
        }
        args.json.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
