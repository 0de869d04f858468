"""The sufficient statistic of a set of randomized reports, mergeable across shards."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from aggregator.errors import IncompatibleHistogramsError, InvalidInputError
from client.mechanisms import (
    FlipComponents,
    Mechanism,
    PublicCoinBit,
    RandomizedResponse,
    SupportMechanism,
)


@dataclass(frozen=True, eq=False)
class Histogram:
    """``values`` is what the estimators and tests need from ``n`` reports of ``mechanism``:
    category counts (randomized response), bit sums (flip components), support counts (optimized
    unary encoding, Hadamard response), per-group report counts then bit sums (public-coin
    one-bit reports: 2L numbers) or coordinate sums in real units (Gaussian, Laplace). Build it
    from reports with ``from_reports`` or directly from numbers an analyst already has; add
    histograms of the same mechanism with ``+``.
    """

    mechanism: Mechanism
    n: int
    values: np.ndarray

    def __post_init__(self) -> None:
        if not isinstance(self.mechanism, Mechanism):
            raise InvalidInputError("mechanism must be a client.mechanisms.Mechanism")
        if isinstance(self.n, bool) or not isinstance(self.n, numbers.Integral) or self.n < 0:
            raise InvalidInputError(f"n must be a non-negative integer, got {self.n!r}")
        object.__setattr__(self, "n", int(self.n))
        try:
            values = np.array(self.values, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"values must be a vector of numbers: {exc}") from exc
        size = self.mechanism.statistic_size
        if values.shape != (size,):
            raise InvalidInputError(f"values must have shape ({size},), got {values.shape}")
        if not np.isfinite(values).all():
            raise InvalidInputError("values must be finite")
        self._check_support(values)
        values.setflags(write=False)
        object.__setattr__(self, "values", values)

    def _check_support(self, values: np.ndarray) -> None:
        n = self.n
        counted = RandomizedResponse | FlipComponents | SupportMechanism | PublicCoinBit
        if isinstance(self.mechanism, counted):
            if not np.array_equal(values, np.round(values)):
                raise InvalidInputError(f"{self.mechanism.name} values must be integers")
            if values.min() < 0 or values.max() > n:
                raise InvalidInputError(f"{self.mechanism.name} values must lie in 0..n")
        if isinstance(self.mechanism, RandomizedResponse) and values.sum() != n:
            raise InvalidInputError(
                f"randomized-response counts must sum to n={n}, got {values.sum():g}"
            )
        if isinstance(self.mechanism, PublicCoinBit):
            sizes, sums = np.split(values, 2)
            if sizes.sum() != n or (sums > sizes).any():
                raise InvalidInputError(
                    f"public-coin group sizes must sum to n={n} and bound their bit sums"
                )
        if n == 0 and values.any():
            raise InvalidInputError("a histogram of zero reports must have all-zero values")

    @classmethod
    def empty(cls, mechanism: Mechanism) -> Histogram:
        """The histogram of no reports (the identity of ``+``)."""
        return cls(mechanism, 0, np.zeros(mechanism.statistic_size))

    @classmethod
    def from_reports(cls, mechanism: Mechanism, reports: np.ndarray) -> Histogram:
        """Aggregate a stack of reports (as returned by ``randomize`` or ``simulate``)."""
        reports = np.asarray(reports)
        try:
            values = mechanism.aggregate(reports)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from exc
        return cls(mechanism, int(reports.shape[0]), values)

    @property
    def k(self) -> int:
        return self.mechanism.k

    @property
    def mean(self) -> np.ndarray:
        """Average report vector values / n (requires n > 0)."""
        if self.n == 0:
            raise InvalidInputError("the mean of an empty histogram is undefined")
        return self.values / self.n

    def __add__(self, other: object) -> Histogram:
        if not isinstance(other, Histogram):
            return NotImplemented
        if other.mechanism != self.mechanism:
            raise IncompatibleHistogramsError(
                f"cannot merge {self.mechanism.describe()} with {other.mechanism.describe()}"
            )
        return Histogram(self.mechanism, self.n + other.n, self.values + other.values)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Histogram):
            return NotImplemented
        return (
            self.mechanism == other.mechanism
            and self.n == other.n
            and np.array_equal(self.values, other.values)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Histogram({self.mechanism.describe()}, n={self.n}, values={self.values.tolist()})"
