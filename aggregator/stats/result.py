"""One frozen result type for every test, shaped like SciPy's results."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class TestResult:
    """Outcome of a local chi-square test.

    Unpacks to ``(statistic, pvalue)`` like ``scipy.stats.chisquare``. ``dof`` is None for Monte
    Carlo and bootstrap tests. An ``inconclusive`` result (a cell-count rule failed) never
    rejects and carries ``pvalue = 1.0``; ``reason`` says why.
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

    def __iter__(self) -> Iterator[float]:
        yield self.statistic
        yield self.pvalue

    def summary(self) -> str:
        """A short human-readable report."""
        if self.inconclusive:
            decision = f"inconclusive ({self.reason}); H0 not rejected"
        else:
            decision = "reject H0" if self.reject else "do not reject H0"
        dof = "Monte Carlo" if self.dof is None else f"dof = {self.dof}"
        return "\n".join(
            [
                f"{self.method} [{self.mechanism}]",
                f"  n = {self.n}, statistic = {self.statistic:.4f}, {dof}",
                f"  p-value = {self.pvalue:.4g} at alpha = {self.alpha:g}: {decision}",
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
            "expected": np.asarray(self.expected).tolist(),
            "observed": np.asarray(self.observed).tolist(),
        }
