"""Post-stratification to known population counts (survey-design-and-monitoring spec D.2).

The post-strata are the domains of the design cells (a public variable: age band, region), and
the post-stratified estimate is ``sum_p (N_p / N) pi_hat_p``, the domains' Hajek means weighted
by their known population shares: R ``survey``'s ``postStratify`` followed by ``svymean``. Its
linearized variance is the design variance of the residuals from the post-strata's own means
([Deville1992]), and replicates recompute it per replicate, which repeats the
calibration; both come from the cells.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.stats.design.cells import DesignCells
from aggregator.stats.design.estimate import mean, mean_jacobian
from aggregator.stats.design.intervals import ReportShare, design_intervals
from aggregator.stats.design.options import (
    DEFAULT_INTERVAL,
    DEFAULT_REPLICATES,
    DEFAULT_VARIANCE,
)
from aggregator.stats.design.variance import covariance, degrees_of_freedom


@dataclass(frozen=True)
class PostStratified:
    """The post-stratified estimate (k,), its design covariance and degrees of freedom, the
    number of reports ``n`` and the channel ``share`` to the reports' share (intervals)."""

    estimate: np.ndarray
    covariance: np.ndarray
    degrees_of_freedom: int
    variance_method: str
    n: int
    share: ReportShare | None

    @property
    def standard_error(self) -> np.ndarray:
        return np.sqrt(np.diag(self.covariance))

    def intervals(
        self, confidence: float = 0.95, method: str = DEFAULT_INTERVAL
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per category (low, high) by ``method`` (``options.INTERVALS``): inside [0, 1] unless
        "wald", estimate -/+ t quantile (design degrees of freedom) x SE."""
        return design_intervals(
            self.estimate,
            self.standard_error,
            self.degrees_of_freedom,
            self.n,
            self.share,
            confidence,
            method,
        )


def post_stratified_estimate(
    cells: DesignCells,
    population: np.ndarray,
    method: str = DEFAULT_VARIANCE,
    replicates: int = DEFAULT_REPLICATES,
    seed: int = 0,
    *,
    share: ReportShare | None = None,
) -> PostStratified:
    """Post-stratify the domains of ``cells`` to ``population`` (known counts, or shares, one
    per domain). ``share``: the mechanism's ``intervals.report_share``, for intervals by
    Korn-Graubard or logit (None: the t interval cut to [0, 1])."""
    groups, k = cells.total.shape[1:]
    population = np.asarray(population, dtype=float)
    if population.shape != (groups,) or not np.all(np.isfinite(population)):
        raise InvalidInputError(
            f"population must give {groups} finite counts, one per post-stratum"
        )
    if not np.all(population > 0):
        raise InvalidInputError("every post-stratum needs a positive population count")
    if np.any(cells.count.sum(axis=0) < 1):
        raise InsufficientDataError("a post-stratum has no reports to carry its population")
    shares = population / population.sum()
    combine = np.kron(shares, np.eye(k))

    def theta(s: np.ndarray) -> np.ndarray:
        return combine @ mean(s, k)

    def jacobian(s: np.ndarray) -> np.ndarray:
        return combine @ mean_jacobian(s, k)

    sums = cells.columns().sum(axis=0)
    cov = covariance(cells, theta, jacobian, method, replicates, seed)
    df = degrees_of_freedom(cells, method)
    return PostStratified(theta(sums), cov, df, method, cells.n, share)
