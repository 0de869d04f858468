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

Raking (``--tables raking``): cluster samples whose response depends on two public variables
(3 age bands, 2 regions) that also shape the answer; raked to the known population margins,
the bias of the naive, the design-weighted (Hajek) and the raked estimates, and the coverage of
the raked 95 % intervals by linearization and by the jackknife that repeats the raking.

Power (``--tables power``): the predicted power of the design-based goodness-of-fit test
(``stats.design_power``: the planned design effect from the raw clustering and weighting
effects, diluted by the mechanism's signal share) against the simulated rejections of the
default Rao-Scott F test, and the planned design effect against the mean estimated one.

Large k (``--tables large-k``, issue 36 item 5): Type I at alpha = 0.05 of goodness of fit at
k = 4, 16 and 64 with 14 and 60 PSUs (2 strata, weights, clustering) under randomized response
and local hashing at epsilon 1 and optimized unary encoding at epsilon 2, by R's plug-in
Rao-Scott F and by the default ``F-unbiased``; and independence in an 8 x 8 table under local
hashing at epsilon 1 with 20 PSUs, where a noisy margin is estimated as 0 or below.

Usage: python scripts/validate_design.py [--tables design raking power large-k] [--trials N]
[--raking-trials N] [--large-k-trials N] [--seed S] (default: the first three tables, 500 trials
per setting, 200 for raking, whose jackknife repeats the raking once per PSU: about two minutes
on one core). docs/validation.md's tables: ``--tables design --trials 2000``, ``--tables raking
power --trials 1000 --raking-trials 300`` and ``--tables large-k --large-k-trials 1000``.
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
    Design,
    design_cells,
    design_estimate,
    design_goodness_of_fit,
    design_independence,
    design_k_sample,
    goodness_of_fit,
    raked_estimate,
    two_sample,
)
from aggregator.stats.design.cells import contributions
from aggregator.stats.design.power import DesignEffect, plan_goodness_of_fit
from aggregator.stats.design.raking import joint_domains
from aggregator.stats.design.simulation import TwoStageSetting
from client.mechanisms import (
    LocalHashing,
    Mechanism,
    OptimizedUnaryEncoding,
    RandomizedResponse,
)

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
            two_sample(halves[0], halves[1], ALPHA, calibration="asymptotic").reject,
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


#: Raking: population shares of 3 age bands and 2 regions (independent in the population),
#: each (band, region)'s answer distribution, and response propensities that are products of
#: a band factor and a region factor (so raking to the margins removes the nonresponse bias).
AGE, REGION = np.array([0.3, 0.4, 0.3]), np.array([0.6, 0.4])
ANSWERS = np.array(
    [
        [(0.5, 0.2, 0.2, 0.1), (0.4, 0.3, 0.2, 0.1)],
        [(0.3, 0.3, 0.2, 0.2), (0.2, 0.3, 0.3, 0.2)],
        [(0.2, 0.2, 0.3, 0.3), (0.1, 0.2, 0.3, 0.4)],
    ]
)
RESPONSE = np.outer([0.9, 0.6, 0.3], [0.4, 0.9])


