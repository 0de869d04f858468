"""Coverage of the design-based 95 % intervals by simulation (issue 36 items 2 and 3;
docs/validation.md, "Design intervals").

Stratified two-stage cluster samples (``stats.design.simulation.TwoStageSetting``): strata of
population shares 0.4, 0.3 (and 0.2, 0.1) sampled equally, so weights differ 4:1 across strata
and, as the strata answer differently, are informative (the unweighted estimate is biased);
a log-normal PSU weight factor (sd 0.4) on top, informative too: its log correlates 0.5 with
the PSU's share of category 1 (rarely sampled PSUs hold more of it); PSUs whose answers share a
Dirichlet draw of concentration 20 around their stratum's distribution (intra-cluster
correlation 0.05). Two categories are followed: one rare (true share near 0.015, where an
interval is most likely to leave [0, 1] and symmetric intervals undercover) and one near 0.35.
Answers seen directly and randomized response at epsilon 1; 10, 12 and 14 PSUs in 2 strata
(8-12 design degrees of freedom) and 64 in 4 strata (60).

Per setting, small-sample mode ("bell-mccaffrey", the default, and "as-r") and category: the
coverage of the true population share by the intervals "beta" (Korn-Graubard, the default),
"logit" and "wald" (estimate -/+ t(df) s.e.; as R's ``svymean`` in "as-r"), the median degrees
of freedom of the t reference, and how often the Wald interval leaves [0, 1].

Usage: python scripts/validate_design_coverage.py [--trials N] [--seed S] (default 2,000
trials per setting: about ten minutes on one core). docs/validation.md's table: the default.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aggregator.stats.design.cells import design_cells
from aggregator.stats.design.estimate import design_estimate
from aggregator.stats.design.options import INTERVALS, SMALL_SAMPLE
from aggregator.stats.design.simulation import TwoStageSetting
from client.mechanisms import Mechanism, RandomizedResponse

CONFIDENCE = 0.95
#: Per stratum the answer distribution: category 0 rare, category 1 near 0.35.
DISTRIBUTIONS = (
    (0.01, 0.29, 0.3, 0.4),
    (0.02, 0.38, 0.3, 0.3),
    (0.03, 0.27, 0.3, 0.4),
    (0.02, 0.38, 0.2, 0.4),
)
FOLLOWED = (0, 1)


@dataclass(frozen=True)
class Setting:
    label: str
    mechanism: Mechanism | None
    plan: TwoStageSetting


def plan(strata: int, psus: int, size: int) -> TwoStageSetting:
    return TwoStageSetting(
        shares=(0.4, 0.3, 0.2, 0.1)[:strata],
        distributions=DISTRIBUTIONS[:strata],
        psus=psus,
        psu_size=size,
        concentration=20.0,
        weight_spread=0.4,
        informative=0.5,
    )


RR = RandomizedResponse(k=4, epsilon=1.0)
SETTINGS = (
    *(Setting(f"answers seen, 2 x {n} PSUs of ~30", None, plan(2, n, 30)) for n in (5, 6, 7)),
    *(Setting(f"RR eps 1, 2 x {n} PSUs of ~60", RR, plan(2, n, 60)) for n in (5, 6, 7)),
    Setting("answers seen, 4 x 16 PSUs of ~30", None, plan(4, 16, 30)),
    Setting("RR eps 1, 4 x 16 PSUs of ~40", RR, plan(4, 16, 40)),
)


def psus(setting: Setting) -> int:
    return setting.plan.psus * len(setting.plan.shares)


def run(setting: Setting, trials: int, seed: int) -> dict:
    """One setting: per small-sample mode and interval method the coverage of each followed
    category, the median degrees of freedom of the t reference, and how often the Wald interval
    (as R) leaves [0, 1]. Both modes see the same samples."""
    rng = np.random.default_rng(seed)
    target = setting.plan.population_distribution()[list(FOLLOWED)]
    covered = {(mode, m): np.zeros(len(FOLLOWED)) for mode in SMALL_SAMPLE for m in INTERVALS}
    df: dict[str, list[float]] = {mode: [] for mode in SMALL_SAMPLE}
    outside = np.zeros(len(FOLLOWED))
    for _ in range(trials):
        sample = setting.plan.sample(setting.mechanism, rng)
        cells = design_cells(sample.x_hat, sample.design)
        for mode in SMALL_SAMPLE:
            est = design_estimate(cells, setting.mechanism, small_sample=mode)
            df[mode].append(float(est.interval_df[0, 0]))
            for method in INTERVALS:
                low, high = (b[0, list(FOLLOWED)] for b in est.intervals(CONFIDENCE, method))
                covered[mode, method] += (low <= target) & (target <= high)
                if method == "wald" and mode == "as-r":
                    outside += (low < 0) | (high > 1)
    return {
        "setting": setting.label,
        "psus": psus(setting),
        "target": target,
        "coverage": {key: hits / trials for key, hits in covered.items()},
        "df": {mode: float(np.median(values)) for mode, values in df.items()},
        "wald outside": outside / trials,
    }


def band(trials: int) -> tuple[float, float]:
    """The 99 % binomial band of the coverage of a 95 % interval over ``trials``."""
    low, high = stats.binom.interval(0.99, trials, CONFIDENCE)
    return low / trials, high / trials


def table(rows: list[dict]) -> str:
    columns = [(mode, m) for mode in SMALL_SAMPLE for m in INTERVALS]
    names = " | ".join(f"{m} ({mode})" for mode, m in columns)
    head = f"| setting | PSUs | category (true share) | {names} | df ({' / '.join(SMALL_SAMPLE)})"
    lines = [head + " | Wald outside [0, 1] |", "|" + " --- |" * (len(columns) + 5)]
    for row in rows:
        df = " / ".join(f"{row['df'][mode]:.1f}" for mode in SMALL_SAMPLE)
        for i, share in enumerate(row["target"]):
            cells = " | ".join(f"{row['coverage'][key][i]:.3f}" for key in columns)
            lines.append(
                f"| {row['setting']} | {row['psus']} | {FOLLOWED[i]} ({share:.3f}) | {cells} | "
                f"{df} | {row['wald outside'][i]:.3f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = [run(setting, args.trials, args.seed + i) for i, setting in enumerate(SETTINGS)]
    print(table(rows))
    low, high = band(args.trials)
    print(
        f"\n{args.trials} trials per setting; 99 % band of a 95 % interval's coverage: "
        f"[{low:.3f}, {high:.3f}]; {time.perf_counter() - start:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
