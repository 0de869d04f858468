"""Parametric null models p(theta) for composite tests, batched over replicates.

All methods take and return stacked arrays: theta has shape (m, s), probabilities (m, k) and
Jacobians (m, k, s), so Monte Carlo replicates are fitted together.
"""

from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np

from aggregator.errors import InvalidInputError
from aggregator.stats.channel import project_simplex


class ParametricModel(ABC):
    """A smooth family of distributions p(theta) on k categories with s free parameters."""

    k: int
    n_params: int

    @abstractmethod
    def probabilities(self, theta: np.ndarray) -> np.ndarray:
        """p(theta) for each row of theta."""

    @abstractmethod
    def jacobian(self, theta: np.ndarray) -> np.ndarray:
        """d p / d theta, shape (m, k, s)."""

    @abstractmethod
    def initial(self, p_rough: np.ndarray) -> np.ndarray:
        """A consistent rough estimate of theta from rough distribution estimates (rows)."""

    @abstractmethod
    def project(self, theta: np.ndarray) -> np.ndarray:
        """The nearest feasible parameters."""


class IndependenceModel(ParametricModel):
    """Product of an r-row and a c-column marginal, cell (i, j) at index i * c + j.

    theta = (pi1_1..pi1_{r-1}, pi2_1..pi2_{c-1}); the last entry of each marginal is implied.
    """

    def __init__(self, r: int, c: int) -> None:
        if not (_is_count(r) and _is_count(c)) or r < 2 or c < 2:
            raise InvalidInputError(f"an independence table needs integers r, c >= 2, got {r}x{c}")
        r, c = int(r), int(c)
        self.r, self.c = r, c
        self.k = r * c
        self.n_params = r + c - 2

    def _marginals(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = theta[:, : self.r - 1]
        cols = theta[:, self.r - 1 :]
        pi1 = np.concatenate([rows, 1 - rows.sum(axis=1, keepdims=True)], axis=1)
        pi2 = np.concatenate([cols, 1 - cols.sum(axis=1, keepdims=True)], axis=1)
        return pi1, pi2

    def probabilities(self, theta: np.ndarray) -> np.ndarray:
        pi1, pi2 = self._marginals(theta)
        return (pi1[:, :, None] * pi2[:, None, :]).reshape(theta.shape[0], self.k)

    def jacobian(self, theta: np.ndarray) -> np.ndarray:
        pi1, pi2 = self._marginals(theta)
        m, r, c = theta.shape[0], self.r, self.c
        row_basis = np.eye(r)[:, : r - 1] - np.eye(r)[:, [r - 1]]  # d pi1_i / d theta_k
        col_basis = np.eye(c)[:, : c - 1] - np.eye(c)[:, [c - 1]]
        d_rows = row_basis[None, :, None, :] * pi2[:, None, :, None]  # (m, r, c, r-1)
        d_cols = pi1[:, :, None, None] * col_basis[None, None, :, :]  # (m, r, c, c-1)
        return np.concatenate([d_rows, d_cols], axis=3).reshape(m, self.k, self.n_params)

    def marginals_of(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        table = p.reshape(p.shape[0], self.r, self.c)
        return table.sum(axis=2), table.sum(axis=1)

    def initial(self, p_rough: np.ndarray) -> np.ndarray:
        rows, cols = self.marginals_of(p_rough)
        return self._pack(project_simplex(rows), project_simplex(cols))

    def project(self, theta: np.ndarray) -> np.ndarray:
        pi1, pi2 = self._marginals(theta)
        return self._pack(project_simplex(pi1), project_simplex(pi2))

    def _pack(self, pi1: np.ndarray, pi2: np.ndarray) -> np.ndarray:
        return np.concatenate([pi1[:, :-1], pi2[:, :-1]], axis=1)


class FunctionModel(ParametricModel):
    """A user-supplied model from plain functions.

    ``probabilities(theta)`` maps one parameter vector to a distribution on k categories,
    ``initial(p)`` maps a distribution (already projected onto the simplex) to a consistent
    rough estimate of theta, and ``bounds`` (lower, upper) clip theta to the feasible box.
    The Jacobian is taken by central differences.
    """

    def __init__(
        self,
        k: int,
        probabilities: Callable[[np.ndarray], np.ndarray],
        initial: Callable[[np.ndarray], np.ndarray],
        n_params: int,
        bounds: tuple[np.ndarray, np.ndarray] | None = None,
        step: float = 1e-6,
    ) -> None:
        if not _is_count(k) or k < 2:
            raise InvalidInputError(f"k must be an integer >= 2, got {k!r}")
        if not _is_count(n_params) or n_params < 1:
            raise InvalidInputError(f"n_params must be an integer >= 1, got {n_params!r}")
        self.k, self.n_params = int(k), int(n_params)
        self._probabilities, self._initial = probabilities, initial
        if bounds is None:
            bounds = (np.full(n_params, -np.inf), np.full(n_params, np.inf))
        self._lower = np.asarray(bounds[0], dtype=float)
        self._upper = np.asarray(bounds[1], dtype=float)
        self._step = step

    def probabilities(self, theta: np.ndarray) -> np.ndarray:
        out = np.array([_user_vector(self._probabilities, row, "probabilities") for row in theta])
        if out.shape != (theta.shape[0], self.k):
            raise InvalidInputError(f"the model must return {self.k} probabilities")
        return out

    def jacobian(self, theta: np.ndarray) -> np.ndarray:
        jac = np.empty((theta.shape[0], self.k, self.n_params))
        for j in range(self.n_params):
            h = np.zeros(self.n_params)
            h[j] = self._step
            upper = np.minimum(theta + h, self._upper)
            lower = np.maximum(theta - h, self._lower)
            up, down = self.probabilities(upper), self.probabilities(lower)
            jac[:, :, j] = (up - down) / (upper[:, j] - lower[:, j])[:, None]
        return jac

    def initial(self, p_rough: np.ndarray) -> np.ndarray:
        rows = project_simplex(p_rough)
        return self.project(np.array([_user_vector(self._initial, p, "initial") for p in rows]))

    def project(self, theta: np.ndarray) -> np.ndarray:
        return np.clip(theta, self._lower, self._upper)


def _is_count(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _user_vector(function: Callable, argument: np.ndarray, name: str) -> np.ndarray:
    """Call a user-supplied model function; its failure is the model's fault, said as such."""
    try:
        return np.asarray(function(argument), dtype=float)
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise InvalidInputError(f"model: {name}({argument.tolist()}) failed: {exc}") from None
