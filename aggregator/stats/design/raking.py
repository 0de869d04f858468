"""Raking to several known population margins (survey-design-and-monitoring spec D.2).

The cells' domains are the joint categories of the public raking variables (row-major: with
margins of 3 and 2 categories, domain ``g = 2 a + b``), so one cell table serves
post-stratification (one margin) and raking (several). Raking multiplies every weight of a
domain by one factor, found by iterative proportional fitting of the domains' weight totals to
the margins ([Deming1940]); the raked estimate is ``sum_g r_g T_g / sum_g r_g W_g``.

Variance by linearization uses the calibration residuals of [Deville1992]: per cell
``r_g (T_hcg - b_g W_hcg) / N``, ``b_g`` the fit of the domains' means on the margin indicators
by least squares weighted by the design weights (R ``survey``'s ``calibrate(calfun =
"raking")``); replicates repeat the raking on each reweighted cell table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aggregator.errors import InsufficientDataError, InvalidInputError, LdpError
from aggregator.stats.design.cells import DesignCells
from aggregator.stats.design.intervals import CalibratedIntervals, ReportShare
from aggregator.stats.design.keys import keyed_cells
from aggregator.stats.design.options import (
    DEFAULT_REPLICATES,
    DEFAULT_SMALL_SAMPLE,
    DEFAULT_VARIANCE,
)
from aggregator.stats.design.small_sample import check_small_sample
from aggregator.stats.design.variance import covariance, degrees_of_freedom, t_degrees_of_freedom


class RakingError(LdpError):
    """Iterative proportional fitting did not reach the margins: the sample's joint categories
    cannot carry them (a structural zero), or the iteration limit is too low."""


@dataclass(frozen=True)
class FrameKeys:
    """A sampling frame, one row per public design key: stratum, PSU, weight, the key's category
    of each raking variable (``categories`` (K, M)), and optionally R-style ``fpc``."""

    strata: np.ndarray
    psus: np.ndarray
    weights: np.ndarray
    categories: np.ndarray
    fpc: np.ndarray | None = None


@dataclass(frozen=True)
class Raked(CalibratedIntervals):
    """The raked estimate (k,), its design covariance, and per domain the raking factor
    ``adjustment`` (``iterations`` sweeps over the margins to reach them); the number of
    reports ``n``, the channel ``share`` to the reports' share and the degrees of freedom
    ``interval_df`` of the intervals' t reference by ``small_sample`` (``degrees_of_freedom``:
    the design's, R's degf)."""

    estimate: np.ndarray
    covariance: np.ndarray
    degrees_of_freedom: int
    variance_method: str
    adjustment: np.ndarray
    iterations: int
    n: int
    share: ReportShare | None
    small_sample: str
    interval_df: float


def joint_domains(categories: np.ndarray, levels: Sequence[int]) -> np.ndarray:
    """(n,) domain index of each row of ``categories`` (n, M), row-major over ``levels``."""
    categories = np.asarray(categories)
    if categories.ndim != 2 or categories.shape[1] != len(levels):
        raise InvalidInputError(f"categories must have one column per margin ({len(levels)})")
    if categories.size and not np.array_equal(categories, np.round(categories)):
        raise InvalidInputError("categories must be whole category indices")
    for j, level in enumerate(levels):
        column = categories[:, j]
        if column.size and (column.min() < 0 or column.max() >= level):
            raise InvalidInputError(f"margin {j}: categories must lie in 0..{level - 1}")
    return np.ravel_multi_index(tuple(categories.T.astype(np.int64)), tuple(levels))


def raking_cells(
    frame: FrameKeys,
    levels: Sequence[int],
    count: np.ndarray,
    total: np.ndarray,
    square: np.ndarray,
) -> DesignCells:
    """Design cells from per-key sufficient statistics, with the joint raking categories
    (``levels``) as domains: ``count`` (K,) reports per frame key and the unweighted sums of
    their contributions ``total`` (K, k) and of their squares ``square`` (the join itself is
    design_keys.keyed_cells). A key no report came from adds no PSU to the sample."""
    count = np.asarray(count, dtype=float)
    keys = len(frame.weights)
    if count.shape != (keys,) or np.ndim(total) != 2 or np.shape(total)[0] != keys:
        raise InvalidInputError(f"per-key statistics must have {keys} rows, one per frame key")
    if np.shape(square) != np.shape(total):
        raise InvalidInputError("per-key sums of squares must match the sums")
    if not (np.all(np.isfinite(count)) and np.all(count >= 0)):
        raise InvalidInputError("per-key counts must be finite and non-negative")
    kept = count > 0
    return keyed_cells(
        np.asarray(frame.strata)[kept],
        np.asarray(frame.psus)[kept],
        np.asarray(frame.weights)[kept],
        None if frame.fpc is None else np.asarray(frame.fpc)[kept],
        count[kept],
        np.asarray(total, dtype=float)[kept],
        np.asarray(square, dtype=float)[kept],
        joint_domains(np.asarray(frame.categories)[kept], levels),
        int(np.prod(levels)),
    )


def rake(
    weight: np.ndarray,
    margins: Sequence[np.ndarray],
    tolerance: float = 1e-10,
    max_iterations: int = 1000,
) -> tuple[np.ndarray, int]:
    """Per-domain factors r (G,) such that the margins of ``r * weight`` (the domains laid out
    row-major over the margins) equal ``margins``, and the number of sweeps it took: iterative
    proportional fitting until every margin is within a relative ``tolerance``."""
    shape = tuple(len(m) for m in margins)
    table = np.asarray(weight, dtype=float).reshape(shape)
    axes = [tuple(a for a in range(len(shape)) if a != j) for j in range(len(shape))]
    for j in range(len(margins)):
        empty = np.flatnonzero(table.sum(axis=axes[j]) <= 0)
        if empty.size:
            raise InsufficientDataError(
                f"margin {j}: category {int(empty[0])} has no reports to carry its population"
            )
    factor = np.ones(shape)
    gap = np.inf
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for sweep in range(1, max_iterations + 1):
            for j, target in enumerate(margins):
                current = (table * factor).sum(axis=axes[j])
                factor *= np.expand_dims(target / current, axes[j])
            gap = max(
                np.max(np.abs((table * factor).sum(axis=axes[j]) / target - 1))
                for j, target in enumerate(margins)
            )
            if gap < tolerance:
                return factor.reshape(-1), sweep
            if not np.isfinite(gap):
                break
    raise RakingError(
        f"raking did not reach the margins within {tolerance:g} in {max_iterations} sweeps "
        f"(relative gap {gap:.3g}): a combination of categories the margins need is "
        "missing from the sample"
    )


def raked_estimate(
    cells: DesignCells,
    margins: Sequence[np.ndarray],
    method: str = DEFAULT_VARIANCE,
    replicates: int = DEFAULT_REPLICATES,
    seed: int = 0,
    tolerance: float = 1e-10,
    max_iterations: int = 1000,
    *,
    share: ReportShare | None = None,
    small_sample: str = DEFAULT_SMALL_SAMPLE,
) -> Raked:
    """Rake the cells' domains (the joint categories of the margins, row-major) to the known
    population ``margins`` (counts per category, one array per raking variable, all with the
    same total) and estimate the distribution. ``method``: linearization, jackknife or
    bootstrap; the replicates repeat the raking. ``share``: the mechanism's
    ``intervals.report_share``, for intervals by Korn-Graubard or logit (None: the t interval
    cut to [0, 1]); ``small_sample``: "bell-mccaffrey" or "as-r" (``options.SMALL_SAMPLE``)."""
    margins = _check_margins(margins, cells.total.shape[1])
    k = cells.total.shape[2]
    indicators = _margin_indicators([len(m) for m in margins])

    def factors(s: np.ndarray) -> tuple[np.ndarray, int]:
        return rake(s.reshape(-1, k + 1)[:, k], margins, tolerance, max_iterations)

    def theta(s: np.ndarray) -> np.ndarray:
        blocks = s.reshape(-1, k + 1)
        r = factors(s)[0]
        return (r @ blocks[:, :k]) / (r @ blocks[:, k])

    def jacobian(s: np.ndarray) -> np.ndarray:
        blocks = s.reshape(-1, k + 1)
        t, w = blocks[:, :k], blocks[:, k]
        r = factors(s)[0]
        population = r @ w
        means = np.divide(t, w[:, None], out=np.zeros_like(t), where=w[:, None] > 0)
        root = np.sqrt(w)[:, None]
        fit = np.linalg.lstsq(indicators * root, means * root, rcond=None)[0]
        jac = np.zeros((k, len(s)))
        for g in range(len(w)):
            jac[:, g * (k + 1) : g * (k + 1) + k] = np.eye(k) * r[g] / population
            jac[:, g * (k + 1) + k] = -r[g] * (indicators[g] @ fit) / population
        return jac

    sums = cells.columns().sum(axis=0)
    adjustment, iterations = factors(sums)
    check_small_sample(small_sample)
    cov = covariance(cells, theta, jacobian, method, replicates, seed, small_sample=small_sample)
    df = degrees_of_freedom(cells, method)
    interval_df = float(t_degrees_of_freedom(cells, jacobian, method, small_sample).min())
    return Raked(
        theta(sums),
        cov,
        df,
        method,
        adjustment,
        iterations,
        cells.n,
        share,
        small_sample,
        interval_df,
    )


def _check_margins(margins: Sequence[np.ndarray], groups: int) -> list[np.ndarray]:
    checked = [np.asarray(m, dtype=float) for m in margins]
    if not checked or any(m.ndim != 1 or len(m) < 1 for m in checked):
        raise InvalidInputError("give at least one margin: population counts per category")
    if int(np.prod([len(m) for m in checked])) != groups:
        shape = " x ".join(str(len(m)) for m in checked)
        raise InvalidInputError(
            f"the cells have {groups} domains, the margins' joint categories {shape}"
        )
    for j, m in enumerate(checked):
        if not np.all(np.isfinite(m)) or not np.all(m > 0):
            raise InvalidInputError(f"margin {j}: population counts must be finite and positive")
    totals = np.array([m.sum() for m in checked])
    if np.max(np.abs(totals / totals[0] - 1)) > 1e-9:
        raise InvalidInputError(
            "the margins must describe one population: their totals differ "
            f"({', '.join(f'{t:g}' for t in totals)})"
        )
    return checked


def _margin_indicators(levels: list[int]) -> np.ndarray:
    """(G, sum(levels)): for each domain, the one-hot of its category in every margin."""
    codes = np.stack(np.unravel_index(np.arange(int(np.prod(levels))), levels), axis=1)
    offsets = np.concatenate([[0], np.cumsum(levels)[:-1]])
    out = np.zeros((len(codes), sum(levels)))
    for j in range(len(levels)):
        out[np.arange(len(codes)), offsets[j] + codes[:, j]] = 1.0
    return out
