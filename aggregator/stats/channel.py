"""Mechanism-specific algebra, expressed in de-biased units.

Every mechanism's average report is ``c0 + c1 * p``, so the de-biased estimate
``p_hat = (values / n - c0) / c1`` is unbiased for p. The tests are quadratic forms in
``p_hat - p`` with a metric W(p) per report:

* randomized response: ``W = a1^2 Diag(1 / (a0 + a1 p))`` (Pearson on the privatized counts);
* Gaussian, Laplace and flip components: ``Cov(p_hat) * n = S_b(p) = Diag p - p p^T + b I`` with
  b the per-report noise variance (flip components: ``b = s (1 - s) / (1 - 2 s)^2``), and
  ``W = S_b^{-1}`` or, projected onto sum-zero vectors, ``Pi S_b^{-1} Pi``.

Writing flip components this way shows that T_FC (local-chi-square-tests spec §4.8;
[Rogers2017] Thm 8.2.10-8.2.11) is the projected additive-noise statistic with
``b = A / (A - 1)^2``.

* support-count mechanisms (optimized unary encoding, Hadamard response, subset selection, local
  hashing): each count is Binomial(n, q_j), q = c0 + c1 p, and ``W = c1^2 Diag(1 / (q (1 - q)))``
  (Pearson on each count against its own binomial variance); the counts are correlated in a
  mechanism-specific way (``report_covariance``), so the null law is a weighted chi-square
  (``support_null``).
"""

from __future__ import annotations

import math

import numpy as np

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from client.mechanisms import Mechanism, RandomizedResponse

#: Bounds past which a mechanism's numbers overflow double precision in the tests: a slope of
#: 1e-10 (or noise variance of 1e20) per report would need about 1e20 reports to detect anything.
MIN_SLOPE = 1e-10
MAX_NOISE_VARIANCE = 1e20


def is_randomized_response(mechanism: Mechanism) -> bool:
    """Multinomial counts: one category per report (``statistic_kind`` "counts")."""
    return mechanism.statistic_kind == "counts"


def is_support(mechanism: Mechanism) -> bool:
    """Per-category support counts (``statistic_kind`` "support")."""
    return mechanism.statistic_kind == "support"


def is_grouped(mechanism: Mechanism) -> bool:
    """Per-group counts and bit sums, no per-category channel (``statistic_kind`` "groups")."""
    return mechanism.statistic_kind == "groups"


def is_binomial(mechanism: Mechanism) -> bool:
    """Each cell of the statistic is a count of 0/1 report cells: Binomial(n, offset + slope p)
    (randomized response, flip components, support counts)."""
    return mechanism.statistic_kind in ("counts", "bits", "support")


def extra_variance(mechanism: Mechanism) -> float:
    """b in ``n Cov(p_hat) = Diag p - p p^T + b I`` (not defined for randomized response and
    the support-count mechanisms)."""
    if is_support(mechanism):
        raise TypeError("a support-count mechanism has no additive covariance form")
    if mechanism.statistic_kind == "bits":  # flip components: the flip probability s
        s = mechanism.offset
        return s * (1 - s) / check_signal(mechanism) ** 2
    if is_randomized_response(mechanism):
        raise TypeError("randomized response has no additive covariance form")
    try:
        b = float(mechanism.noise_variance)  # type: ignore[attr-defined]
    except (ZeroDivisionError, OverflowError):
        b = math.inf
    if not b <= MAX_NOISE_VARIANCE:
        raise InvalidInputError(
            f"{_parameter(mechanism)}: {mechanism.describe()} adds noise too large to compute "
            "with (per-report variance above 1e20); use a larger privacy parameter"
        )
    return b


def check_signal(mechanism: Mechanism) -> float:
    """The channel's slope c1, which every de-biased number divides by (squared, for variances):
    an epsilon so small that it underflows carries no usable signal."""
    slope = float(mechanism.slope)
    if not slope >= MIN_SLOPE:
        raise InvalidInputError(
            f"{_parameter(mechanism)}: {mechanism.describe()} carries no usable signal (its "
            "channel's slope is below 1e-10); use a larger privacy parameter"
        )
    return slope


def _parameter(mechanism: Mechanism) -> str:
    return "epsilon" if mechanism.cost.kind == "pure" else "rho"


def debiased(values: np.ndarray, n: int, mechanism: Mechanism) -> np.ndarray:
    """Unbiased frequency estimate(s) from sufficient statistics (rows of ``values``)."""
    return (np.asarray(values, dtype=float) / n - mechanism.offset) / check_signal(mechanism)


def debiased_histogram(hist: Histogram) -> np.ndarray:
    return debiased(hist.values, hist.n, hist.mechanism)


def rough_distribution(values: np.ndarray, n: int, mechanism: Mechanism) -> np.ndarray:
    """A consistent rough estimate of p for plugging into metrics (rows of ``values``).

    De-biased estimate, normalised to sum 1 where the mechanism does not guarantee it (for
    additive noise: the noisy table over its noisy total, falling back to n when that total
    is not positive, local-chi-square-tests spec §4.7). The result may still have negative
    entries; callers project onto the simplex.
    """
    p_hat = debiased(values, n, mechanism)
    if is_randomized_response(mechanism):
        return p_hat
    total = p_hat.sum(axis=-1, keepdims=True)
    return np.where(total > 0, p_hat / np.where(total > 0, total, 1.0), p_hat)


