"""Frequency estimates with closed-form standard errors and confidence intervals
(``stats.intervals``): the unbiased estimate, or its projection onto the probability simplex
(``stats.simplex``)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
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
)
from aggregator.stats.intervals import (
    confidence_intervals,
    interval_method,
    simultaneous_intervals,
)
from aggregator.stats.simplex import (
    LABELS,
    check_estimator,
    holding,
    on_simplex,
    simplex_shift,
)
from aggregator.stats.validate import (
    check_finite_statistic,
    check_histogram,
    check_per_category,
)


@dataclass(frozen=True)
class Estimate:
    """Estimate of the true answer distribution, by the ``estimator`` it names.

    ``"unbiased"``: ``frequencies`` are the de-biased reports, which may be negative or exceed 1
    (that is what unbiased means). ``"simplex"``: ``frequencies`` are those projected onto the
    probability simplex (non-negative, summing to 1; biased, ``stats.simplex``). Either way
    ``unbiased`` holds the unbiased values, ``outside`` flags those outside [0, 1],
    ``projected()`` is their projection, and ``standard_errors``/``covariance`` are theirs.
    ``ci_low``/``ci_high`` are per-coordinate intervals inside [0, 1] of at least nominal
    coverage (``interval_method``; docs/calibration.md), which for ``"simplex"`` also hold the
    estimate; ``simultaneous_low``/``simultaneous_high``, when asked for, cover all k
    coordinates at once.
    """

    frequencies: np.ndarray
    standard_errors: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    confidence: float
    n: int
    source: Histogram = field(repr=False, compare=False)  # for ``covariance``, on demand
    mechanism: str = ""
    interval_method: str = ""
    simultaneous_low: np.ndarray | None = None
    simultaneous_high: np.ndarray | None = None
    labels: tuple[str, ...] | None = None  # category names for display (``with_labels``)
    estimator: str = "unbiased"
    unbiased: np.ndarray | None = field(default=None, repr=False)  # None: ``frequencies``

    def with_labels(self, labels: Sequence[str]) -> Estimate:
        """The same estimate with its categories named (tables, notebooks, data frames)."""
        if len(labels) != self.frequencies.size:
            raise InvalidInputError(
                f"labels must name each of the {self.frequencies.size} categories, "
                f"got {len(labels)}"
            )
        return replace(self, labels=tuple(str(label) for label in labels))

    @cached_property
    def covariance(self) -> np.ndarray:
        """The unbiased estimate's k x k covariance (``estimate_covariance``), computed when first
        asked for: at k = 2,000 it is 32 MB and most of the cost of an estimate."""
        return estimate_covariance(self.source)

    @property
    def unbiased_frequencies(self) -> np.ndarray:
        """The unbiased estimate, whichever estimator is shown."""
        return self.frequencies if self.unbiased is None else self.unbiased

    @property
    def estimator_label(self) -> str:
        """The estimator's name with what it is, for printed tables."""
        return LABELS[self.estimator]

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
            "unbiased": self.unbiased_frequencies.tolist(),
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
            "estimator": self.estimator,
        }
        return data_frame(columns, self.category_names(), "category", attrs)

    def _repr_html_(self) -> str:
        """A notebook table: category, estimate (flagged outside [0, 1]), s.e., interval,
        projected."""
        level = f"{100 * self.confidence:g}%"
        head = (
            f"<p><b>estimate</b> [{escape(self.mechanism)}], n = {self.n:,}; "
            f"estimator: {escape(self.estimator_label)}; "
            f"{level} intervals: {escape(self.interval_method or 'normal')}</p>"
        )
        if self.estimator == "simplex":
            beside, name_beside = self.unbiased_frequencies, "unbiased"
        else:
            beside, name_beside = self.projected(), "projected"
        rows = [
            [
                name,
                share(self.frequencies[j])
                + (" \u25b2" if self.outside[j] and self.estimator == "unbiased" else ""),
                share(self.standard_errors[j]),
                f"[{share(self.ci_low[j])}, {share(self.ci_high[j])}]",
                share(beside[j]),
            ]
            for j, name in enumerate(self.category_names())
        ]
        headers = ["category", "estimate", "s.e.", f"{level} interval", name_beside]
        note = (
            "<p><small>\u25b2 outside [0, 1]: unbiased, not a share; read the projected value."
            "</small></p>"
            if self.outside.any() and self.estimator == "unbiased"
            else ""
        )
        return head + html_table(headers, rows) + note

    @property
    def outside(self) -> np.ndarray:
        """Cells whose unbiased estimate lies outside [0, 1]."""
        unbiased = self.unbiased_frequencies
        return (unbiased < 0) | (unbiased > 1)

    def projected(self) -> np.ndarray:
        """Euclidean projection of the unbiased estimate onto the probability simplex (biased;
        the ``"simplex"`` estimator's frequencies)."""
        return on_simplex(self.unbiased_frequencies)

    def shift(self) -> float:
        """What the projection took from every positive cell (``stats.simplex.simplex_shift``)."""
        return simplex_shift(self.unbiased_frequencies, self.projected())

    def simplex_note(self) -> str:
        """The line printed under a simplex estimate: how it was made from the unbiased one."""
        return SIMPLEX_NOTE.format(shift=f"{-self.shift():+.4f}")

    def to_dict(self) -> dict:
        return {
            "mechanism": self.mechanism,
            "n": self.n,
            "confidence": self.confidence,
            "estimator": self.estimator,
            "frequencies": self.frequencies.tolist(),
            "unbiased": self.unbiased_frequencies.tolist(),
            "standard_errors": self.standard_errors.tolist(),
            "ci_low": self.ci_low.tolist(),
            "ci_high": self.ci_high.tolist(),
            "interval_method": self.interval_method,
            "outside_unit_interval": self.outside.tolist(),
            "projected": self.projected().tolist(),
            "simultaneous_low": _listed(self.simultaneous_low),
            "simultaneous_high": _listed(self.simultaneous_high),
            # of the unbiased estimate: so marginals and differences get intervals too
            "covariance": self.covariance.tolist(),
        }

    def summary(self, labels: list[str] | None = None) -> str:
        """A readable table, one row per category (named by ``labels``, else by the estimate's
        own labels, else by index)."""
        names = list(labels) if labels is not None else self.category_names()
        width = max(8, *(len(name) for name in names))
        level = f"{100 * self.confidence:g}% CI"
        simplex = self.estimator == "simplex"
        lines = [
            f"estimate [{self.mechanism}], n = {self.n}; estimator: {self.estimator_label}; "
            f"intervals: {self.interval_method}",
            f"  {'category':<{width}}  estimate    s.e.   {level}",
        ]
        projected, unbiased = self.projected(), self.unbiased_frequencies
        rows = zip(
            names, self.frequencies, self.standard_errors, self.ci_low, self.ci_high, strict=True
        )
        for j, (name, f, se, lo, hi) in enumerate(rows):
            line = f"  {name:<{width}}  {share(f):>8}  {share(se):>6}   [{share(lo)}, {share(hi)}]"
            if self.outside[j]:
                line += (
                    f"  * unbiased {share(unbiased[j])}"
                    if simplex
                    else f"  * outside [0, 1]; projected {share(projected[j])}"
                )
            lines.append(line)
        if simplex:
            lines.append(f"  {self.simplex_note()}")
        if self.simultaneous_low is not None and self.simultaneous_high is not None:
            lines.append(f"  simultaneous {level} over all {self.frequencies.size} categories:")
            for name, lo, hi in zip(
                names, self.simultaneous_low, self.simultaneous_high, strict=True
            ):
                lines.append(f"  {name:<{width}}  [{share(lo)}, {share(hi)}]")
        return "\n".join(lines)


