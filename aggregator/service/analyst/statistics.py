"""The statistics the Analyst's Estimate, GoodnessOfFit, Independence and TwoSample run, as typed
module-level functions of positional arguments: the analysis executor sends one by name (it
pickles as its qualified name) to a worker process, which calls it with its arguments.

Each imports its statistic when it runs, on the analysis threads or in a worker process: SciPy
would add about a second to every start of ``serve`` and stall the event loop if imported there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from aggregator.histogram import Histogram
    from aggregator.stats.estimate import Estimate
    from aggregator.stats.result import TestResult


def estimate(hist: Histogram, confidence: float) -> Estimate:
    """aggregator.stats.estimate's estimate of ``hist`` at ``confidence``."""
    from aggregator.stats.estimate import estimate as estimated

    return estimated(hist, confidence)


def goodness_of_fit(
    hist: Histogram,
    p0: np.ndarray,
    alpha: float,
    method: str | None,
    calibration: str,
    seed: int | None,
) -> TestResult:
    """aggregator.stats.gof's goodness-of-fit test of ``hist`` against ``p0``."""
    from aggregator.stats.gof import goodness_of_fit as tested

    return tested(hist, p0, alpha, method, calibration=calibration, rng=seed)


def independence(
    hist: Histogram,
    shape: tuple[int, int] | None,
    alpha: float,
    method: str | None,
    calibration: str,
    seed: int | None,
) -> TestResult:
    """aggregator.stats.composite's independence test of the two attributes of ``hist``."""
    from aggregator.stats.composite import independence as tested

    return tested(hist, shape, alpha, method, calibration=calibration, rng=seed)


def two_sample(
    hist_a: Histogram, hist_b: Histogram, alpha: float, calibration: str, seed: int | None
) -> TestResult:
    """aggregator.stats.two_sample's test that ``hist_a`` and ``hist_b`` share a distribution."""
    from aggregator.stats.two_sample import two_sample as tested

    return tested(hist_a, hist_b, alpha, calibration=calibration, rng=seed)
