"""Design-based (Hajek) estimates of a distribution from locally private reports, their
covariance, and design effects split into clustering and weighting
(survey-design-and-monitoring spec D.2, D.4).

``pi_hat_g = T_g / W_g`` per domain g, T_g the weighted sum of the reports' unbiased
contributions and W_g the sum of their weights: R ``survey``'s ``svymean`` applied to the
contributions, so the local noise is inside the covariance automatically.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aggregator.errors import InsufficientDataError
from aggregator.stats.channel import project_simplex
from aggregator.stats.design.cells import DesignCells, srs_covariance
from aggregator.stats.design.intervals import ReportShare, design_intervals, report_share
from aggregator.stats.design.options import (
    DEFAULT_INTERVAL,
    DEFAULT_REPLICATES,
    DEFAULT_SMALL_SAMPLE,
    DEFAULT_VARIANCE,
)
from aggregator.stats.design.small_sample import check_small_sample
from aggregator.stats.design.variance import covariance, degrees_of_freedom, t_degrees_of_freedom
from client.mechanisms import Mechanism


@dataclass(frozen=True)
class DesignEstimate:
    """Per domain g (rows) and category j (columns): the Hajek estimate, the estimated total,
    their design covariances (flattened g-major), and the design effects.

    ``deff``: design variance over the variance of a with-replacement simple random sample of
    the same size, estimated from the data (R's ``deff = "replace"``); ``deff_model``: the same
    with the mechanism's SRS covariance P0 at the estimate (survey-design-and-monitoring spec
    D.2), which ``weighting_effect`` ([Kish1965]: 1 + CV(w)^2) times ``clustering_effect`` makes up
    (survey-design-and-monitoring spec D.4).
    ``raw_clustering_effect`` is the clustering effect the answers would have without local
    noise, ``1 + (clustering - 1) / signal_share``, ``signal_share`` the answer's share of one
    contribution's variance. A design effect is NaN for a category without variance (answers
    seen directly, a category never or always chosen): it is undefined there.
    ``share``: how the estimate maps to the share of reports supporting a category, for the
    intervals (aggregator/stats/design/intervals.py; None for additive noise).
    ``degrees_of_freedom`` is the design's (R's degf); ``interval_df`` (G, k) the t reference's
    of each estimate by ``small_sample`` (``options.SMALL_SAMPLE``): R's degf "as-r", else
    Bell-McCaffrey's, which with the bias-reduced linearization makes ``covariance``.
    """

    estimate: np.ndarray
    covariance: np.ndarray
    total: np.ndarray
    total_covariance: np.ndarray
    counts: np.ndarray
    population: np.ndarray
    degrees_of_freedom: int
    variance_method: str
    deff: np.ndarray
    deff_model: np.ndarray
    weighting_effect: np.ndarray
    clustering_effect: np.ndarray
    signal_share: np.ndarray
    raw_clustering_effect: np.ndarray
    share: ReportShare | None
    small_sample: str
    interval_df: np.ndarray

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    @property
    def standard_error(self) -> np.ndarray:
        return np.sqrt(np.diag(self.covariance)).reshape(self.estimate.shape)

    def intervals(
        self, confidence: float = 0.95, method: str = DEFAULT_INTERVAL
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per-cell (low, high) by ``method`` (``options.INTERVALS``): inside [0, 1] unless
        "wald", estimate -/+ t quantile (``interval_df``) x SE."""
        return design_intervals(
            self.estimate,
            self.standard_error,
            self.interval_df,
            self.counts[:, None],
            self.share,
            confidence,
            method,
        )