SIMPLEX_NOTE = (
    "simplex: the unbiased estimate shifted by {shift} in every positive cell, the rest set to "
    "0 (sums to 1; biased); s.e. are the unbiased estimate's"
)


def estimate_variances(hist: Histogram) -> np.ndarray:
    """The diagonal of ``estimate_covariance`` in O(k): each cell's count is binomial (variance
    m (1 - m) per report, m its mean) or a count plus noise (p (1 - p) + b)."""
    mech, n = hist.mechanism, hist.n
    if is_randomized_response(mech):
        q = hist.values / n
        return q * (1 - q) / (n * mech.slope**2)
    p = np.clip(debiased_histogram(hist), 0.0, 1.0)
    if is_support(mech):
        p = p / p.sum() if p.sum() > 0 else np.full(mech.k, 1 / mech.k)
        m = mech.report_mean(p)
        return m * (1 - m) / (n * mech.slope**2)
    return (p * (1 - p) + extra_variance(mech)) / n


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


def estimate(
    hist: Histogram,
    confidence: float = 0.95,
    *,
    simultaneous: bool = False,
    estimator: str = "unbiased",
) -> Estimate:
    """Frequencies (unbiased, or projected onto the probability simplex), standard errors and
    per-coordinate confidence intervals inside [0, 1] of at least nominal coverage; with
    ``simultaneous``, also Bonferroni intervals over all k categories. Public-coin one-bit
    reports are refused (InvalidInputError): they carry no per-category information.

    Parameters
    ----------
    hist : Histogram
        The sufficient statistic of the reports.
    confidence : float, default 0.95
        Coverage of each interval, in (0, 1).
    simultaneous : bool, default False
        Also compute intervals that cover all k frequencies at once with probability at least
        ``confidence``.
    estimator : {"unbiased", "simplex"}, default "unbiased"
        ``"unbiased"``: the de-biased reports (sums, differences and averages of them stay
        unbiased; the tests use them). ``"simplex"``: their Euclidean projection onto the
        simplex (Norm-Sub; never farther from the truth than the unbiased estimate; biased),
        for reading off shares. The intervals are the same, widened to hold the estimate.

    Returns
    -------
    Estimate
        ``frequencies`` (by ``estimator``; unbiased ones may be negative or above 1),
        ``unbiased``, ``estimator``, ``standard_errors``,
        ``ci_low``/``ci_high``, ``covariance`` and, with ``simultaneous``,
        ``simultaneous_low``/``simultaneous_high``; ``projected()`` is the optional projection
        onto the probability simplex.

    Raises
    ------
    InvalidInputError
        ``confidence`` outside (0, 1), an unknown ``estimator``, a histogram of public-coin
        one-bit reports, or values too large to square in floating point.
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

    On the simplex, a category no one chose shows 0 and an interval of valid values only:

    >>> sparse = Histogram(RandomizedResponse(k=4, epsilon=1.0), 200, [90, 30, 30, 50])
    >>> unbiased = estimate(sparse)
    >>> unbiased.frequencies.round(3).tolist()
    [0.916, -0.083, -0.083, 0.25]
    >>> shown = estimate(sparse, estimator="simplex")
    >>> shown.estimator, shown.frequencies.round(3).tolist()
    ('simplex', [0.833, 0.0, 0.0, 0.167])
    >>> bool((shown.ci_low >= 0).all() and (shown.ci_high <= 1).all())
    True
    """
    hist = check_per_category(check_histogram(hist), "estimate")
    if isinstance(confidence, bool) or not isinstance(confidence, numbers.Real):
        raise InvalidInputError(f"confidence must be a number in (0, 1), got {confidence!r}")
    if not 0 < confidence < 1:
        raise InvalidInputError(f"confidence must be in (0, 1), got {confidence!r}")
    estimator = check_estimator(estimator)
    freqs = debiased_histogram(hist)
    check_finite_statistic(float(np.sum(freqs * freqs)))
    se = np.sqrt(np.clip(estimate_variances(hist), 0.0, None))
    low, high = confidence_intervals(hist, confidence)
    both = simultaneous_intervals(hist, confidence) if simultaneous else (None, None)
    shown = freqs
    if estimator == "simplex":
        shown = on_simplex(freqs)
        low, high = holding(low, high, shown)
        if both[0] is not None and both[1] is not None:
            both = holding(both[0], both[1], shown)
    return Estimate(
        frequencies=shown,
        standard_errors=se,
        ci_low=low,
        ci_high=high,
        confidence=float(confidence),
        n=hist.n,
        source=hist,
        mechanism=hist.mechanism.describe(),
        interval_method=interval_method(hist),
        simultaneous_low=both[0],
        simultaneous_high=both[1],
        labels=hist.labels,
        estimator=estimator,
        unbiased=freqs,
    )


def _listed(values: np.ndarray | None) -> list | None:
    return None if values is None else values.tolist()
