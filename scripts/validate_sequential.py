"""Validation of anytime-valid monitoring (issue 30; survey-design-and-monitoring spec S.3).

Usage: python scripts/validate_sequential.py [--paths 400] [--quick]

Every path draws reports in batches of 100 up to n = 20,000 (200 looks) with the mechanism's
exact aggregate sampler, and is looked at after every batch:

* Type I: P(ever reject) of the sequential goodness-of-fit test (e-value >= 1/alpha at any look)
  beside the naive repeated fixed-n test (the project's goodness_of_fit, asymptotic calibration,
  p < alpha at any look; on the first ``--naive-paths`` paths, as it costs up to 60 ms a look),
  with the 99% Clopper-Pearson upper bound of the sequential rate;
* coverage over the whole path: the simultaneous confidence sequence of the k frequencies and
  the mean-score sequence, beside the fixed-n simultaneous intervals recomputed at every look;
* width: the sequence's width over the fixed-n simultaneous interval's at n = 1,000, 5,000,
  20,000 (median over paths and categories), tuned_n = 10,000;
* stopping: under the planned alternative, the e-process's stopping time (capped at 20,000)
  beside the fixed-n sample size for power 0.8 (``aggregator.stats.power.sample_size``) and the
  spec's approximation (``expected_stopping_time``);
* composite nulls (randomized response, 2 x 3 table, looks every 1,000): P(ever reject) of the
  sequential independence and two-group homogeneity tests.

Null p0 uniform on k = 4, alternative (0.3, 0.3, 0.2, 0.2), alpha = 0.05; fixed seeds per row.
Prints markdown tables (docs/validation.md, "Anytime-valid monitoring").
"""

from __future__ import annotations

import argparse
import time
import zlib

import numpy as np
from scipy import stats

from aggregator.histogram import Histogram
from aggregator.stats import estimate, goodness_of_fit, sample_size
from aggregator.stats.anytime import (
    EProcess,
    expected_stopping_time,
    frequency_sequence,
    nulls,
    sequential_homogeneity,
    sequential_independence,
)
from aggregator.stats.anytime.sequences import frequency_excluded, mean_score_excluded
from client.mechanisms import (
    FlipComponents,
    GaussianNoise,
    HadamardResponse,
    LaplaceNoise,
    OptimizedUnaryEncoding,
    RandomizedResponse,
)

ALPHA = 0.05
BATCH = 100
N_MAX = 20_000
P0 = np.full(4, 0.25)
P1 = np.array([0.3, 0.3, 0.2, 0.2])
SKEWED = np.array([0.1, 0.2, 0.3, 0.4])
MECHANISMS = [
    RandomizedResponse(k=4, epsilon=1.0),
    FlipComponents(k=4, epsilon=1.0),
    OptimizedUnaryEncoding(k=4, epsilon=1.0),
    HadamardResponse(k=4, epsilon=1.0),
    GaussianNoise(k=4, rho=0.5),
    LaplaceNoise(k=4, epsilon=1.0),
]


def rng_for(label: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(label.encode()))


def upper99(count: int, total: int) -> float:
    """The 99% Clopper-Pearson upper bound of a rate."""
    return 1.0 if count == total else float(stats.beta.ppf(0.99, count + 1, total - count))


