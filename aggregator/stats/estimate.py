"""Unbiased frequency estimates with closed-form standard errors and confidence intervals
(``stats.intervals``)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from html import escape

import numpy as np

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.presentation.numbers import share
from aggregator.presentation.tables import data_frame, html_table
from aggregator.stats.channel import (
    debiased_histogram,
    extra_variance,
    is_randomized_response,
    is_support,
    project_simplex,
)
from aggregator.stats.intervals import (
    confidence_intervals,
    interval_method,
    simultaneous_intervals,
)
from aggregator.stats.validate import (
    check_finite_statistic,
    check_histogram,
    check_per_category,
)


@dataclass(frozen=True)
class Estimate:
    """Unbiased estimate of the true answer distribution.

    ``frequencies`` may be negative or exceed 1 (that is what unbiased means); ``outside`` flags
    those cells and ``projected()`` is the separate, optional projection onto the probability
    simplex. ``ci_low``/``ci_high`` are per-coordinate intervals of at least nominal coverage
    (``interval_method``; docs/calibration.md); ``simultaneous_low``/``simultaneous_high``, when
    asked for, cover all k coordinates at once.
    """

    frequencies: np.ndarray
    standard_errors: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    confidence: float
    n: int
    covariance: np.ndarray = field(repr=False)
    mechanism: str = ""
    interval_method: str = ""
    simultaneous_low: np.ndarray | None = None
    simultaneous_high: np.ndarray | None = None
    labels: tuple[str, ...] | None = None  # category names for display (``with_labels``)

    def with_labels(self, labels: Sequence[str]) -> Estimate:
        """The same estimate with its categories named (tables, notebooks, data frames)."""
        if len(labels) != self.frequencies.size:
            raise InvalidInputError(
                f"labels must name each of the {self.frequencies.size} categories, "
                f"got {len(labels)}"
            )
        return replace(self, labels=tuple(str(label) for label in labels))

    def category_names(self) -> list[str]:
        """The categories' labels, else their indices as text."""
        if self.labels is not None:
            return list(self.labels)
        return [str(j) for j in range(self.frequencies.size)]

    def to_frame(self):
        """A pandas DataFrame, one row per category (the ``[frame]`` extra); the simultaneous
        intervals are columns when they were computed."""
        columns: dict[str, list] = {
            "estimate": self.frequencies.tolist(),
            "std_error": self.standard_errors.tolist(),
            "ci_low": self.ci_low.tolist(),
            "ci_high": self.ci_high.tolist(),
            "projected": self.projected().tolist(),
            "outside_unit_interval": self.outside.tolist(),
        }
        if self.simultaneous_low is not None and self.simultaneous_high is not None:
            columns["simultaneous_low"] = self.simultaneous_low.tolist()
            columns["simultaneous_high"] = self.simultaneous_high.tolist()
        attrs = {
            "mechanism": self.mechanism,
            "n": self.n,
            "confidence": self.confidence,
            "interval_method": self.interval_method,
        }
        return data_frame(columns, self.category_names(), "category", attrs)

    def _repr_html_(self) -> str:
        """A notebook table: category, estimate (flagged outside [0, 1]), s.e., interval,
        projected."""
        level = f"{100 * self.confidence:g}%"
        head = (
            f"<p><b>estimate</b> [{escape(self.mechanism)}], n = {self.n:,}; "
            f"{level} intervals: {escape(self.interval_method or 'normal')}</p>"
        )
        projected = self.projected()
        rows = [
            [
                name,
                share(self.frequencies[j]) + (" \u25b2" if self.outside[j] else ""),
                share(self.standard_errors[j]),
                f"[{share(self.ci_low[j])}, {share(self.ci_high[j])}]",
                share(projected[j]),
            ]
            for j, name in enumerate(self.category_names())
        ]
        headers = ["category", "estimate", "s.e.", f"{level} interval", "projected"]
        note = (
            "<p><small>\u25b2 outside [0, 1]: unbiased, not a share; read the projected value."
            "</small></p>"
            if self.outside.any()
            else ""
        )
        return head + html_table(headers, rows) + note

    @property
    def outside(self) -> np.ndarray:
        """Cells whose unbiased estimate lies outside [0, 1]."""
        return (self.frequencies < 0) | (self.frequencies > 1)

    def projected(self) -> np.ndarray:
        """Euclidean projection of the estimate onto the probability simplex (biased)."""
        return project_simplex(self.frequencies[None, :])[0]

    def to_dict(self) -> dict:
        return {
            "mechanism": self.mechanism,
            "n": self.n,
            "confidence": self.confidence,
            "frequencies": self.frequencies.tolist(),
            "standard_errors": self.standard_errors.tolist(),
            "ci_low": self.ci_low.tolist(),
            "ci_high": self.ci_high.tolist(),
            "interval_method": self.interval_method,
            "outside_unit_interval": self.outside.tolist(),
            "projected": self.projected().tolist(),
            "simultaneous_low": _listed(self.simultaneous_low),
            "simultaneous_high": _listed(self.simultaneous_high),
            # so marginals and differences of frequencies get intervals too
            "covariance": self.covariance.tolist(),
        }

    def summary(self, labels: list[str] | None = None) -> str:
        """A readable table, one row per category (named by ``labels``, else by the estimate's
        own labels, else by index)."""
        names = list(labels) if labels is not None else self.category_names()
        width = max(8, *(len(name) for name in names))
        level = f"{100 * self.confidence:g}% CI"
        lines = [
            f"estimate [{self.mechanism}], n = {self.n}; intervals: {self.interval_method}",
            f"  {'category':<{width}}  estimate    s.e.   {level}",
        ]
        projected = self.projected()
        rows = zip(
            names, self.frequencies, self.standard_errors, self.ci_low, self.ci_high, strict=True
        )
        for j, (name, f, se, lo, hi) in enumerate(rows):
            line = f"  {name:<{width}}  {share(f):>8}  {share(se):>6}   [{share(lo)}, {share(hi)}]"
            if self.outside[j]:
                line += f"  * outside [0, 1]; projected {share(projected[j])}"
            lines.append(line)
        if self.simultaneous_low is not None and self.simultaneous_high is not None:
            lines.append(f"  simultaneous {level} over all {self.frequencies.size} categories:")
            for name, lo, hi in zip(
                names, self.simultaneous_low, self.simultaneous_high, strict=True
            ):
                lines.append(f"  {name:<{width}}  [{share(lo)}, {share(hi)}]")
        return "\n".join(lines)


