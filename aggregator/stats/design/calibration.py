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
from aggregator.stats.design.intervals import CalibratedIntervals, ReportShare
from aggregator.stats.design.options import (
    DEFAULT_REPLICATES,
    DEFAULT_SMALL_SAMPLE,
    DEFAULT_VARIANCE,
)
from aggregator.stats.design.small_sample import check_small_sample
from aggregator.stats.design.variance import covariance, degrees_of_freedom, t_degrees_of_freedom


@dataclass(frozen=True)
class PostStratified(CalibratedIntervals):
    """The post-stratified estimate (k,), its design covariance and degrees of freedom (R's
    degf), the number of reports ``n``, the channel ``share`` to the reports' share and the
    degrees of freedom ``interval_df`` of the intervals' t reference by ``small_sample``
    (``options.SMALL_SAMPLE``)."""

    estimate: np.ndarray
    covariance: np.ndarray
    degrees_of_freedom: int
    variance_method: str
    n: int
    share: ReportShare | None
    small_sample: str
    interval_df: float


def post_stratified_estimate(
    cells: DesignCells,
    population: np.ndarray,
    method: str = DEFAULT_VARIANCE,
    replicates: int = DEFAULT_REPLICATES,
    seed: int = 0,
    *,
    share: ReportShare | None = None,
    small_sample: str = DEFAULT_SMALL_SAMPLE,
) -> PostStratified:
    """Post-stratify the domains of ``cells`` to ``population`` (known counts, or shares, one
    per domain). ``share``: the mechanism's ``intervals.report_share``, for intervals by
    Korn-Graubard or logit (None: the t interval cut to [0, 1]); ``small_sample``:
    "bell-mccaffrey" or "as-r" (``options.SMALL_SAMPLE``)."""
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
    check_small_sample(small_sample)
    cov = covariance(cells, theta, jacobian, method, replicates, seed, small_sample=small_sample)
    df = degrees_of_freedom(cells, method)
    interval_df = float(t_degrees_of_freedom(cells, jacobian, method, small_sample).min())
    return PostStratified(theta(sums), cov, df, method, cells.n, share, small_sample, interval_df)