def design_estimate(
    cells: DesignCells,
    mechanism: Mechanism | None,
    method: str = DEFAULT_VARIANCE,
    replicates: int = DEFAULT_REPLICATES,
    seed: int = 0,
    small_sample: str = DEFAULT_SMALL_SAMPLE,
) -> DesignEstimate:
    """Hajek estimates and design effects from the cells (``mechanism`` None: answers seen
    directly). ``method``: linearization, jackknife or bootstrap (``replicates``, ``seed``);
    ``small_sample``: "bell-mccaffrey" or "as-r" (``options.SMALL_SAMPLE``)."""
    check_small_sample(small_sample)
    counts = cells.count.sum(axis=0)
    if np.any(counts < 2):
        raise InsufficientDataError("every domain needs at least 2 reports")
    groups, k = cells.total.shape[1:]
    sums = cells.columns().sum(axis=0)
    estimate = mean(sums, k).reshape(groups, k)
    options = (method, replicates, seed)
    cov = covariance(
        cells,
        lambda s: mean(s, k),
        lambda s: mean_jacobian(s, k),
        *options,
        small_sample=small_sample,
    )
    total_cov = covariance(
        cells,
        lambda s: total(s, k),
        lambda s: total_jacobian(s, k),
        *options,
        small_sample=small_sample,
        ratio=False,
    )
    interval_df = t_degrees_of_freedom(
        cells, lambda s: mean_jacobian(s, k), method, small_sample
    ).reshape(groups, k)
    variance = np.diag(cov).reshape(groups, k)
    weight = cells.weight.sum(axis=0)
    spread = (
        cells.square.sum(axis=0)
        - 2 * estimate * cells.total.sum(axis=0)
        + estimate**2 * weight[:, None]
    ) / weight[:, None]
    fitted = project_simplex(estimate)
    p0 = np.stack([np.diag(srs_covariance(mechanism, p)) for p in fitted])
    kish = counts * cells.weight_square.sum(axis=0) / weight**2
    # A category without variance (seen directly and never or always chosen) has no design
    # effect: NaN there, by definition rather than by accident.
    deff = _ratio(variance * (counts[:, None] - 1), spread)
    deff_model = _ratio(variance * counts[:, None], p0)
    clustering = deff_model / kish[:, None]
    share = _ratio(fitted * (1 - fitted), p0)
    raw = _ratio(clustering - 1, share) + 1
    return DesignEstimate(
        estimate,
        cov,
        cells.total.sum(axis=0),
        total_cov,
        counts,
        weight,
        degrees_of_freedom(cells, method),
        method,
        deff,
        deff_model,
        kish,
        clustering,
        share,
        raw,
        report_share(mechanism),
        small_sample,
        interval_df,
    )


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, NaN where the denominator is not positive."""
    out = np.full(np.broadcast(numerator, denominator).shape, np.nan)
    return np.divide(numerator, denominator, out=out, where=denominator > 1e-300)


def mean(sums: np.ndarray, k: int) -> np.ndarray:
    """Hajek means T_g / W_g, flattened g-major, from column sums (G (k + 1),)."""
    blocks = sums.reshape(-1, k + 1)
    return (blocks[:, :k] / blocks[:, k:]).reshape(-1)


def mean_jacobian(sums: np.ndarray, k: int) -> np.ndarray:
    blocks = sums.reshape(-1, k + 1)
    groups = len(blocks)
    jac = np.zeros((groups * k, groups * (k + 1)))
    for g, block in enumerate(blocks):
        rows = slice(g * k, (g + 1) * k)
        jac[rows, g * (k + 1) : g * (k + 1) + k] = np.eye(k) / block[k]
        jac[rows, g * (k + 1) + k] = -block[:k] / block[k] ** 2
    return jac


def total(sums: np.ndarray, k: int) -> np.ndarray:
    """Estimated totals T_g, flattened g-major."""
    return sums.reshape(-1, k + 1)[:, :k].reshape(-1)


def total_jacobian(sums: np.ndarray, k: int) -> np.ndarray:
    groups = len(sums) // (k + 1)
    jac = np.zeros((groups * k, groups * (k + 1)))
    for g in range(groups):
        jac[g * k : (g + 1) * k, g * (k + 1) : g * (k + 1) + k] = np.eye(k)
    return jac