@dataclass(frozen=True)
class RakingSetting:
    label: str
    mechanism: Mechanism
    psus: int
    psu_size: int
    concentration: float  # a PSU's Dirichlet draw around each (band, region)'s distribution

    def target(self) -> np.ndarray:
        return np.einsum("a,b,abj->j", AGE, REGION, ANSWERS)

    def sample(self, rng: np.random.Generator) -> tuple[np.ndarray, Design, np.ndarray]:
        """Contributions, the design (2 strata of PSUs, log-normal PSU weights) and each
        report's (band, region)."""
        strata, psus, weights, cats, answers = [], [], [], [], []
        for c in range(2 * self.psus):
            size = int(rng.integers(self.psu_size // 2, 3 * self.psu_size // 2 + 1))
            a = rng.choice(3, size=size, p=AGE)
            b = rng.choice(2, size=size, p=REGION)
            keep = rng.random(size) < RESPONSE[a, b]
            shared = [[rng.dirichlet(self.concentration * p) for p in row] for row in ANSWERS]
            answers += [
                rng.choice(4, p=shared[x][y]) for x, y in zip(a[keep], b[keep], strict=True)
            ]
            cats.append(np.column_stack([a[keep], b[keep]]))
            strata.append(np.full(keep.sum(), c % 2))
            psus.append(np.full(keep.sum(), c))
            weights.append(np.full(keep.sum(), np.exp(0.3 * rng.standard_normal())))
        x_hat = contributions(self.mechanism, self.mechanism.simulate(np.array(answers), rng))
        design = Design(np.concatenate(strata), np.concatenate(psus), np.concatenate(weights))
        return x_hat, design, np.concatenate(cats)


RAKING_SETTINGS = tuple(
    RakingSetting(f"eps {e:g}, 2 x 20 PSUs of ~{m}", RandomizedResponse(k=4, epsilon=e), 20, m, c)
    for e, m, c in ((1.0, 40, 20.0), (2.0, 30, 20.0), (4.0, 20, 20.0))
)


def run_raking(setting: RakingSetting, trials: int, seed: int) -> dict:
    """One row of the raking table."""
    rng = np.random.default_rng(seed)
    target = setting.target()
    margins = [1e4 * AGE, 1e4 * REGION]
    naive, hajek, raked, sizes = [], [], [], []
    covered: list[np.ndarray] = []
    jack_covered: list[np.ndarray] = []
    for _ in range(trials):
        x_hat, design, cats = setting.sample(rng)
        cells = design_cells(x_hat, design, joint_domains(cats, (3, 2)), 6)
        result = raked_estimate(cells, margins)
        jack = raked_estimate(cells, margins, method="jackknife")
        naive.append(x_hat.mean(axis=0))
        hajek.append(design.weights @ x_hat / design.weights.sum())
        raked.append(result.estimate)
        for store, fit in ((covered, result), (jack_covered, jack)):
            low, high = fit.intervals(0.95)
            store.append((low <= target) & (target <= high))
        sizes.append(len(x_hat))
    bias = [float(np.abs(np.mean(x, axis=0) - target).max()) for x in (naive, hajek, raked)]
    return {
        "setting": setting.label,
        "n": int(np.mean(sizes)),
        "bias": bias,
        "coverage": np.mean(covered, axis=0),
        "jackknife": np.mean(jack_covered, axis=0),
    }


@dataclass(frozen=True)
class PowerSetting:
    label: str
    epsilon: float
    psus: int
    psu_size: int
    concentration: float
    spread: float
    alternative: tuple[float, ...]

    def effect(self) -> DesignEffect:
        """Raw clustering 1 + icc (E[m^2]/E[m] - 1) (sizes uniform on m/2..3m/2), icc =
        1 / (concentration + 1); Kish's effect exp(spread^2) of log-normal PSU weights."""
        sizes = np.arange(self.psu_size // 2, 3 * self.psu_size // 2 + 1)
        ratio = (sizes**2).mean() / sizes.mean()
        return DesignEffect(1 + (ratio - 1) / (self.concentration + 1), math.exp(self.spread**2))


POWER_SETTINGS = (
    PowerSetting("eps 2, 40 PSUs of ~20, icc 0.2", 2.0, 40, 20, 4.0, 0.0, (0.33, 0.27, 0.22, 0.18)),
    PowerSetting(
        "eps 4, 40 PSUs of ~10, icc 0.1, weights", 4.0, 40, 10, 9.0, 0.4, (0.31, 0.27, 0.23, 0.19)
    ),
    PowerSetting(
        "eps 1, 60 PSUs of ~15, weights only", 1.0, 60, 15, math.inf, 0.5, (0.37, 0.26, 0.21, 0.16)
    ),
)


def run_power(setting: PowerSetting, trials: int, seed: int) -> dict:
    """One row of the power table: predicted against simulated rejections."""
    rng = np.random.default_rng(seed)
    mech = RandomizedResponse(k=4, epsilon=setting.epsilon)
    null = np.full(4, 0.25)
    plan = plan_goodness_of_fit(mech, np.array(setting.alternative), null, setting.effect())
    sizes = np.arange(setting.psu_size // 2, 3 * setting.psu_size // 2 + 1)
    n = setting.psus * sizes.mean()
    two_stage = TwoStageSetting(
        (1.0,),
        (setting.alternative,),
        setting.psus,
        setting.psu_size,
        setting.concentration,
        setting.spread,
    )
    rejected, deffs = 0, []
    for _ in range(trials):
        sample = two_stage.sample(mech, rng)
        result = design_goodness_of_fit(design_cells(sample.x_hat, sample.design), mech, null)
        rejected += result.reject
        deffs.append(result.eigenvalues.mean())
    return {
        "setting": setting.label,
        "n": int(n),
        "planned deff": plan.deff,
        "share": plan.share,
        "deff": float(np.mean(deffs)),
        "predicted": plan.power(n, ALPHA, setting.psus - 1),
        "simulated": rejected / trials,
    }


@dataclass(frozen=True)
class LargeKSetting:
    """Goodness of fit (``rows`` 0) or independence in a ``rows`` x ``rows`` table."""

    label: str
    mechanism: Mechanism
    plan: TwoStageSetting
    rows: int = 0


def large_k_plan(k: int, psus: int, psu_size: int) -> TwoStageSetting:
    """2 strata (shares 0.6, 0.4) answering differently (probabilities rising with the category
    in one, falling in the other), icc 0.25, log-normal PSU weights (sd 0.3)."""
    rising = np.arange(1.0, k + 1)
    return TwoStageSetting(
        (0.6, 0.4),
        (tuple(rising / rising.sum()), tuple(rising[::-1] / rising.sum())),
        psus // 2,
        psu_size,
        3.0,
        0.3,
    )


def independent_plan(psus: int, psu_size: int) -> TwoStageSetting:
    """An 8 x 8 table of independent attributes with small margins (0.02 to 0.3), the same in
    both strata (so the population is independent too), icc 0.25, log-normal PSU weights."""
    margin = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02])
    cells = tuple(np.outer(margin, margin[::-1]).reshape(-1))
    return TwoStageSetting((0.6, 0.4), (cells, cells), psus // 2, psu_size, 3.0, 0.3)


def _large_k_settings() -> tuple[LargeKSetting, ...]:
    settings = []
    for k, size in ((4, 20), (16, 20), (64, 40)):
        for psus in (14, 60):
            for name, mechanism in (
                ("RR eps 1", RandomizedResponse(k=k, epsilon=1.0)),
                ("LH eps 1", LocalHashing(k=k, epsilon=1.0)),
                ("OUE eps 2", OptimizedUnaryEncoding(k=k, epsilon=2.0)),
            ):
                label = f"GOF k = {k}, {psus} PSUs of ~{size}, {name}"
                settings.append(LargeKSetting(label, mechanism, large_k_plan(k, psus, size)))
    for size in (50, 100):
        settings.append(
            LargeKSetting(
                f"independence 8 x 8, 20 PSUs of ~{size}, LH eps 1",
                LocalHashing(k=64, epsilon=1.0),
                independent_plan(20, size),
                8,
            )
        )
    return tuple(settings)


LARGE_K_SETTINGS = _large_k_settings()


def run_large_k(setting: LargeKSetting, trials: int, seed: int) -> dict:
    """One row of the large-k table: rejections of a true null by R's F and by F-unbiased on
    the same samples, their mean numerator degrees of freedom, and how often the null fit of
    an independence test has a zero margin."""
    rng = np.random.default_rng(seed)
    mech, p0 = setting.mechanism, setting.plan.population_distribution()
    rejected, nus, sizes, zero = np.zeros(2), np.zeros(2), [], 0
    for _ in range(trials):
        sample = setting.plan.sample(mech, rng)
        cells = design_cells(sample.x_hat, sample.design)
        sizes.append(len(sample.x_hat))
        for i, correction in enumerate(("F", "F-unbiased")):
            if setting.rows:
                result = design_independence(cells, mech, setting.rows, setting.rows, correction)
                zero += i == 0 and bool(np.any(result.expected == 0))
            else:
                result = design_goodness_of_fit(cells, mech, p0, correction)
            rejected[i] += result.reject
            nus[i] += result.numerator_df
    return {
        "setting": setting.label,
        "n": int(np.mean(sizes)),
        "contrasts": (setting.rows - 1) ** 2 if setting.rows else setting.plan.k - 1,
        "F": rejected[0] / trials,
        "unbiased": rejected[1] / trials,
        "nu F": nus[0] / trials,
        "nu unbiased": nus[1] / trials,
        "zero margin": zero / trials,
    }


def large_k_table(trials: int, seed: int) -> None:
    low, high = band(trials)
    print(
        f"\nlarge k: {trials:,} trials per setting (seed {seed}), alpha {ALPHA}; 99% band "
        f"[{low:.4f}, {high:.4f}]\n"
    )
    print(
        "| setting | n | contrasts | Type I R's F | Type I F-unbiased "
        "| mean nu R's F / F-unbiased | null fit with a zero margin |"
    )
    print("|---|---|---|---|---|---|---|")
    for i, setting in enumerate(LARGE_K_SETTINGS):
        r = run_large_k(setting, trials, seed + i)
        flags = ["" if low <= r[key] <= high else " *" for key in ("F", "unbiased")]
        zero = f"{r['zero margin']:.0%}" if setting.rows else "-"
        print(
            f"| {r['setting']} | {r['n']} | {r['contrasts']} | {r['F']:.3f}{flags[0]} | "
            f"{r['unbiased']:.3f}{flags[1]} | {r['nu F']:.1f} / {r['nu unbiased']:.1f} | "
            f"{zero} |",
            flush=True,
        )


def band(trials: int, level: float = ALPHA, z: float = 2.576) -> tuple[float, float]:
    """The 99 % binomial band of a rejection rate whose true value is ``level``."""
    half = z * math.sqrt(level * (1 - level) / trials)
    return level - half, level + half


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tables",
        nargs="+",
        choices=("design", "raking", "power", "large-k"),
        default=["design", "raking", "power"],
    )
    parser.add_argument("--trials", type=int, default=500, help="trials per setting")
    parser.add_argument("--raking-trials", type=int, default=200, help="trials per raking setting")
    parser.add_argument(
        "--large-k-trials", type=int, default=300, help="trials per large-k setting"
    )
    parser.add_argument("--seed", type=int, default=29)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if "design" in args.tables:
        design_table(args.trials, args.seed)
    if "raking" in args.tables:
        raking_table(args.raking_trials, args.seed)
    if "power" in args.tables:
        power_table(args.trials, args.seed)
    if "large-k" in args.tables:
        large_k_table(args.large_k_trials, args.seed)
    print(f"\n{time.perf_counter() - started:.0f} s")
    return 0


def raking_table(trials: int, seed: int) -> None:
    print(f"\nraking: {trials:,} trials per setting (seed {seed}), 95 % intervals\n")
    print(
        "| setting | n | bias naive / weighted / raked | coverage linearization mean (min) "
        "| coverage jackknife mean (min) |"
    )
    print("|---|---|---|---|---|")
    for i, setting in enumerate(RAKING_SETTINGS):
        r = run_raking(setting, trials, seed + i)
        naive, weighted, raked = r["bias"]
        print(
            f"| {r['setting']} | {r['n']} | {naive:.3f} / {weighted:.3f} / {raked:.3f} | "
            f"{r['coverage'].mean():.3f} ({r['coverage'].min():.3f}) | "
            f"{r['jackknife'].mean():.3f} ({r['jackknife'].min():.3f}) |"
        )


def power_table(trials: int, seed: int) -> None:
    print(f"\npower: {trials:,} trials per setting (seed {seed}), Rao-Scott F at alpha {ALPHA}\n")
    print(
        "| setting | n | signal share | deff planned / estimated | power predicted "
        "| power simulated (99 % band of the prediction) |"
    )
    print("|---|---|---|---|---|---|")
    for i, setting in enumerate(POWER_SETTINGS):
        r = run_power(setting, trials, seed + i)
        low, high = band(trials, r["predicted"])
        flag = "" if low <= r["simulated"] <= high else " *"
        print(
            f"| {r['setting']} | {r['n']} | {r['share']:.2f} | {r['planned deff']:.2f} / "
            f"{r['deff']:.2f} | {r['predicted']:.3f} | {r['simulated']:.3f}{flag} "
            f"([{low:.3f}, {high:.3f}]) |"
        )


def design_table(trials: int, seed: int) -> None:
    low, high = band(trials)
    print(
        f"alpha = {ALPHA}, {trials:,} trials per setting (seed {seed}); 99% band of "
        f"a Type I of {ALPHA}: [{low:.4f}, {high:.4f}]\n"
    )
    print(
        "| setting | n | deff (weighting x clustering) | raw clustering | bias naive / design "
        "| GOF Type I naive / design | homogeneity Type I naive / design "
        "| coverage mean (min) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for i, setting in enumerate(SETTINGS):
        r = run(setting, trials, seed + i)
        print(
            f"| {r['setting']} | {r['n']} | {r['deff']:.2f} ({r['weighting']:.2f} x "
            f"{r['clustering']:.2f}) | {r['raw clustering']:.1f} | {r['naive bias']:.3f} / "
            f"{r['design bias']:.3f} | {r['naive GOF']:.3f} / {r['design GOF']:.3f} | "
            f"{r['naive homogeneity']:.3f} / {r['design homogeneity']:.3f} | "
            f"{r['coverage']:.3f} ({r['coverage min']:.3f}) |"
        )


if __name__ == "__main__":
    sys.exit(main())
