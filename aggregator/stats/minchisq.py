"""Minimum chi-square fitting (local-chi-square-tests spec §2.5, §3.5; [Rogers2017] Sec. 7.1.2):
minimise (v - p(theta))^T W (v - p(theta)).

Gauss-Newton steps, each projected onto the feasible set and halved until the objective does
not increase, batched over replicates. Rows that have converged leave the batch, and the line
search only re-evaluates the rows still looking for a step, so a bootstrap of hundreds of
replicates costs a few full-batch iterations.
"""

from __future__ import annotations

import numpy as np

from aggregator.stats.models import ParametricModel


def objective(model: ParametricModel, v: np.ndarray, weights: np.ndarray, theta: np.ndarray):
    residual = v - model.probabilities(theta)
    return np.einsum("mi,mi->m", residual, (weights @ residual[..., None])[..., 0])


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
    active = np.arange(theta.shape[0])
    for _ in range(max_iter):
        if active.size == 0:
            break
        t, w, y = theta[active], weights[active], v[active]
        jac = model.jacobian(t)
        residual = y - model.probabilities(t)
        wj = w @ jac
        normal = np.einsum("mki,mkj->mij", jac, wj)
        gradient = np.einsum("mki,mk->mi", wj, residual)
        step = _solve(normal, gradient)
        old = value[active]
        new_theta, new_value = t.copy(), old.copy()
        searching = np.arange(active.size)
        length = 1.0
        for _ in range(40):
            trial = model.project(t[searching] + length * step[searching])
            trial_value = objective(model, y[searching], w[searching], trial)
            ok = trial_value <= old[searching]
            new_theta[searching[ok]], new_value[searching[ok]] = trial[ok], trial_value[ok]
            searching = searching[~ok]
            if searching.size == 0:
                break
            length /= 2
        theta[active], value[active] = new_theta, new_value
        converged = old - new_value <= tol * (1 + new_value)
        active = active[~converged]
    return theta


def _solve(normal: np.ndarray, gradient: np.ndarray) -> np.ndarray:
    """Solve each s x s normal system; fall back to least squares where it is singular."""
    try:
        return np.linalg.solve(normal, gradient[..., None])[..., 0]
    except np.linalg.LinAlgError:
        pairs = zip(normal, gradient, strict=True)
        return np.stack([np.linalg.lstsq(a, g, rcond=None)[0] for a, g in pairs])
