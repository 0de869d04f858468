"""Intervals inside [0, 1] for design-based estimates of shares (docs/designs.md, "Intervals").

A count-type mechanism's report supports category j (a randomized-response report equal to j, a
set bit, a supporting hash) with probability ``q_j = offset + slope p_j``, so the de-biased
Hajek estimate is exactly ``p_hat = (q_hat - offset) / slope``, ``q_hat`` the design-weighted
share of reports supporting j: a plain survey proportion of 0/1 values, always in [0, 1], with
s.e. ``slope x s.e.(p_hat)``. Its interval is made as R's ``svyciprop`` makes one for a
proportion, then mapped back through the channel:

* ``beta`` (Korn-Graubard, [Korn1998]): a Clopper-Pearson interval at the effective sample size
  ``n* = q_hat (1 - q_hat) / var(q_hat) x (t_{n-1} / t_df)^2``;
* ``logit``: ``expit(logit q_hat -/+ t_df s.e.(q_hat) / (q_hat (1 - q_hat)))``.

Answers seen directly (no mechanism) are the case offset 0, slope 1: the intervals are
``svyciprop``'s. Where ``q_hat`` is 0 or 1 or has no variance, n* is the number of reports (a
Clopper-Pearson interval; the logit interval takes it too). The mapped interval may reach past
0 or 1 (the local noise puts ``q_hat`` anywhere in [0, 1], while p only spans [offset, offset +
slope]); it is cut to [0, 1], which cannot lower its coverage since p lies there, and where it
reaches a boundary widened by the likelihood-ratio interval of a normal mean restricted to
[0, 1] (``stats.simplex.inside_unit``), so it always holds valid values even when the unbiased
estimate lies outside [0, 1]. Additive noise has no share of reports: its interval, and any
interval without a ``ReportShare``, is the t interval cut and widened the same way.
``wald`` is the t interval itself, as R's ``svymean``, unbounded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from aggregator.errors import InvalidInputError
from aggregator.stats.channel import check_signal
from aggregator.stats.design.options import AS_R, BETA, DEFAULT_INTERVAL, INTERVALS, WALD
from aggregator.stats.simplex import inside_unit
from client.mechanisms import Mechanism


@dataclass(frozen=True)
class ReportShare:
    """The channel ``q = offset + slope p`` from a share p to the share of reports supporting
    it (offset 0, slope 1: answers seen directly)."""

    offset: float
    slope: float


def report_share(mechanism: Mechanism | None) -> ReportShare | None:
    """The channel of ``mechanism`` (None: answers seen directly), or None where reports are not
    0/1 per category (additive noise)."""
    if mechanism is None:
        return ReportShare(0.0, 1.0)
    if mechanism.statistic_kind not in ("counts", "bits", "support"):
        return None
    return ReportShare(float(mechanism.offset), check_signal(mechanism))


def check_interval(method: object) -> str:
    if method not in INTERVALS:
        raise InvalidInputError(f"design interval must be one of {', '.join(INTERVALS)}")
    return str(method)


def interval_name(
    method: str, share: ReportShare | None, degrees_of_freedom: float, small_sample: str
) -> str:
    """What ``design_intervals`` did, for answers: e.g. "Korn-Graubard, t(17)" as R, or
    "Korn-Graubard, t(6.4, Bell-McCaffrey)" with the small-sample correction."""
    t = (
        f"t({degrees_of_freedom:.0f})"
        if small_sample == AS_R
        else f"t({degrees_of_freedom:.1f}, Bell-McCaffrey)"
    )
    if method == WALD:
        return f"Wald, {t}"
    if share is None:
        return f"Wald, {t}, cut to [0, 1]"
    name = "Korn-Graubard" if method == BETA else "logit"
    direct = share.offset == 0.0 and share.slope == 1.0
    return f"{name}, {t}" + ("" if direct else ", on the reports' share, inside [0, 1]")


def design_intervals(
    estimate: np.ndarray,
    standard_error: np.ndarray,
    degrees_of_freedom: float | np.ndarray,
    n: np.ndarray | int,
    share: ReportShare | None,
    confidence: float = 0.95,
    method: str = BETA,
) -> tuple[np.ndarray, np.ndarray]:
    """Per cell (low, high) of the unbiased estimates, their s.e., the degrees of freedom of
    their t reference and the reports ``n`` behind each (broadcast), by ``method`` (module
    docstring)."""
    check_interval(method)
    p = np.asarray(estimate, dtype=float)
    se = np.broadcast_to(np.asarray(standard_error, dtype=float), p.shape)
    df = np.broadcast_to(np.asarray(degrees_of_freedom, dtype=float), p.shape)
    alpha = 1 - confidence
    t = _t(1 - alpha / 2, df)
    half = np.where(se > 0, t * se, 0.0)
    if method == WALD:
        return p - half, p + half
    if share is None:
        low, high = p - half, p + half
    else:
        q = share.offset + share.slope * p
        se_q = share.slope * se
        counts = np.broadcast_to(np.asarray(n, dtype=float), p.shape)
        q_low, q_high = (_beta if method == BETA else _logit)(q, se_q, counts, df, alpha)
        low, high = (q_low - share.offset) / share.slope, (q_high - share.offset) / share.slope
    variance = np.where(se > 0, se**2, 0.0)
    return inside_unit(low, high, p, np.where(np.isfinite(t), t, 0.0), variance, variance)


def _t(level: float, degrees_of_freedom: np.ndarray) -> np.ndarray:
    """The t quantiles, NaN without a degree of freedom (a census: no variance to scale)."""
    df = np.asarray(degrees_of_freedom, dtype=float)
    return np.where(df >= 1, stats.t.ppf(level, np.maximum(df, 1.0)), np.nan)


def _informative(q: np.ndarray, se_q: np.ndarray) -> np.ndarray:
    """Where the share is strictly inside (0, 1) with a variance: n* and logit are defined."""
    return (q > 0) & (q < 1) & (se_q > 0)


def _effective_n(
    q: np.ndarray, se_q: np.ndarray, n: np.ndarray, degrees_of_freedom: np.ndarray, alpha: float
) -> np.ndarray:
    """Korn-Graubard's n*, as R's svyciprop(method = "beta"); n where it is undefined."""
    inside = _informative(q, se_q)
    design_t = _t(alpha / 2, degrees_of_freedom)
    ratio = (stats.t.ppf(alpha / 2, np.maximum(n - 1, 1)) / design_t) ** 2
    ratio = np.where(np.isfinite(ratio), ratio, 1.0)
    safe = np.where(inside, se_q, 1.0)
    return np.where(inside, q * (1 - q) / safe**2 * ratio, n)


def _beta(
    q: np.ndarray, se_q: np.ndarray, n: np.ndarray, degrees_of_freedom: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """Clopper-Pearson at n* successes n* q (q cut to [0, 1] first: a share of reports)."""
    q = np.clip(q, 0.0, 1.0)
    m = _effective_n(q, se_q, n, degrees_of_freedom, alpha)
    x = m * q
    with np.errstate(invalid="ignore", divide="ignore"):
        low = np.where(x > 0, special.betaincinv(x, m - x + 1, alpha / 2), 0.0)
        high = np.where(m - x > 0, special.betaincinv(x + 1, m - x, 1 - alpha / 2), 1.0)
    return low, high


def _logit(
    q: np.ndarray, se_q: np.ndarray, n: np.ndarray, degrees_of_freedom: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """expit(logit q -/+ t s.e. / (q (1 - q))) where defined, else the beta interval at n."""
    inside = _informative(q, se_q)
    fallback = _beta(q, se_q, n, degrees_of_freedom, alpha)
    safe = np.where(inside, q, 0.5)
    spread = _t(1 - alpha / 2, degrees_of_freedom) * se_q / (safe * (1 - safe))
    centre = special.logit(safe)
    low = np.where(inside, special.expit(centre - spread), fallback[0])
    high = np.where(inside, special.expit(centre + spread), fallback[1])
    return low, high


class CalibratedIntervals:
    """The standard errors and intervals of a calibrated (post-stratified or raked) estimate,
    from its ``estimate``, ``covariance``, ``interval_df``, ``n`` and ``share``."""

    estimate: np.ndarray
    covariance: np.ndarray
    interval_df: float
    n: int
    share: ReportShare | None

    @property
    def standard_error(self) -> np.ndarray:
        return np.sqrt(np.diag(self.covariance))

    def intervals(
        self, confidence: float = 0.95, method: str = DEFAULT_INTERVAL
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per category (low, high) by ``method`` (``options.INTERVALS``): inside [0, 1] unless
        "wald", estimate -/+ t quantile (``interval_df``) x SE."""
        return design_intervals(
            self.estimate,
            self.standard_error,
            self.interval_df,
            self.n,
            self.share,
            confidence,
            method,
        )