def paths(mech, p, n_paths: int, rng, n_max: int = N_MAX, batch: int = BATCH) -> np.ndarray:
    """(looks, paths, s): cumulative statistics after every batch."""
    draws = mech.simulate_histogram(batch, p, rng, size=n_max // batch * n_paths)
    return np.cumsum(draws.reshape(n_max // batch, n_paths, -1), axis=0)


def type_one(mech, n_paths: int, naive_paths: int) -> str:
    cumulative = paths(mech, P0, n_paths, rng_for("type1 " + mech.describe()))
    seq = naive = 0
    for i in range(n_paths):
        process = EProcess(nulls.simple(P0, 4), [mech], ALPHA)
        rejected_naive = False
        for look, values in enumerate(cumulative[:, i], start=1):
            hist = Histogram(mech, look * BATCH, values)
            result = process.update([hist])
            if i < naive_paths and not rejected_naive:
                test = goodness_of_fit(hist, P0, ALPHA, calibration="asymptotic")
                rejected_naive = bool(test.pvalue < ALPHA)
        seq += result.reject
        naive += rejected_naive
    return (
        f"| {mech.describe()} | {n_paths} | {seq / n_paths:.3f} | "
        f"{upper99(seq, n_paths):.3f} | {naive / naive_paths:.2f} ({naive_paths} paths) |"
    )


def coverage(mech, n_paths: int) -> str:
    cumulative = paths(mech, SKEWED, n_paths, rng_for("coverage " + mech.describe()))
    mean = float(SKEWED @ np.arange(1, 5))
    missed = np.zeros(n_paths, dtype=bool)
    missed_mean = np.zeros(n_paths, dtype=bool)
    missed_fixed = np.zeros(n_paths, dtype=bool)
    for look, values in enumerate(cumulative, start=1):
        n = look * BATCH
        missed |= frequency_excluded(n, values, mech, SKEWED, ALPHA).any(axis=1)
        missed_mean |= mean_score_excluded(n, values, mech, mean, alpha=ALPHA)
        for i in np.flatnonzero(~missed_fixed):
            est = estimate(Histogram(mech, n, values[i]), 1 - ALPHA, simultaneous=True)
            low, high = est.simultaneous_low, est.simultaneous_high
            assert low is not None and high is not None
            missed_fixed[i] = bool(np.any((low > SKEWED) | (high < SKEWED)))
    return (
        f"| {mech.describe()} | {n_paths} | {1 - missed.mean():.3f} | "
        f"{1 - missed_mean.mean():.3f} | {1 - missed_fixed.mean():.3f} |"
    )


def widths(mech, n_paths: int = 20) -> str:
    cumulative = paths(mech, SKEWED, n_paths, rng_for("width " + mech.describe()))
    cells = []
    for n in (1_000, 5_000, 20_000):
        ratios = []
        for values in cumulative[n // BATCH - 1]:
            hist = Histogram(mech, n, values)
            cs = frequency_sequence(hist, ALPHA)
            est = estimate(hist, 1 - ALPHA, simultaneous=True)
            assert est.simultaneous_low is not None and est.simultaneous_high is not None
            fixed = est.simultaneous_high - est.simultaneous_low
            inside = (cs.low > 0) & (cs.high < 1) & (fixed > 0)  # unclipped cells only
            ratios.extend(((cs.high - cs.low)[inside] / fixed[inside]).tolist())
        cells.append(f"{np.median(ratios):.2f}" if ratios else "n/a")
    return f"| {mech.describe()} | " + " | ".join(cells) + " |"


def stopping(mech, n_paths: int) -> str:
    cumulative = paths(mech, P1, n_paths, rng_for("stop " + mech.describe()))
    times = []
    for i in range(n_paths):
        process = EProcess(nulls.simple(P0, 4), [mech], ALPHA, max_n=N_MAX)
        for look, values in enumerate(cumulative[:, i], start=1):
            result = process.update([Histogram(mech, look * BATCH, values)])
            if result.stop:
                break
        times.append(result.rejected_at or N_MAX)
    times_arr = np.array(times)
    fixed = sample_size(mech, P1, null=P0, alpha=ALPHA, calibration="asymptotic")
    approx = expected_stopping_time(mech, P1, P0, ALPHA)
    stopped = np.mean(times_arr < N_MAX)
    return (
        f"| {mech.describe()} | {n_paths} | {times_arr.mean():.0f} | {np.median(times_arr):.0f} "
        f"| {stopped:.2f} | {np.mean(times_arr <= fixed):.2f} | {fixed} | {approx} |"
    )


def composite(n_paths: int) -> list[str]:
    mech = RandomizedResponse(k=6, epsilon=2.0)
    p = np.outer([0.4, 0.6], [0.2, 0.3, 0.5]).ravel()
    rows = []
    for name in ("independence", "homogeneity"):
        rng = rng_for("composite " + name)
        groups = 1 if name == "independence" else 2
        draws = [paths(mech, p, n_paths, rng, batch=1_000) for _ in range(groups)]
        rejected = 0
        for i in range(n_paths):
            looks = [
                [Histogram(mech, (t + 1) * 1_000, d[t, i]) for d in draws]
                for t in range(N_MAX // 1_000)
            ]
            if name == "independence":
                result = sequential_independence([look[0] for look in looks], (2, 3), ALPHA)
            else:
                result = sequential_homogeneity(looks, ALPHA)
            rejected += result.reject
        rows.append(
            f"| {name} | {mech.describe()} | {n_paths} | {rejected / n_paths:.3f} | "
            f"{upper99(rejected, n_paths):.3f} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", type=int, default=400)
    parser.add_argument("--naive-paths", type=int, default=30, help="paths of the naive test")
    parser.add_argument("--quick", action="store_true", help="50 paths, randomized response only")
    args = parser.parse_args()
    mechanisms = MECHANISMS[:1] if args.quick else MECHANISMS
    n_paths = 50 if args.quick else args.paths
    started = time.time()
    print("| mechanism | paths | sequential P(ever reject) | 99% upper | naive P(ever reject) |")
    print("|---|---|---|---|---|")
    for mech in mechanisms:
        print(type_one(mech, n_paths, min(args.naive_paths, n_paths)), flush=True)
    print(
        "\n| mechanism | paths | CS coverage (k frequencies) | CS coverage (mean score) "
        "| fixed-n simultaneous, every look |"
    )
    print("|---|---|---|---|---|")
    for mech in mechanisms:
        print(coverage(mech, n_paths), flush=True)
    print("\n| mechanism | width ratio n=1,000 | n=5,000 | n=20,000 |")
    print("|---|---|---|---|")
    for mech in mechanisms:
        print(widths(mech), flush=True)
    print(
        "\n| mechanism | paths | mean stop | median stop | stopped by 20,000 "
        "| stopped by fixed n | fixed n (power 0.8) | spec approximation |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for mech in mechanisms:
        print(stopping(mech, max(n_paths // 2, 20)), flush=True)
    print("\n| null | mechanism | paths | P(ever reject) | 99% upper |")
    print("|---|---|---|---|---|")
    for row in composite(max(n_paths // 10, 10)):
        print(row, flush=True)
    print(f"\n({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
