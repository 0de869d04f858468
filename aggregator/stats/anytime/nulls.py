"""Null hypotheses of the sequential tests and the infimum of the e-process over each.

For each p in the null, ``M_n(p)`` (``eprocess``) is a test martingale when the answers follow
p, so ``inf_{p in H0} M_n(p)`` is an e-process for the composite null (universal inference:
Wasserman, Ramdas, Balakrishnan, PNAS 2020). For randomized response ``M_n(p)`` is the plug-in
likelihood over the likelihood of p, and the infimum divides by the maximum likelihood under
H0. The infimum is found numerically (quasi-Newton over softmax coordinates, from the last
look's minimiser and from the data's own estimate); the e-process is only as exact as that
minimum, as in universal inference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

from aggregator.errors import InvalidInputError
from aggregator.stats.validate import check_distribution


@dataclass(frozen=True)
class NullModel:
    """A null hypothesis on the k true frequencies: kind "simple" (p = p0), "homogeneous" (the
    groups share one unknown p) or "independent" (a ``shape`` table with independent margins)."""

    kind: str
    k: int
    p0: np.ndarray | None = None
    shape: tuple[int, int] | None = None

    @property
    def name(self) -> str:
        return {
            "simple": "goodness of fit",
            "homogeneous": "homogeneity",
            "independent": "independence",
        }[self.kind]

    def start(self) -> np.ndarray:
        return self.p0 if self.p0 is not None else np.full(self.k, 1.0 / self.k)

    def distribution(self, theta: np.ndarray) -> np.ndarray:
        """The null distribution at free coordinates ``theta``."""
        if self.shape is None:
            return special.softmax(theta)
        rows = special.softmax(theta[: self.shape[0]])
        return np.outer(rows, special.softmax(theta[self.shape[0] :])).ravel()

    def coordinates(self, p: np.ndarray) -> np.ndarray:
        """Free coordinates of (the null's closest member to) p."""
        p = np.clip(p, 1e-6, None)
        if self.shape is None:
            return np.log(p / p.sum())
        grid = p.reshape(self.shape)
        return np.log(np.concatenate([grid.sum(axis=1), grid.sum(axis=0)]))

    def infimum(
        self, log_m: Callable[[np.ndarray], float], starts: list[np.ndarray]
    ) -> tuple[np.ndarray, float]:
        """The minimiser over the null of ``log_m`` and its value."""
        if self.p0 is not None:
            return self.p0, log_m(self.p0)
        best: tuple[np.ndarray, float] | None = None
        for start in starts:
            found = optimize.minimize(
                lambda theta: log_m(self.distribution(theta)),
                self.coordinates(start),
                method="L-BFGS-B",
                options={"ftol": 1e-12, "gtol": 1e-8, "maxiter": 500},
            )
            if best is None or found.fun < best[1]:
                best = (self.distribution(found.x), float(found.fun))
        assert best is not None
        return best


def simple(p0: object, k: int) -> NullModel:
    """H0: p = p0."""
    return NullModel("simple", k, p0=check_distribution(p0, k))


def homogeneous(k: int) -> NullModel:
    """H0: every group's answers follow the same (unknown) distribution."""
    return NullModel("homogeneous", k)


def independent(shape: tuple[int, int]) -> NullModel:
    """H0: the two attributes of a (rows, columns) question are independent."""
    if len(shape) != 2 or min(shape) < 2:
        raise InvalidInputError(f"shape must be (rows, columns), each >= 2, got {shape!r}")
    return NullModel("independent", shape[0] * shape[1], shape=(int(shape[0]), int(shape[1])))
