"""Unbiased frequency estimates with closed-form standard errors and confidence intervals."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats.channel import (
    debiased_histogram,
    extra_variance,
    is_randomized_response,
    project_simplex,
)
from aggregator.stats.validate import check_histogram


@dataclass(frozen=True)
class Estimate:
    """Unbiased estimate of the true answer distribution.

    ``frequencies`` may be negative or exceed 1 (that is what unbiased means); ``projected()``
    is the separate, optional projection onto the probability simplex.
    """

    frequencies: np.ndarray
    standard_errors: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    confidence: float
    n: int
    covariance: np.ndarray = field(repr=False)
    mechanism: str = ""

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
            "projected": self.projected().tolist(),
        }

    def summary(self, labels: list[str] | None = None) -> str:
        """A readable table, one row per category (labelled by index unless ``labels``)."""
        names = [str(j) for j in range(self.frequencies.size)] if labels is None else labels
        width = max(8, *(len(name) for name in names))
        level = f"{100 * self.confidence:g}% CI"
        lines = [
            f"estimate [{self.mechanism}], n = {self.n}",
            f"  {'category':<{width}}  estimate    s.e.   {level}",
        ]
        rows = zip(
            names, self.frequencies, self.standard_errors, self.ci_low, self.ci_high, strict=True
        )
        for name, f, se, lo, hi in rows:
            lines.append(f"  {name:<{width}}  {f:8.4f}  {se:6.4f}   [{lo:.4f}, {hi:.4f}]")
        return "\n".join(lines)


def estimate_covariance(hist: Histogram) -> np.ndarray:
    """Closed-form covariance of the de-biased estimate, with plug-in probabilities.

    Randomized response: (Diag q - q q^T) / (n a1^2) with q = counts / n (spec 1.3).
    Others: (Diag p - p p^T + b I) / n with p the estimate clipped to [0, 1] (spec 1.1, 1.2, 1.4).
    """
    mech, n = hist.mechanism, hist.n
    if is_randomized_response(mech):
        q = hist.values / n
        return (np.diag(q) - np.outer(q, q)) / (n * mech.slope**2)
    p = np.clip(debiased_histogram(hist), 0.0, 1.0)
    return (np.diag(p) - np.outer(p, p) + extra_variance(mech) * np.eye(mech.k)) / n


def estimate(hist: Histogram, confidence: float = 0.95) -> Estimate:
    """Unbiased frequencies, standard errors and normal-approximation confidence intervals."""
    hist = check_histogram(hist)
    if not 0 < confidence < 1:
        raise InvalidInputError(f"confidence must be in (0, 1), got {confidence!r}")
    freqs = debiased_histogram(hist)
    cov = estimate_covariance(hist)
    se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    z = float(stats.norm.isf((1 - confidence) / 2))
    return Estimate(
        frequencies=freqs,
        standard_errors=se,
        ci_low=freqs - z * se,
        ci_high=freqs + z * se,
        confidence=float(confidence),
        n=hist.n,
        covariance=cov,
        mechanism=hist.mechanism.describe(),
    )
