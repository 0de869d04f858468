"""How a test's p-value is calibrated: the asymptotic chi-square law, or a Monte Carlo null.

``"auto"`` keeps the asymptotic p-value only where documented diagnostics (docs/calibration.md)
say the chi-square limit is accurate, and otherwise simulates the null:

* **effective counts**: every cell's expected privatized count is at least
  ``MIN_EFFECTIVE_COUNT`` (randomized response: ``n q_j``; flip components and the support-count
  mechanisms: the smaller of the expected ones and zeros of bit j; additive noise:
  ``n (p_j + b)``, the cell's variance in count units, so noise that dominates a small cell
  makes it Gaussian);
* **signal-to-noise of the fitted null** (composite nulls only): every fitted cell lies at least
  ``MIN_BOUNDARY_SE`` standard errors of its de-biased estimate away from zero, so the fit is
  not at, or within noise of, the boundary of the simplex where the chi-square limit fails.

The support-count mechanisms' composite tests are always bootstrapped (their limit is a weighted
chi-square with fitted weights), and so is Hadamard response's goodness of fit above
``MAX_SUPPORT_IMHOF`` categories, where its weights (the eigenvalues of a dense k x k matrix,
O(k^3): 0.7 s at k = 2,000 on an idle core, 10 s when the cores are shared) cost more than the
exact simulation (999 draws through one fast Walsh-Hadamard transform each, O(K log K): 0.7 s at
k = 2,000, n = 60,000); docs/performance.md. The exchangeable mechanisms (OUE, subset selection,
local hashing) evaluate their weighted law in O(k) at any k (``low_rank_law.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aggregator.errors import InvalidInputError
from aggregator.stats.channel import (
    extra_variance,
    is_binomial,
    is_randomized_response,
    is_support,
)
from client.mechanisms import Mechanism

CALIBRATIONS = ("auto", "asymptotic", "monte-carlo")
MIN_EFFECTIVE_COUNT = 5.0
MIN_BOUNDARY_SE = 3.0
MAX_SUPPORT_IMHOF = 1024


@dataclass(frozen=True)
class Choice:
    """The calibration a test uses and why."""

    calibration: str  # "asymptotic" or "monte-carlo"
    reason: str

    @property
    def simulated(self) -> bool:
        return self.calibration == "monte-carlo"


def check_calibration(calibration: object) -> str:
    if calibration not in CALIBRATIONS:
        raise InvalidInputError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
    return str(calibration)


def effective_counts(mech: Mechanism, n: int, p: np.ndarray) -> np.ndarray:
    """Per-cell expected privatized count under p (see the module docstring)."""
    p = np.clip(np.asarray(p, dtype=float), 0.0, 1.0)
    q = mech.report_mean(p)
    if is_randomized_response(mech):
        return n * q
    if is_binomial(mech):  # flip components, support counts: 0/1 cells
        return n * np.minimum(q, 1 - q)
    return n * (p + extra_variance(mech))


def per_report_variance(mech: Mechanism, p: np.ndarray) -> np.ndarray:
    """Variance of one report's de-biased value in each cell, under p."""
    p = np.clip(np.asarray(p, dtype=float), 0.0, 1.0)
    if is_binomial(mech):
        q = mech.report_mean(p)
        return q * (1 - q) / mech.slope**2
    return p * (1 - p) + extra_variance(mech)


def choose(
    calibration: str,
    mech: Mechanism,
    n: int,
    null: np.ndarray,
    *,
    composite: bool,
    planning: bool = False,
) -> Choice:
    """Resolve ``calibration`` for a test of ``null`` (p0, or the fitted null) with n reports.

    ``planning=True`` applies only the validity diagnostics: where they pass, the simulated null
    and the chi-square law give the same power, so the rules that simulate for another reason
    (Laplace noise always; Hadamard response's goodness of fit above ``MAX_SUPPORT_IMHOF`` for
    cost) would only make a plan slower.
    """
    if calibration == "asymptotic":
        return Choice("asymptotic", "requested")
    if calibration == "monte-carlo":
        return Choice("monte-carlo", "requested")
    if not planning and mech.simulated_null is not None:
        return Choice("monte-carlo", mech.simulated_null)
    if is_support(mech) and composite:
        return Choice("monte-carlo", "support counts: a composite null is always bootstrapped")
    if (
        not planning
        and is_support(mech)
        and not mech.exchangeable_pairs
        and mech.k > MAX_SUPPORT_IMHOF
    ):
        return Choice("monte-carlo", f"{mech.name}: k > {MAX_SUPPORT_IMHOF}, simulated")
    counts = effective_counts(mech, n, null)
    if counts.min() < MIN_EFFECTIVE_COUNT:
        return Choice(
            "monte-carlo",
            f"an expected privatized count is {counts.min():.3g} < {MIN_EFFECTIVE_COUNT:g}",
        )
    if composite:
        se = np.sqrt(per_report_variance(mech, null) / n)
        distance = float(np.min(np.clip(null, 0.0, None) / se))
        if distance < MIN_BOUNDARY_SE:
            return Choice(
                "monte-carlo",
                f"the fitted null is {distance:.2f} s.e. from the simplex boundary "
                f"(< {MIN_BOUNDARY_SE:g})",
            )
    return Choice("asymptotic", "diagnostics passed")


def simulate_null(
    mech: Mechanism, n: int, p: np.ndarray, rng: np.random.Generator, size: int
) -> np.ndarray:
    """``size`` exact draws of the sufficient statistic under p (clipped to >= 0 and
    renormalised, so rounding at the boundary of the simplex never reaches the sampler)."""
    p = np.clip(np.asarray(p, dtype=float), 0.0, None)
    try:
        return mech.simulate_histogram(n, p / p.sum(), rng, size=size)
    except ValueError as exc:  # NumPy's samplers refuse parameters this extreme
        raise InvalidInputError(
            f"calibration: the null of {mech.describe()} with n = {n} cannot be simulated "
            f"({exc}); use calibration='asymptotic'"
        ) from None
