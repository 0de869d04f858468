"""Simulation studies of a test's rejection rate (Type I error and power), for validation.

Histograms are drawn with the mechanism's exact aggregate sampler (``simulate_histogram``), or
through the per-user randomizers when ``per_user=True``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from aggregator.histogram import Histogram
from aggregator.stats.composite import independence
from aggregator.stats.gof import goodness_of_fit
from aggregator.stats.identity import raptor_test
from aggregator.stats.k_sample import k_sample
from aggregator.stats.result import TestResult
from aggregator.stats.two_sample import two_sample
from client.mechanisms import (
    FlipComponents,
    GaussianNoise,
    LaplaceNoise,
    Mechanism,
    RandomizedResponse,
)

TestRunner = Callable[[Histogram, np.random.Generator], TestResult]


@dataclass(frozen=True)
class RejectionRate:
    """How often a test rejected in ``trials`` simulated studies."""

    rejections: int
    trials: int

    @property
    def rate(self) -> float:
        return self.rejections / self.trials

    @property
    def standard_error(self) -> float:
        return math.sqrt(max(self.rate * (1 - self.rate), 1e-12) / self.trials)

    def within_band(self, alpha: float, level: float = 0.99) -> bool:
        """Is the count inside the central ``level`` binomial band around ``alpha``?"""
        low, high = stats.binom.interval(level, self.trials, alpha)
        return bool(low <= self.rejections <= high)

    def close_to(self, target: float, points: float = 0.03, standard_errors: float = 3.0) -> bool:
        """Within ``points`` (absolute) or ``standard_errors`` s.e. of ``target``."""
        se = math.sqrt(max(target * (1 - target), 1e-12) / self.trials)
        return abs(self.rate - target) <= max(points, standard_errors * se)


def draw_histogram(
    mechanism: Mechanism,
    p: np.ndarray,
    n: int,
    rng: np.random.Generator,
    per_user: bool = False,
) -> Histogram:
    """One simulated study: n answers iid from p, randomized, aggregated."""
    if per_user:
        answers = rng.choice(mechanism.k, size=n, p=p)
        return Histogram.from_reports(mechanism, mechanism.simulate(answers, rng))
    return Histogram(mechanism, n, mechanism.simulate_histogram(n, p, rng))


def rejection_rate(
    mechanism: Mechanism,
    p: np.ndarray,
    n: int,
    run_test: TestRunner,
    trials: int,
    seed: int,
    per_user: bool = False,
) -> RejectionRate:
    """Rejections of ``run_test`` over ``trials`` independent studies with true distribution p."""
    rng = np.random.default_rng(seed)
    rejections = 0
    for _ in range(trials):
        hist = draw_histogram(mechanism, p, n, rng, per_user)
        rejections += bool(run_test(hist, rng).reject)
    return RejectionRate(rejections, trials)


MechanismFactory = Callable[[int, float], Mechanism]

#: The goodness-of-fit tests compared in the validation tables: label -> (mechanism at (k, eps),
#: method). Gaussian noise runs at rho = eps^2 / 2, as in the source's comparisons.
GOF_TESTS: dict[str, tuple[MechanismFactory, str]] = {
    "LocalGOF (RR)": (lambda k, eps: RandomizedResponse(k, eps), "pearson"),
    "Gauss proj": (lambda k, eps: GaussianNoise(k, eps * eps / 2), "projected"),
    "Gauss nonproj": (lambda k, eps: GaussianNoise(k, eps * eps / 2), "nonprojected"),
    "Gauss T (Imhof)": (lambda k, eps: GaussianNoise(k, eps * eps / 2), "imhof"),
    "Laplace MC": (lambda k, eps: LaplaceNoise(k, eps), "monte-carlo"),
    "MFC T_FC": (lambda k, eps: FlipComponents(k, eps), "projected"),
}

#: The independence tests compared in the validation tables.
INDEPENDENCE_TESTS: dict[str, tuple[MechanismFactory, str]] = {
    "LocalGeneral (RR)": (lambda k, eps: RandomizedResponse(k, eps), "min-chi-square"),
    "Gauss proj": (lambda k, eps: GaussianNoise(k, eps * eps / 2), "projected"),
    "Laplace bootstrap": (lambda k, eps: LaplaceNoise(k, eps), "bootstrap"),
    "MFC proj": (lambda k, eps: FlipComponents(k, eps), "projected"),
}


def gof_runner(
    p0: np.ndarray, method: str, n_draws: int = 999, calibration: str = "auto"
) -> TestRunner:
    """A TestRunner for goodness of fit against p0."""
    return lambda hist, rng: goodness_of_fit(
        hist, p0, method=method, calibration=calibration, rng=rng, n_draws=n_draws
    )


def independence_runner(
    shape: tuple[int, int], method: str, n_draws: int = 199, calibration: str = "auto"
) -> TestRunner:
    """A TestRunner for independence of an r x c table."""
    return lambda hist, rng: independence(
        hist, shape, method=method, calibration=calibration, rng=rng, n_draws=n_draws
    )


def zipf(k: int, exponent: float = 1.0) -> np.ndarray:
    """Zipf's law on k categories: p_j proportional to 1 / j^exponent."""
    weights = 1.0 / np.arange(1, k + 1) ** exponent
    return weights / weights.sum()


