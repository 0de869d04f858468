"""Speed of the exact aggregate samplers of subset selection and local hashing at k = 4,096,
eps = 1, Zipf answers (issue 17 item 6): subset selection's class sampler against per-report
simulation, local hashing's finite-difference support sums against the hash polynomial evaluated
per report and category (the previous sampler).

Usage: python scripts/bench_samplers.py  (about a minute on a quiet 2-core VM)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from client.mechanisms import LocalHashing, SubsetSelection
from client.mechanisms.local_hashing import PRIME, hash_values_at

K = 4096


def seconds(run, repeat: int = 1) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) / repeat


def main() -> None:
    p = 1 / np.arange(1, K + 1)
    p /= p.sum()
    rng = np.random.default_rng(0)
    ss = SubsetSelection(K, 1.0)
    for n in (20_000, 200_000):
        per_draw = seconds(lambda n=n: ss.simulate_histogram(n, p, rng, size=100), 100)
        print(f"SS class sampler, n = {n:,}: {per_draw:.3f} s per draw (100 draws per call)")
    answers = rng.choice(K, 20_000, p=p)
    per_report = seconds(lambda: ss.simulate(answers, rng).sum(axis=0))
    print(f"SS per-report simulation, n = 20,000: {per_report:.2f} s per draw")
    olh, n = LocalHashing(K, 1.0), 20_000
    sums = seconds(lambda: olh.simulate_histogram(n, p, rng))
    print(f"OLH support sums, n = {n:,}: {sums:.2f} s per draw")
    coefficients = rng.integers(0, PRIME, size=(n, 3), dtype=np.uint64)
    reported = olh.inner.simulate(hash_values_at(coefficients, answers, olh.buckets), rng)
    reports = np.stack([np.zeros(n, np.uint64), reported.astype(np.uint64)], axis=1)
    polynomial = seconds(lambda: olh._support(reports, coefficients).sum(axis=0))
    print(f"OLH polynomial per report and category, n = {n:,}: {polynomial:.2f} s per draw")


if __name__ == "__main__":
    main()
