"""Validation of the large-domain mechanisms (issue 17): Type I of their goodness-of-fit test,
coverage of their intervals, and simulated power against the planned (weighted noncentral
chi-square) power, for optimized unary encoding, Hadamard response, subset selection and
optimized local hashing.

Usage: python scripts/validate_large_domain.py [--quick] [--only SS,OLH] [--k 1024,4096]
[--calibration asymptotic]

Type I: ``reps`` null histograms per row drawn with the mechanism's exact aggregate sampler,
tested at alpha = 0.05 with the row's calibration ("auto": Imhof's weighted chi-square, for HR
only up to k = 2,048 and exact Monte Carlo above; or forced), the 99% binomial band of the
rejection count beside it. Null: a Zipf(1) law on k categories. Coverage: per-coordinate 95%
intervals, the mean and smallest coordinate's coverage over the replicates. Power: the
alternative moves 0.1 of mass from the first half of the categories to the second
(||Delta||_1 = 0.2), at 10 n reports or the row's ``power_n``, simulated against
``aggregator.stats.power``. Every row has its own seed, so rows can be run apart: each run
merges its rows into ``docs/data/large-domain.json`` and rewrites the generated section of
docs/validation.md from every stored row (``--quick`` prints only).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from doc_sections import write_section
from row_cache import merge_rows

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

ALPHA, EPSILON = 0.05, 1.0
KINDS = {
    "OUE": OptimizedUnaryEncoding,
    "HR": HadamardResponse,
    "SS": SubsetSelection,
    "OLH": LocalHashing,
}
CACHE = Path("docs/data/large-domain.json")
START, END = "<!-- large-domain:start -->", "<!-- large-domain:end -->"


@dataclass(frozen=True)
class Row:
    """One validated setting: mechanism, k, n, calibration, Monte Carlo draws; power at
    ``power_n`` reports (default 10 n)."""

    mech: str
    k: int
    n: int
    calibration: str = "auto"
    n_draws: int = 99
    power_reps: int = 200
    reps: int = 200
    rerun: int = 0  # a rerun of the same setting with fresh seeds
    power_n: int = 0

    @property
    def key(self) -> str:
        rerun = f":rerun {self.rerun}" if self.rerun else ""
        return f"{self.mech}:{self.k}:{self.calibration}:{self.n_draws}{rerun}"

    @property
    def seed(self) -> int:
        return zlib.crc32(self.key.encode())


ROWS = [
    *(Row(m, k, 2000) for m in ("OUE", "HR") for k in (16, 256)),
    # k = 4,096: power at the n where the plan predicts 0.5 (at 10 n it is about 0.07).
    Row("OUE", 4096, 20000, power_n=2_300_000),
    Row("OUE", 4096, 20000, "monte-carlo", power_n=2_300_000),
    Row("HR", 4096, 20000, power_n=2_800_000),
    *(Row(m, k, 2000) for m in ("SS", "OLH") for k in (16, 256, 1024)),
    # k = 4,096: Imhof's law (auto's choice since it goes through determinants; run forced), and
    # for SS also the exact Monte Carlo test with m = 19 draws (exact for (m + 1) alpha whole).
    Row("SS", 4096, 20000, "asymptotic", power_n=2_300_000),
    Row("SS", 4096, 20000, "monte-carlo", 19, power_reps=0, reps=100),
    Row("SS", 4096, 20000, "monte-carlo", 19, power_reps=0, reps=100, rerun=1),
    Row("OLH", 4096, 20000, "asymptotic", power_reps=100, power_n=2_300_000),
]


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


def run_row(spec: Row, quick: bool) -> dict:
    """Type I, coverage and power of one row (its numbers, for the cache and the table)."""
    reps = 100 if quick else spec.reps
    started = time.perf_counter()
    rng = np.random.default_rng(spec.seed)
    mech = KINDS[spec.mech](spec.k, EPSILON)
    p0 = zipf(spec.k)

    def test(values: np.ndarray, n: int, i: int):
        hist = Histogram(mech, n, values)
        return goodness_of_fit(
            hist, p0, ALPHA, calibration=spec.calibration, rng=i, n_draws=spec.n_draws
        )

    rejections, covered = 0, np.zeros(spec.k)
    for i, values in enumerate(mech.simulate_histogram(spec.n, p0, rng, size=reps)):
        result = test(values, spec.n, i)
        rejections += result.reject
        low_ci, high_ci = confidence_intervals(Histogram(mech, spec.n, values), 0.95)
        covered += (low_ci <= p0) & (p0 <= high_ci)
    p1, big = alternative(p0), spec.power_n or 10 * spec.n
    power_reps = min(spec.power_reps, reps)
    hits = sum(
        test(values, big, i).reject
        for i, values in enumerate(mech.simulate_histogram(big, p1, rng, size=power_reps))
    )
    return {
        "mech": spec.mech,
        "k": spec.k,
        "n": spec.n,
        "calibration": result.calibration,
        "n_draws": spec.n_draws if result.calibration == "monte-carlo" else None,
        "reps": reps,
        "rejections": int(rejections),
        "coverage_mean": float(covered.mean() / reps),
        "coverage_min": float(covered.min() / reps),
        "power_n": big,
        "power_reps": power_reps,
        "power_hits": int(hits),
        "planned": (
            float(power(mech, p1, big, alpha=ALPHA, null=p0, calibration=spec.calibration))
            if power_reps
            else None
        ),
        "seconds": round(time.perf_counter() - started, 1),
        "date": datetime.date.today().isoformat(),
        "rerun": spec.rerun,
    }


def band(row: dict) -> tuple[float, float]:
    """The 99% binomial band of the rejection count under a level-alpha test."""
    return stats.binom.interval(0.99, row["reps"], ALPHA)


def inside(row: dict) -> bool:
    low, high = band(row)
    return bool(low <= row["rejections"] <= high)


def line(row: dict) -> str:
    reps = row["reps"]
    low, high = band(row)
    verdict = "yes" if inside(row) else "**no**"
    calibration = row["calibration"]
    if row["n_draws"]:
        calibration += f" (m = {row['n_draws']})"
    if row.get("rerun"):
        calibration += f", rerun {row['rerun']}"
    if row["power_reps"]:
        power_cells = (
            f"{row['power_n']:,} | {row['power_hits'] / row['power_reps']:.3f} "
            f"({row['power_reps']}) | {row['planned']:.3f}"
        )
    else:
        power_cells = "- | - | -"
    return (
        f"| {row['mech']} | {row['k']:,} | {row['n']:,} | {calibration} | {reps} | "
        f"{row['rejections'] / reps:.3f} | [{low / reps:.3f}, {high / reps:.3f}] | {verdict} | "
        f"{row['coverage_mean']:.3f} / {row['coverage_min']:.3f} | {power_cells} | "
        f"{row['seconds']:,.0f} |"
    )


HEADER = [
    "| mech | k | n | calibration | reps | Type I | 99% band | inside | "
    "coverage (95%) mean / min | n (power) | power sim. (reps) | power (planned) | s |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
]


def section(rows: list[dict]) -> str:
    order = {name: i for i, name in enumerate(KINDS)}
    rows = sorted(
        rows, key=lambda r: (order[r["mech"]], r["k"], r["calibration"], r.get("rerun", 0))
    )
    outside = [r for r in rows if not inside(r)]
    dates = sorted({r["date"] for r in rows})
    text = [
        START,
        "## Large-domain mechanisms (issue 17): Type I, interval coverage, power",
        "",
        "Generated by `python scripts/validate_large_domain.py` (rows run apart with "
        "`--only MECH --k K`, each with its own seed, merged in `docs/data/large-domain.json`; "
        f"runs of {', '.join(dates)} on the shared 2-core VM, seconds per row in the last "
        "column; `--quick`: k <= 256, 100 replicates, printed only). Goodness of fit of optimized "
        "unary encoding (OUE), Hadamard response (HR), subset selection (SS) and optimized local "
        "hashing (OLH) at eps = 1 against a Zipf(1) null, alpha = 0.05, the Pearson statistic "
        "on the support counts. Calibration `auto` resolves to Imhof's weighted chi-square "
        "(asymptotic) at every k for OUE, SS and OLH (their law through determinants, O(k), "
        "`aggregator/stats/low_rank_law.py`) and for HR up to k = 2,048, and to the exact Monte "
        "Carlo test (m draws from `simulate_histogram`) for HR above. SS and OLH at k = 4,096 "
        "ran with calibration='asymptotic' forced, which is what `auto` gives there now. At "
        "k = 4,096 OUE also runs the exact Monte Carlo test forced, and SS the exact Monte Carlo "
        "test with m = 19 draws on 100 replicates (the test `auto` ran there before the "
        "determinant law; its level is exact for any m with (m + 1) alpha whole). Null "
        "replicates come from the exact "
        "aggregate samplers; the 99% binomial band of the rejection rate is beside it. Coverage: "
        "the per-coordinate 95% Clopper-Pearson intervals through the channel, mean over the k "
        "coordinates and the worst one (Monte Carlo error about 0.015 at 200 replicates). "
        "Power: 0.1 of mass moved from the first half of the categories to the second "
        "(||Delta||_1 = 0.2) with ten times the reports (at k = 4,096, where that gives power "
        "about 0.07, the n at which the plan predicts 0.5), simulated against "
        "`aggregator.stats.power` (the weighted noncentral chi-square).",
        "",
        "Samplers: SS draws its aggregate with an exact class sampler independent of n "
        "(categories visited in turn, reports grouped by how many categories their subset still "
        "needs; binomial moves; `client/mechanisms/subset.py`), OLH hashes every simulated "
        "report at every category with the real 3-wise independent polynomials, by finite "
        "differences in uint32 (`local_hashing.support_sums`). Exactness is tested in "
        "`tests/stats/test_large_domain_samplers.py` (SS: the enumerated law of 2-4 reports and "
        "per-report simulation; OLH: equal to the hash polynomials bit for bit). OLH's exact "
        "null stays O(n k) per draw (a report's support is a 3-wise independent hash of all k "
        "categories, and no smaller statistic carries it), so at k = 4,096 OLH is validated with "
        "the weighted chi-square law, which needs only the per-report covariance that the "
        "polynomial family gets exactly; its power uses 100 replicates of 2.3 million reports.",
        "",
        *HEADER,
        *(line(r) for r in rows),
        "",
        f"**Summary:** {len(rows) - len(outside)} of {len(rows)} Type I rates inside their 99% "
        "band" + ("" if not outside else " (rows marked **no** are discussed below)") + ".",
        END,
    ]
    return "\n".join(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="k <= 256, 100 replicates, print")
    parser.add_argument("--only", default="", help="mechanisms, e.g. SS,OLH (default: all)")
    parser.add_argument("--k", default="", help="domain sizes, e.g. 1024,4096 (default: all)")
    parser.add_argument("--calibration", default="", help="only rows of this calibration")
    parser.add_argument("--rerun", type=int, default=None, help="only reruns numbered so")
    parser.add_argument("--out", type=Path, default=Path("docs/validation.md"))
    parser.add_argument("--rewrite", action="store_true", help="only rebuild the doc section")
    args = parser.parse_args()
    if args.rewrite:
        stored = merge_rows(CACHE, {})
        write_section(args.out, section(list(stored.values())))
        return
    names = args.only.split(",") if args.only else list(KINDS)
    sizes = {int(k) for k in args.k.split(",")} if args.k else None
    rows = [
        r
        for r in ROWS
        if r.mech in names
        and (sizes is None or r.k in sizes)
        and args.calibration in ("", r.calibration)
        and args.rerun in (None, r.rerun)
        and (not args.quick or r.k <= 256)
    ]
    if not rows:
        parser.error("no row matches --only / --k")
    print(*HEADER, sep="\n")
    results = {}
    for spec in rows:
        results[spec.key] = run_row(spec, args.quick)
        print(line(results[spec.key]), flush=True)
    if args.quick:
        return
    stored = merge_rows(CACHE, results)
    write_section(args.out, section(list(stored.values())))
    print(f"wrote the large-domain section of {args.out} ({len(stored)} rows)")


if __name__ == "__main__":
    main()
