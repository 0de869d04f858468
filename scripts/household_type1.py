"""Type I error of the goodness-of-fit test when several members of one household answer
(privacy-accounting spec D.3), with and without the guard (one respondent per household).

H0 is true in every setting: a binary question, uniform null, k-ary randomized response. Members
of a household answer alike (fully shared attribute, or the same answer with a given
probability), each randomizes on their own device, and the product's test
(``aggregator.stats.goodness_of_fit``) runs either on every member's report (no guard) or on one
report per household (the guard: a household_shared question). Two references: "independent"
is the exact Type I of the test on as many independent reports (a binomial sum: Pearson's
statistic on two counts is discrete, 0.0544 at n = 500 rather than 0.05), and "predicted" is the
design-effect approximation ``P(chi2_1 > q / deff)``, ``deff = 1 + (m - 1) icc``, with the
reports' intra-household correlation ``icc = corr(answers) (2 p_keep - 1)^2``.

Usage: python scripts/household_type1.py [--quick] [--trials N] [--seed S]
(full: 20,000 trials per setting, about 2 minutes on one core; --quick: 2,000).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aggregator.histogram import Histogram
from aggregator.stats import goodness_of_fit
from client.mechanisms import RandomizedResponse

ALPHA = 0.05
P0 = np.array([0.5, 0.5])


@dataclass(frozen=True)
class Setting:
    """Households of ``members`` whose answers agree with the first member's with probability
    ``same`` (1: a fully shared attribute); ``guard``: one report per household is tested."""

    label: str
    households: int
    members: int
    same: float
    epsilon: float
    guard: bool

    @property
    def reports(self) -> int:
        return self.households * (1 if self.guard else self.members)

    def predicted(self) -> float:
        """The design-effect approximation of the test's Type I error."""
        keep = math.exp(self.epsilon) / (math.exp(self.epsilon) + 1)
        icc = (2 * self.same - 1) * (2 * keep - 1) ** 2
        deff = 1 + (self.reports // self.households - 1) * icc
        return float(stats.chi2.sf(stats.chi2.isf(ALPHA, 1) / deff, 1))


SETTINGS = (
    Setting("independent devices", 1000, 1, 1.0, 1.0, False),
    Setting("households of 2, same answer w.p. 0.8, no guard", 500, 2, 0.8, 1.0, False),
    Setting("households of 2, same answer w.p. 0.8, guard", 500, 2, 0.8, 1.0, True),
    Setting("households of 4, fully shared, no guard", 500, 4, 1.0, 3.0, False),
    Setting("households of 4, fully shared, guard", 500, 4, 1.0, 3.0, True),
)


def answers(setting: Setting, rng: np.random.Generator) -> np.ndarray:
    """True answers (households x members) under H0: every member's answer is uniform."""
    first = rng.integers(0, 2, size=(setting.households, 1))
    agree = rng.random((setting.households, setting.members)) < setting.same
    agree[:, 0] = True
    return np.where(agree, first, 1 - first)


def rejects(setting: Setting, rng: np.random.Generator) -> bool:
    """One survey under H0: randomize every member's answer, test the reports the guard lets
    through (all of them without it), return whether the test rejected at ALPHA."""
    mechanism = RandomizedResponse(2, setting.epsilon)
    reports = mechanism.simulate(answers(setting, rng).ravel(), rng)
    reports = reports.reshape(setting.households, setting.members)
    tested = reports[:, 0] if setting.guard else reports.ravel()
    counts = np.bincount(tested, minlength=2)
    hist = Histogram(mechanism, int(tested.size), counts)
    return goodness_of_fit(hist, P0, ALPHA).reject


def type1(setting: Setting, trials: int, seed: int) -> float:
    """The rejection rate over ``trials`` surveys."""
    rng = np.random.default_rng(seed)
    return sum(rejects(setting, rng) for _ in range(trials)) / trials


def independent_level(n: int) -> float:
    """The exact Type I error of the test on ``n`` independent reports under the uniform
    binary null: the privatized count is Binomial(n, 1/2) and Pearson's statistic is
    ``(2 c - n)^2 / n``."""
    counts = np.arange(n + 1)
    rejected = (2 * counts - n) ** 2 / n > stats.chi2.isf(ALPHA, 1)
    return float(stats.binom.pmf(counts[rejected], n, 0.5).sum())


def band(trials: int, level: float, z: float = 3.29) -> tuple[float, float]:
    """The 99.9% binomial band of a rejection rate whose true value is ``level``."""
    half = z * math.sqrt(level * (1 - level) / trials)
    return level - half, level + half


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 trials per setting")
    parser.add_argument("--trials", type=int, help="trials per setting (default 20,000)")
    parser.add_argument("--seed", type=int, default=16)
    args = parser.parse_args(argv)
    trials = args.trials or (2000 if args.quick else 20000)
    started = time.perf_counter()
    print(f"Type I error at alpha = {ALPHA}, {trials:,} trials per setting (seed {args.seed}).\n")
    print(
        "| setting | epsilon | reports tested | Type I | 99.9% band if independent "
        "| independent, exact | predicted (design effect) |"
    )
    print("|---|---|---|---|---|---|---|")
    for number, setting in enumerate(SETTINGS):
        rate = type1(setting, trials, args.seed + number)
        level = independent_level(setting.reports)
        low, high = band(trials, level)
        mark = "" if low <= rate <= high else " *"
        print(
            f"| {setting.label} | {setting.epsilon:g} | {setting.reports:,} | {rate:.4f}{mark} | "
            f"[{low:.4f}, {high:.4f}] | {level:.4f} | {setting.predicted():.4f} |"
        )
    print("\n`*`: outside the band of a test on independent reports.")
    print(f"\n{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