def geometric(k: int, ratio: float) -> np.ndarray:
    """p_j proportional to ratio^j: a long thin tail (ratio 0.9 at k = 64: last cell ~1e-4)."""
    weights = ratio ** np.arange(k)
    return weights / weights.sum()


#: Skewed independent tables of the validation (issue 11): rows x columns marginals.
SKEWED_TABLES: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {
    (5, 4): (np.array([0.5, 0.25, 0.15, 0.07, 0.03]), np.array([0.55, 0.25, 0.15, 0.05])),
    (2, 10): (np.array([0.8, 0.2]), zipf(10)),
}


def skewed_table(shape: tuple[int, int]) -> np.ndarray:
    """The flattened product distribution of ``SKEWED_TABLES[shape]``."""
    rows, cols = SKEWED_TABLES[shape]
    return np.outer(rows, cols).ravel()


def two_sample_rate(
    mechanism: Mechanism,
    p_a: np.ndarray,
    p_b: np.ndarray,
    sizes: tuple[int, int],
    trials: int,
    seed: int,
    calibration: str = "auto",
    n_draws: int = 199,
) -> RejectionRate:
    """Rejections of ``two_sample`` over ``trials`` studies: group A of ``sizes[0]`` answers
    from ``p_a``, group B of ``sizes[1]`` from ``p_b`` (p_a = p_b for Type I)."""
    rng = np.random.default_rng(seed)
    rejections = 0
    for _ in range(trials):
        hist_a = draw_histogram(mechanism, p_a, sizes[0], rng)
        hist_b = draw_histogram(mechanism, p_b, sizes[1], rng)
        result = two_sample(hist_a, hist_b, calibration=calibration, rng=rng, n_draws=n_draws)
        rejections += bool(result.reject)
    return RejectionRate(rejections, trials)


def k_sample_rate(
    mechanism: Mechanism,
    distributions: Sequence[np.ndarray],
    sizes: Sequence[int],
    trials: int,
    seed: int,
    calibration: str = "auto",
    n_draws: int = 199,
) -> RejectionRate:
    """Rejections of ``k_sample`` over ``trials`` studies: group g of ``sizes[g]`` answers from
    ``distributions[g]`` (all equal for Type I)."""
    rng = np.random.default_rng(seed)
    rejections = 0
    for _ in range(trials):
        hists = [
            draw_histogram(mechanism, p, n, rng) for p, n in zip(distributions, sizes, strict=True)
        ]
        result = k_sample(hists, calibration=calibration, rng=rng, n_draws=n_draws)
        rejections += bool(result.reject)
    return RejectionRate(rejections, trials)


def simulate_raptor(
    k: int, epsilon: float, groups: int, n: int, p: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One RAPTOR study ([Acharya2019Test]) with the law of the large-domain spec §2: public random
    halves S_l of [k], n devices assigned to the L groups uniformly, each reporting 1{x in S_l} XOR
    Bern(1 / (1 + e^eps)). Returns (bit_sums, group_sizes, subset_masks) for ``raptor_test``."""
    masks = np.zeros((groups, k), dtype=bool)
    for row in masks:
        row[rng.permutation(k)[: k // 2]] = True
    sizes = rng.multinomial(n, np.full(groups, 1 / groups))
    keep = 1 / (1 + math.exp(-epsilon))
    sums = rng.binomial(sizes, (1 - keep) + (2 * keep - 1) * (masks @ p))
    return sums, sizes, masks


def raptor_rate(
    k: int,
    epsilon: float,
    groups: int,
    n: int,
    p: np.ndarray,
    p0: np.ndarray,
    trials: int,
    seed: int,
    n_draws: int = 199,
) -> RejectionRate:
    """Rejections of ``raptor_test`` of H0 p0 over ``trials`` RAPTOR studies drawn from p."""
    rng = np.random.default_rng(seed)
    rejections = 0
    for _ in range(trials):
        sums, sizes, masks = simulate_raptor(k, epsilon, groups, n, p, rng)
        result = raptor_test(sums, sizes, masks, p0, epsilon, rng=rng, n_draws=n_draws)
        rejections += bool(result.reject)
    return RejectionRate(rejections, trials)
