"""Validation of the design-based statistics by simulation (survey-design spec D.4): stratified
two-stage cluster samples with unequal weights, randomized response at epsilon 1, 2 and 4, each
setting's privatized design effect near 2.

Every setting samples 4 strata of population shares 0.4, 0.3, 0.2, 0.1 with equal allocation
(weights 4:1 across strata, times a log-normal PSU factor), strata that answer differently (so
the unweighted estimate is biased), and PSUs whose members share a Dirichlet draw around their
stratum's distribution (clusters larger where the local noise is larger, since the noise
dilutes clustering). Per setting, over the trials:

* design effect (model, mean over categories), its weighting part (Kish) and clustering part,
  and the clustering effect the answers would have without local noise;
* bias (largest over categories) of the naive (SRS, unweighted) estimate and of the Hajek one;
* Type I at alpha = 0.05 of goodness of fit against the population distribution: the naive
  local test (``goodness_of_fit``) and the design-based one (Rao-Scott F);
* Type I of homogeneity between two public groups formed of whole PSUs (PSU parity): the
  naive ``two_sample`` test and the design-based ``design_k_sample`` (Rao-Scott F), where the
  weights bias nothing and only clustering inflates the naive test;
* coverage of the 95 % design intervals (t with #PSU - #strata degrees of freedom): mean and
  smallest over categories.

Usage: python scripts/validate_design.py [--trials N] [--seed S]  (default 2,000 trials per
setting, about three minutes on one core).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aggregator.histogram import Histogram
from aggregator.stats import (
    design_cells,
    design_estimate,
    design_goodness_of_fit,
    design_k_sample,
    goodness_of_fit,
    two_sample,
)
from aggregator.stats.design_simulation import TwoStageSetting
from client.mechanisms import Mechanism, RandomizedResponse

ALPHA = 0.05
SHARES = (0.4, 0.3, 0.2, 0.1)
DISTRIBUTIONS = (
    (0.4, 0.3, 0.2, 0.1),
    (0.3, 0.3, 0.2, 0.2),
    (0.2, 0.3, 0.3, 0.2),
    (0.1, 0.2, 0.3, 0.4),
)


@dataclass(frozen=True)
class Setting:
    label: str
    mechanism: Mechanism
    plan: TwoStageSetting


def plan(psus: int, psu_size: int, concentration: float) -> TwoStageSetting:
    return TwoStageSetting(SHARES, DISTRIBUTIONS, psus, psu_size, concentration, 0.3)


SETTINGS = (
    Setting(
        "eps 1, 4 x 30 PSUs of ~14, icc 0.4",
        RandomizedResponse(k=4, epsilon=1.0),
        plan(30, 14, 1.5),
    ),
    Setting(
        "eps 2, 4 x 20 PSUs of ~8, icc 0.2", RandomizedResponse(k=4, epsilon=2.0), plan(20, 8, 4.0)
    ),
    Setting(
        "eps 4, 4 x 20 PSUs of ~8, icc 0.11", RandomizedResponse(k=4, epsilon=4.0), plan(20, 8, 8.0)
    ),
)


def histogram(mechanism: Mechanism, x_hat: np.ndarray) -> Histogram:
    """The SRS sufficient statistic of the reports whose contributions are ``x_hat``."""
    values = mechanism.slope * x_hat.sum(axis=0) + mechanism.offset * len(x_hat)
    return Histogram(mechanism, len(x_hat), np.round(values))


def run(setting: Setting, trials: int, seed: int) -> dict:
    """One row of the table."""
    rng = np.random.default_rng(seed)
    mech, target = setting.mechanism, setting.plan.population_distribution()
    effects, naive, hajek, covered = [], [], [], []
    rejections = np.zeros(4)
    for _ in range(trials):
        sample = setting.plan.sample(mech, rng)
        cells = design_cells(sample.x_hat, sample.design)
        est = design_estimate(cells, mech)
        effects.append(
            [
                est.deff_model.mean(),
                est.weighting_effect[0],
                est.clustering_effect.mean(),
                est.raw_clustering_effect.mean(),
            ]
        )
        naive.append(sample.x_hat.mean(axis=0))
        hajek.append(est.estimate[0])
        low, high = est.intervals(0.95)
        covered.append((low[0] <= target) & (target <= high[0]))
        group = np.asarray(sample.design.clusters) % 2
        halves = [histogram(mech, sample.x_hat[group == g]) for g in (0, 1)]
        grouped = design_cells(sample.x_hat, sample.design, group, 2)
        rejections += [
            goodness_of_fit(histogram(mech, sample.x_hat), target, ALPHA).reject,
            design_goodness_of_fit(cells, mech, target, alpha=ALPHA).reject,
            two_sample(*halves, ALPHA, calibration="asymptotic").reject,
            design_k_sample(grouped, mech, alpha=ALPHA).reject,
        ]
    effect = np.mean(effects, axis=0)
    coverage = np.mean(covered, axis=0)
    return {
        "setting": setting.label,
        "n": len(sample.x_hat),
        "deff": effect[0],
        "weighting": effect[1],
        "clustering": effect[2],
        "raw clustering": effect[3],
        "naive bias": float(np.abs(np.mean(naive, axis=0) - target).max()),
        "design bias": float(np.abs(np.mean(hajek, axis=0) - target).max()),
        "naive GOF": rejections[0] / trials,
        "design GOF": rejections[1] / trials,
        "naive homogeneity": rejections[2] / trials,
        "design homogeneity": rejections[3] / trials,
        "coverage": float(coverage.mean()),
        "coverage min": float(coverage.min()),
    }


def band(trials: int, level: float = ALPHA, z: float = 2.576) -> tuple[float, float]:
    """The 99 % binomial band of a rejection rate whose true value is ``level``."""
    half = z * math.sqrt(level * (1 - level) / trials)
    return level - half, level + half


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000, help="trials per setting")
    parser.add_argument("--seed", type=int, default=29)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    low, high = band(args.trials)
    print(
        f"alpha = {ALPHA}, {args.trials:,} trials per setting (seed {args.seed}); 99% band of "
        f"a Type I of {ALPHA}: [{low:.4f}, {high:.4f}]\n"
    )
    print(
        "| setting | n | deff (weighting x clustering) | raw clustering | bias naive / design "
        "| GOF Type I naive / design | homogeneity Type I naive / design "
        "| coverage mean (min) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for i, setting in enumerate(SETTINGS):
        r = run(setting, args.trials, args.seed + i)
        print(
            f"| {r['setting']} | {r['n']} | {r['deff']:.2f} ({r['weighting']:.2f} x "
            f"{r['clustering']:.2f}) | {r['raw clustering']:.1f} | {r['naive bias']:.3f} / "
            f"{r['design bias']:.3f} | {r['naive GOF']:.3f} / {r['design GOF']:.3f} | "
            f"{r['naive homogeneity']:.3f} / {r['design homogeneity']:.3f} | "
            f"{r['coverage']:.3f} ({r['coverage min']:.3f}) |"
        )
    print(f"\n{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
