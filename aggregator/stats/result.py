"""One frozen result type for every test, shaped like SciPy's results."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from html import escape
from typing import TypedDict

import numpy as np

from aggregator.presentation.numbers import fixed
from aggregator.presentation.tables import data_frame


class ResultFields(TypedDict):
    """The ``TestResult`` fields that describe a test and its data, fixed before the test chooses
    its calibration: a test builds them once and passes them to each of its results as
    ``**fields``."""

    method: str
    n: int
    alpha: float
    expected: np.ndarray
    observed: np.ndarray
    mechanism: str


class CalibratedFields(ResultFields):
    """``ResultFields`` with the calibration the test chose and why."""

    calibration: str
    calibration_reason: str


@dataclass(frozen=True)
class TestResult:
    """Outcome of a local chi-square test.

    Unpacks to ``(statistic, pvalue)`` like ``scipy.stats.chisquare``. ``dof`` is None for Monte
    Carlo and bootstrap tests, whose ``n_draws`` is the number of null draws m; ``calibration``
    says which null was used ("asymptotic" or "monte-carlo") and ``calibration_reason`` why.
    An ``inconclusive`` result (a cell-count rule failed) never rejects and carries
    ``pvalue = 1.0``; ``reason`` says why. On a conclusive result a non-empty ``reason`` notes
    what the test left out (e.g. uninformative public groups of a two-sample test).
    """

    __test__ = False  # not a pytest test class

    statistic: float
    pvalue: float
    dof: int | None
    method: str
    n: int
    alpha: float
    reject: bool
    expected: np.ndarray = field(repr=False)
    observed: np.ndarray = field(repr=False)
    mechanism: str = ""
    inconclusive: bool = False
    reason: str = ""
    calibration: str = "asymptotic"
    calibration_reason: str = ""
    n_draws: int | None = None

    @property
    def at_floor(self) -> bool:
        """A Monte Carlo p-value at its smallest possible value 1 / (m + 1)."""
        return self.n_draws is not None and self.pvalue <= 1 / (self.n_draws + 1) + 1e-15

    def pvalue_text(self) -> str:
        """The p-value as it should be read: ``p <= 1/(m+1)`` at the Monte Carlo floor."""
        if self.n_draws is not None and self.at_floor:
            return f"p <= {1 / (self.n_draws + 1):.4g} = 1/(m+1), m = {self.n_draws}"
        return f"p = {self.pvalue:.4g}"

    def to_frame(self):
        """A one-row pandas DataFrame of the test's figures (the ``[frame]`` extra); the expected
        and observed vectors stay on the result."""
        row = {
            key: value
            for key, value in self.to_dict().items()
            if key not in ("expected", "observed")
        }
        return data_frame([row])

    def _repr_html_(self) -> str:
        """The summary for a notebook: method, figures, decision and calibration."""
        if self.inconclusive:
            decision = f"inconclusive ({escape(self.reason)}); H0 not rejected"
        else:
            decision = "<b>reject H0</b>" if self.reject else "do not reject H0"
        dof = "Monte Carlo null" if self.dof is None else f"{self.dof} degrees of freedom"
        why = f" ({escape(self.calibration_reason)})" if self.calibration_reason else ""
        return (
            f"<p><b>{escape(self.method)}</b> [{escape(self.mechanism)}]<br>"
            f"n = {self.n:,}, statistic = {self.statistic:.4g}, {dof}<br>"
            f"{escape(self.pvalue_text())} at &alpha; = {self.alpha:g}: {decision}<br>"
            f"<small>calibration: {escape(self.calibration)}{why}</small></p>"
        )

    def __iter__(self) -> Iterator[float]:
        yield self.statistic
        yield self.pvalue

    def summary(self) -> str:
        """A short human-readable report."""
        if self.inconclusive:
            decision = f"inconclusive ({self.reason}); H0 not rejected"
        else:
            decision = "reject H0" if self.reject else "do not reject H0"
        if self.n_draws is not None:
            null = f"Monte Carlo null, m = {self.n_draws} draws"
        elif self.dof is None:
            null = "asymptotic null"
        else:
            null = f"dof = {self.dof}"
        why = f" ({self.calibration_reason})" if self.calibration_reason else ""
        note = [f"  note: {self.reason}"] if self.reason and not self.inconclusive else []
        return "\n".join(
            [
                f"{self.method} [{self.mechanism}]",
                f"  n = {self.n}, statistic = {fixed(self.statistic)}, {null}",
                f"  calibration: {self.calibration}{why}",
                *note,
                f"  p-value: {self.pvalue_text()} at alpha = {self.alpha:g}: {decision}",
            ]
        )

    def to_dict(self) -> dict:
        """JSON-safe representation."""
        return {
            "statistic": self.statistic,
            "pvalue": self.pvalue,
            "dof": self.dof,
            "method": self.method,
            "mechanism": self.mechanism,
            "n": self.n,
            "alpha": self.alpha,
            "reject": self.reject,
            "inconclusive": self.inconclusive,
            "reason": self.reason,
            "calibration": self.calibration,
            "calibration_reason": self.calibration_reason,
            "n_draws": self.n_draws,
            "pvalue_at_floor": self.at_floor,
            "expected": np.asarray(self.expected).tolist(),
            "observed": np.asarray(self.observed).tolist(),
        }
