"""Validation of the large-domain mechanisms (issue 17): Type I of their goodness-of-fit test,
coverage of their intervals, and simulated power against the planned (weighted noncentral
chi-square) power, for optimized unary encoding, Hadamard response, subset selection and
optimized local hashing.

Usage: python scripts/validate_large_domain.py [--quick]

Type I: ``reps`` null histograms per setting drawn with the mechanism's exact aggregate sampler,
tested at alpha = 0.05 with ``calibration="auto"`` (Imhof's weighted chi-square up to k = 2,048,
exact Monte Carlo with 99 draws above; the full run has k = 16, 256 and 4,096); the 99%
binomial band of the rejection count is printed beside it. Null: a Zipf(1) law on k categories.
Coverage: per-coordinate 95% intervals, the mean and smallest coordinate's coverage over the
replicates. Power: the alternative moves 0.1 of
mass from the first half of the categories to the second (||Delta||_1 = 0.2), simulated against
``aggregator.stats.power``. Subset selection and local hashing simulate every report (O(n k) per
draw), so they stop at k = 256.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aggregator.histogram import Histogram
from aggregator.stats import goodness_of_fit
from aggregator.stats.intervals import confidence_intervals
from aggregator.stats.power import power
from client.mechanisms import (
    HadamardResponse,
    LocalHashing,
    OptimizedUnaryEncoding,
    SubsetSelection,
)

SEED, ALPHA, EPSILON = 20261123, 0.05, 1.0
KINDS = {
    "OUE": OptimizedUnaryEncoding,
    "HR": HadamardResponse,
    "SS": SubsetSelection,
    "OLH": LocalHashing,
}


def zipf(k: int) -> np.ndarray:
    weights = 1 / np.arange(1, k + 1)
    return weights / weights.sum()


def alternative(p0: np.ndarray) -> np.ndarray:
    """0.1 of mass moved from the first half (which holds more than half of a Zipf law) to the
    second, proportionally: ||Delta||_1 = 0.2 and p1 >= 0."""
    half = p0.size // 2
    p1 = p0.copy()
    p1[:half] -= 0.1 * p0[:half] / p0[:half].sum()
    p1[half:] += 0.1 * p0[half:] / p0[half:].sum()
    return p1


def row(name: str, k: int, n: int, reps: int, rng: np.random.Generator) -> str:
    mech = KINDS[name](k, EPSILON)
    p0 = zipf(k)
    nulls = mech.simulate_histogram(n, p0, rng, size=reps)
    rejections, covered = 0, np.zeros(k)
    for i, values in enumerate(nulls):
        hist = Histogram(mech, n, values)
        result = goodness_of_fit(hist, p0, ALPHA, rng=i, n_draws=99)
        rejections += result.reject
        low_ci, high_ci = confidence_intervals(hist, 0.95)  # what estimate() reports, O(k)
        covered += (low_ci <= p0) & (p0 <= high_ci)
    low, high = stats.binom.interval(0.99, reps, ALPHA)
    inside = "yes" if low <= rejections <= high else "**no**"
    p1, big = alternative(p0), 10 * n
    hits = sum(
        goodness_of_fit(Histogram(mech, big, values), p0, ALPHA, rng=i, n_draws=99).reject
        for i, values in enumerate(mech.simulate_histogram(big, p1, rng, size=reps))
    )
    planned = power(mech, p1, big, alpha=ALPHA, null=p0)
    return (
        f"| {name} | {k:,} | {n:,} | {result.calibration} | {rejections / reps:.3f} | "
        f"[{low / reps:.3f}, {high / reps:.3f}] | {inside} | {covered.mean() / reps:.3f} / "
        f"{covered.min() / reps:.3f} | {big:,} | {hits / reps:.3f} | {planned:.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="k <= 256, 100 replicates")
    args = parser.parse_args()
    reps = 100 if args.quick else 200
    ks = (16, 256) if args.quick else (16, 256, 4096)
    rng = np.random.default_rng(SEED)
    started = time.perf_counter()
    print(
        "| mech | k | n | calibration | Type I | 99% band | inside | coverage (95%) mean / min | "
        "n (power) | power (sim.) | power (planned) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in KINDS:
        for k in ks:
            if name in ("SS", "OLH") and k > 256:
                continue
            n = 2000 if k <= 256 else 20000  # the power column uses 10 n
            print(row(name, k, n, reps, rng), flush=True)
    print(
        f"\n{reps} replicates per cell, epsilon = {EPSILON:g}, seed {SEED}; "
        f"{time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