def project_simplex(v: np.ndarray, total: float = 1.0) -> np.ndarray:
    """Euclidean projection of each row of ``v`` onto ``{h >= 0, sum h = total}``
    (local-chi-square-tests spec §2.4)."""
    v = np.asarray(v, dtype=float)
    u = -np.sort(-v, axis=-1)
    css = np.cumsum(u, axis=-1) - total
    idx = np.arange(1, v.shape[-1] + 1)
    feasible = u > css / idx
    rho = v.shape[-1] - 1 - np.argmax(feasible[..., ::-1], axis=-1)
    tau = np.take_along_axis(css, rho[..., None], axis=-1) / (rho[..., None] + 1)
    return np.maximum(v - tau, 0.0)


def additive_form(y: np.ndarray, p: np.ndarray, b: float, projected: bool) -> np.ndarray:
    """``y^T Pi S_b(p)^{-1} Pi y`` (or without Pi) for each row, by the closed form of the
    local-chi-square-tests spec §2.1.

    Needs no matrix inverse, is stable as b -> 0, and allows zero cells in p when b > 0.
    """
    y = np.asarray(y, dtype=float)
    p = np.asarray(p, dtype=float)
    total = y.sum(axis=-1, keepdims=True)
    centred = y - total / y.shape[-1]
    _check_noise(b)
    w = p + b
    cross = np.sum(centred / w, axis=-1)
    value = np.sum(centred**2 / w, axis=-1) + b * cross**2 / np.sum(p / w, axis=-1)
    if not projected:
        value = value + total[..., 0] ** 2 / (b * y.shape[-1])
    return value


def support_metric(mechanism: Mechanism, p: np.ndarray) -> np.ndarray:
    """``c1^2 / (q (1 - q))`` per cell, q = c0 + c1 p clipped inside (0, 1): the support metric."""
    q = np.clip(mechanism.report_mean(np.clip(p, 0.0, 1.0)), 1e-300, None)
    return check_signal(mechanism) ** 2 / (q * np.clip(1 - q, 1e-300, None))


def support_null(mechanism: Mechanism, p0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The weighted chi-square law of ``n y^T W y`` for a support-count mechanism: the weights
    (eigenvalues of ``D^-1/2 C D^-1/2``, C the exact report covariance at p0 and D its diagonal)
    and the matrix of eigenvectors, for the noncentralities of planning."""
    weights, vectors = np.linalg.eigh(support_correlation(mechanism, p0))
    return np.clip(weights, 0.0, None), vectors


def support_correlation(mechanism: Mechanism, p0: np.ndarray) -> np.ndarray:
    """``D^-1/2 C D^-1/2``: the correlation matrix of one report's support indicators at p0."""
    cov = mechanism.report_covariance(p0)
    scale = 1 / np.sqrt(np.clip(np.diag(cov), 1e-300, None))
    return cov * scale[:, None] * scale[None, :]


def randomized_response_form(y: np.ndarray, p: np.ndarray, mechanism: RandomizedResponse):
    """``a1^2 sum_j y_j^2 / (a0 + a1 p_j)`` for each row (Pearson on privatized counts)."""
    q = mechanism.a0 + mechanism.a1 * np.asarray(p, dtype=float)
    return mechanism.a1**2 * np.sum(np.asarray(y) ** 2 / q, axis=-1)


def quadratic_form(
    mechanism: Mechanism, y: np.ndarray, p: np.ndarray, projected: bool = True
) -> np.ndarray:
    """``y^T W(p) y`` per row for the mechanism's test metric, y in de-biased units."""
    if is_randomized_response(mechanism):
        return randomized_response_form(y, p, mechanism)  # type: ignore[arg-type]
    if is_support(mechanism):
        return np.sum(support_metric(mechanism, p) * np.asarray(y) ** 2, axis=-1)
    return additive_form(y, p, extra_variance(mechanism), projected)


def metric_matrix(mechanism: Mechanism, p: np.ndarray, projected: bool = True) -> np.ndarray:
    """The dense metric W(p) (k x k), batched over leading axes of ``p``."""
    p = np.asarray(p, dtype=float)
    k = p.shape[-1]
    if is_randomized_response(mechanism):
        q = mechanism.a0 + mechanism.a1 * p  # type: ignore[attr-defined]
        return mechanism.a1**2 * (np.eye(k) / q[..., None, :])  # type: ignore[attr-defined]
    if is_support(mechanism):
        return np.eye(k) * support_metric(mechanism, p)[..., None, :]
    b = extra_variance(mechanism)
    _check_noise(b)
    # Pi S_b^{-1} Pi = Pi Diag(w)^{-1} Pi + b u u^T / sum(p / w), with u = Pi (1 / w): the
    # Sherman-Morrison term ([Sherman1950]) written without the cancellation of order 1 / b
    # (local-chi-square-tests spec §2.1).
    inv_w = 1.0 / (p + b)
    u = inv_w - inv_w.mean(axis=-1, keepdims=True)
    diag = np.eye(k) * inv_w[..., None, :]
    centred = (
        diag
        - (inv_w[..., None, :] + inv_w[..., :, None]) / k
        + inv_w.sum(axis=-1)[..., None, None] / k**2
    )
    projected_inverse = (
        centred
        + b * u[..., :, None] * u[..., None, :] / np.sum(p * inv_w, axis=-1)[..., None, None]
    )
    if projected:
        return projected_inverse
    return projected_inverse + 1.0 / (b * k)


def _check_noise(b: float) -> None:
    if not b > 0:
        raise InvalidInputError(
            "the mechanism's noise variance underflows to zero; lower rho or epsilon"
        )
