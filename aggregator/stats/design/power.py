"""Power and sample size of the design-based (Rao-Scott) tests under a planned design effect
(survey-design-and-monitoring spec D.3, D.4).

The test a design runs is the quadratic form ``X2 = n h^T Sigma0^-1 h`` of ``design_tests`` (the
efficient form in the mechanism's SRS covariance P0, for every mechanism). If the design
multiplies the variance of h by a mean generalized design effect ``deff``, the first-order
corrected ``X2 / deff`` is noncentral chi-square(df) with noncentrality ``nu / deff`` ([Rao1981]),
nu the SRS noncentrality: the design costs a factor ``deff`` in reports. With ``design_df`` (PSUs
minus strata) the F form ``X2 / (deff df) ~ F(df, df d)`` is referred to the noncentral F instead.

Local noise dilutes only the clustering part (survey-design-and-monitoring spec D.4): for
answers whose cluster design effect is ``clustering`` (1 + ICC (m - 1) for clusters of m) and
weights with Kish's effect ``weighting`` (1 + CV(w)^2), the reports' design effect is
``weighting * (1 + (clustering - 1) * s)``, s the answers' share of the contrasts' SRS variance
(``signal_share``: the mean eigenvalue of ``Sigma0^-1 Sigma_signal``, Sigma_signal the covariance
of the one-hot answer). A design effect measured on privatized reports (``DesignEstimate``'s
``deff_model``) is given as ``total`` and applied as it is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import linalg, optimize, stats

from aggregator.errors import InvalidInputError
from aggregator.stats.channel import is_grouped
from aggregator.stats.design.cells import srs_covariance
from aggregator.stats.validate import check_distribution
from client.mechanisms import Mechanism

MAX_REPORTS = 10**12  # beyond this no design is plannable


@dataclass(frozen=True)
class DesignEffect:
    """A planned design: the answers' raw ``clustering`` effect and Kish's ``weighting`` effect,
    or ``total``, a design effect of privatized reports given as it is (then the other two are
    ignored)."""

    clustering: float = 1.0
    weighting: float = 1.0
    total: float | None = None

    def __post_init__(self) -> None:
        for name in ("clustering", "weighting", "total"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise InvalidInputError(f"design effect {name} must be a positive number")

    def privatized(self, share: float) -> float:
        """The reports' design effect when the answers carry ``share`` of their variance."""
        if self.total is not None:
            return self.total
        return self.weighting * (1.0 + (self.clustering - 1.0) * share)

    def header(self) -> str:
        """What a plan says first: the effect given, and which part the noise dilutes."""
        if self.total is not None:
            return f"design effect {self.total:g} of privatized reports, applied as given"
        return (
            f"raw clustering effect {self.clustering:g}, weighting effect {self.weighting:g}; "
            "local noise dilutes the clustering part per mechanism (its signal share), not the "
            "weighting"
        )

    def to_dict(self) -> dict:
        return {"clustering": self.clustering, "weighting": self.weighting, "total": self.total}

    def describe(self, share: float) -> str:
        """One line: which effect is applied and how the local noise dilutes it."""
        if self.total is not None:
            return f"design effect {self.total:.3g} (privatized, as given)"
        return (
            f"design effect {self.privatized(share):.3g} = weighting {self.weighting:.3g} x "
            f"(1 + (clustering {self.clustering:.3g} - 1) x signal share {share:.2f})"
        )


@dataclass(frozen=True)
class DesignPlan:
    """A planned design-based test: degrees of freedom, SRS noncentrality per report, the
    answers' signal share and the privatized design effect it gives."""

    df: int
    nu_per_n: float
    share: float
    deff: float

    def power(self, n: float, alpha: float = 0.05, design_df: int | None = None) -> float:
        """Power with n reports: noncentral chi-square, or noncentral F with ``design_df``."""
        lam = n * self.nu_per_n / self.deff
        if design_df is None:
            value = stats.ncx2.sf(stats.chi2.isf(alpha, self.df), self.df, lam)
        else:
            if design_df < 1:
                raise InvalidInputError("design degrees of freedom must be at least 1")
            dfd = self.df * design_df
            value = stats.ncf.sf(stats.f.isf(alpha, self.df, dfd), self.df, dfd, lam)
        return 1.0 if np.isnan(value) else float(value)

    def sample_size(self, target: float, alpha: float = 0.05, design_df: int | None = None) -> int:
        """The smallest n whose power reaches ``target``."""
        if not 0 < target < 1 or target <= alpha:
            raise InvalidInputError(f"target power must be in (alpha, 1), got {target!r}")
        if self.nu_per_n <= 0:
            raise InvalidInputError("the alternative equals the null: no n detects it")
        high = 2.0
        while self.power(high, alpha, design_df) < target:
            high *= 2
            if high > MAX_REPORTS:
                raise InvalidInputError("the target power needs more than 10^12 reports")
        n = optimize.brentq(lambda m: self.power(m, alpha, design_df) - target, 1.0, high)
        needed = max(2, math.ceil(n - 1e-9))
        return needed if self.power(needed, alpha, design_df) >= target else needed + 1


