"""Minimum chi-square fitting (spec 2.5 / 3.5): minimise (v - p(theta))^T W (v - p(theta)).

Gauss-Newton steps, each projected onto the feasible set and halved until the objective does
not increase, batched over replicates.
"""

from __future__ import annotations

import numpy as np

from aggregator.stats.models import ParametricModel


def objective(model: ParametricModel, v: np.ndarray, weights: np.ndarray, theta: np.ndarray):
    residual = v - model.probabilities(theta)
    return np.einsum("mi,mij,mj->m", residual, weights, residual)


def fit_minimum_chi_square(
    model: ParametricModel,
    v: np.ndarray,
    weights: np.ndarray,
    theta0: np.ndarray,
    max_iter: int = 100,
    tol: float = 1e-13,
) -> np.ndarray:
    """theta_hat per row of ``v`` (m, k) with metric ``weights`` (m, k, k), started at theta0."""
    theta = model.project(theta0)
    value = objective(model, v, weights, theta)
    for _ in range(max_iter):
        jac = model.jacobian(theta)
        residual = v - model.probabilities(theta)
        wj = weights @ jac
        normal = np.einsum("mki,mkj->mij", jac, wj)
        gradient = np.einsum("mki,mk->mi", wj, residual)
        step = _solve(normal, gradient)
        length = np.ones(theta.shape[0])
        improved = np.zeros(theta.shape[0], dtype=bool)
        candidate, cand_value = theta.copy(), value.copy()
        for _ in range(40):
            trial = model.project(theta + length[:, None] * step)
            trial_value = objective(model, v, weights, trial)
            ok = (trial_value <= value) & ~improved
            candidate[ok], cand_value[ok] = trial[ok], trial_value[ok]
            improved |= ok
            if improved.all():
                break
            length = np.where(improved, length, length / 2)
        change = value - cand_value
        theta, value = candidate, cand_value
        if np.all(change <= tol * (1 + value)):
            break
    return theta


def _solve(normal: np.ndarray, gradient: np.ndarray) -> np.ndarray:
    """Solve each s x s normal system; fall back to least squares where it is singular."""
    try:
        return np.linalg.solve(normal, gradient[..., None])[..., 0]
    except np.linalg.LinAlgError:
        pairs = zip(normal, gradient, strict=True)
        return np.stack([np.linalg.lstsq(a, g, rcond=None)[0] for a, g in pairs])