def estimate_covariance(hist: Histogram) -> np.ndarray:
    """Closed-form covariance of the de-biased estimate, with plug-in probabilities.

    Randomized response: (Diag q - q q^T) / (n a1^2) with q = counts / n
    (local-chi-square-tests spec §1.3).
    Support counts: the mechanism's exact report covariance at the estimate clipped to [0, 1] and
    renormalised, over n c1^2.
    Others: (Diag p - p p^T + b I) / n with p the estimate clipped to [0, 1]
    (local-chi-square-tests spec §1.1, §1.2, §1.4).
    """
    mech, n = hist.mechanism, hist.n
    if is_randomized_response(mech):
        q = hist.values / n
        return (np.diag(q) - np.outer(q, q)) / (n * mech.slope**2)
    if is_support(mech):
        p = np.clip(debiased_histogram(hist), 0.0, 1.0)
        p = p / p.sum() if p.sum() > 0 else np.full(mech.k, 1 / mech.k)
        return mech.report_covariance(p) / (n * mech.slope**2)
    p = np.clip(debiased_histogram(hist), 0.0, 1.0)
    return (np.diag(p) - np.outer(p, p) + extra_variance(mech) * np.eye(mech.k)) / n


def estimate(hist: Histogram, confidence: float = 0.95, *, simultaneous: bool = False) -> Estimate:
    """Unbiased frequencies, standard errors and per-coordinate confidence intervals of at least
    nominal coverage; with ``simultaneous``, also Bonferroni intervals over all k categories.
    Public-coin one-bit reports are refused (InvalidInputError): they carry no per-category
    information.

    Parameters
    ----------
    hist : Histogram
        The sufficient statistic of the reports.
    confidence : float, default 0.95
        Coverage of each interval, in (0, 1).
    simultaneous : bool, default False
        Also compute intervals that cover all k frequencies at once with probability at least
        ``confidence``.

    Returns
    -------
    Estimate
        ``frequencies`` (unbiased, so possibly negative or above 1), ``standard_errors``,
        ``ci_low``/``ci_high``, ``covariance`` and, with ``simultaneous``,
        ``simultaneous_low``/``simultaneous_high``; ``projected()`` is the optional projection
        onto the probability simplex.

    Raises
    ------
    InvalidInputError
        ``confidence`` outside (0, 1), a histogram of public-coin one-bit reports, or values too
        large to square in floating point.
    InsufficientDataError
        A histogram of zero reports.

    References
    ----------
    local-chi-square-tests spec §1.1-§1.4 (the de-biased estimates and their covariances, from
    [Rogers2017] Ch. 8); [Clopper1934] (the exact binomial intervals mapped through the channel);
    docs/calibration.md.

    Examples
    --------
    >>> from aggregator.histogram import Histogram
    >>> from aggregator.stats import estimate
    >>> from client.mechanisms import RandomizedResponse
    >>> hist = Histogram(RandomizedResponse(k=4, epsilon=1.0), 2000, [621, 492, 473, 414])
    >>> est = estimate(hist)
    >>> est.frequencies.round(3).tolist()
    [0.451, 0.237, 0.205, 0.107]
    >>> est.standard_errors.round(3).tolist()
    [0.034, 0.032, 0.032, 0.03]
    >>> bool(((est.ci_low < est.frequencies) & (est.frequencies < est.ci_high)).all())
    True
    >>> round(float(est.frequencies.sum()), 6)
    1.0
    """
    hist = check_per_category(check_histogram(hist), "estimate")
    if isinstance(confidence, bool) or not isinstance(confidence, numbers.Real):
        raise InvalidInputError(f"confidence must be a number in (0, 1), got {confidence!r}")
    if not 0 < confidence < 1:
        raise InvalidInputError(f"confidence must be in (0, 1), got {confidence!r}")
    freqs = debiased_histogram(hist)
    check_finite_statistic(float(np.sum(freqs * freqs)))
    cov = estimate_covariance(hist)
    se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    low, high = confidence_intervals(hist, confidence)
    both = simultaneous_intervals(hist, confidence) if simultaneous else (None, None)
    return Estimate(
        frequencies=freqs,
        standard_errors=se,
        ci_low=low,
        ci_high=high,
        confidence=float(confidence),
        n=hist.n,
        covariance=cov,
        mechanism=hist.mechanism.describe(),
        interval_method=interval_method(hist),
        simultaneous_low=both[0],
        simultaneous_high=both[1],
        labels=hist.labels,
    )


def _listed(values: np.ndarray | None) -> list | None:
    return None if values is None else values.tolist()