def signal_share(mechanism: Mechanism, p: np.ndarray, contrasts: np.ndarray | None = None) -> float:
    """The answers' share of the SRS variance of a test's contrasts (k x df; sum-zero by
    default) at answer distribution p: mean eigenvalue of ``Sigma0^-1 Sigma_signal``."""
    p = np.asarray(p, dtype=float)
    basis = _sum_zero(len(p)) if contrasts is None else contrasts
    sigma0 = basis.T @ srs_covariance(_check(mechanism), p) @ basis
    signal = basis.T @ (np.diag(p) - np.outer(p, p)) @ basis
    return float(np.trace(np.linalg.solve(sigma0, signal)) / basis.shape[1])


def plan_goodness_of_fit(
    mechanism: Mechanism, alternative: np.ndarray, null: np.ndarray, effect: DesignEffect
) -> DesignPlan:
    """The design-based goodness-of-fit test of ``null`` against ``alternative``."""
    k = mechanism.k
    p1 = check_distribution(alternative, k, "alternative")
    p0 = check_distribution(null, k, "null")
    basis = _sum_zero(k)
    sigma0 = basis.T @ srs_covariance(_check(mechanism), p0) @ basis
    h = basis.T @ (p1 - p0)
    share = signal_share(mechanism, p0, basis)
    return DesignPlan(k - 1, float(h @ np.linalg.solve(sigma0, h)), share, effect.privatized(share))


def plan_independence(
    mechanism: Mechanism, alternative: np.ndarray, shape: tuple[int, int], effect: DesignEffect
) -> DesignPlan:
    """The design-based independence test of a ``shape`` table (cell (i, j) at i * columns + j):
    the log-linear interaction contrasts at the product of the alternative's margins."""
    rows, columns = shape
    p1 = check_distribution(alternative, mechanism.k, "alternative")
    if rows * columns != mechanism.k:
        raise InvalidInputError(f"shape {shape} does not match k={mechanism.k}")
    table = p1.reshape(rows, columns)
    null = np.outer(table.sum(axis=1), table.sum(axis=0)).reshape(-1)
    if np.any(null <= 0):
        raise InvalidInputError("the alternative has a row or column of probability 0")
    contrasts = _interaction(rows, columns) / null[:, None]
    h = contrasts.T @ (p1 - null)
    sigma0 = contrasts.T @ srs_covariance(_check(mechanism), null) @ contrasts
    share = signal_share(mechanism, null, contrasts)
    df = (rows - 1) * (columns - 1)
    return DesignPlan(df, float(h @ np.linalg.solve(sigma0, h)), share, effect.privatized(share))


def plan_k_sample(
    mechanism: Mechanism,
    distributions: Sequence[Sequence[float]] | np.ndarray,
    allocation: Sequence[float],
    effect: DesignEffect,
) -> DesignPlan:
    """The design-based homogeneity test of G groups whose sizes are proportional to
    ``allocation``; per report, ``nu = sum_g a_g (p_g - p_bar)^T W (p_g - p_bar)`` with W the
    efficient metric at the pooled ``p_bar`` on the sum-zero contrasts."""
    ps = np.stack([check_distribution(p, mechanism.k, "distribution") for p in distributions])
    shares = np.asarray(allocation, dtype=float)
    if len(ps) < 2 or shares.shape != (len(ps),) or not np.all(shares > 0):
        raise InvalidInputError("give two or more groups, each with a positive allocation")
    shares = shares / shares.sum()
    pooled = shares @ ps
    basis = _sum_zero(mechanism.k)
    sigma0 = basis.T @ srs_covariance(_check(mechanism), pooled) @ basis
    deviations = (ps - pooled) @ basis
    nu = float(np.einsum("gi,gi,g->", deviations, np.linalg.solve(sigma0, deviations.T).T, shares))
    share = signal_share(mechanism, pooled, basis)
    df = (len(ps) - 1) * (mechanism.k - 1)
    return DesignPlan(df, nu, share, effect.privatized(share))


def _check(mechanism: Mechanism) -> Mechanism:
    if not isinstance(mechanism, Mechanism) or is_grouped(mechanism):
        raise InvalidInputError(
            "a design-based test needs a mechanism whose reports each estimate the one-hot "
            "answer (not public-coin one-bit reports)"
        )
    return mechanism


def _sum_zero(k: int) -> np.ndarray:
    """(k, k - 1) orthonormal columns orthogonal to the all-ones vector."""
    return linalg.null_space(np.ones((1, k)))


def _interaction(rows: int, columns: int) -> np.ndarray:
    """(rc, (r-1)(c-1)) orthonormal columns orthogonal to the row and column indicators."""
    return np.kron(_sum_zero(rows), _sum_zero(columns))
