"""The sufficient statistic of a set of randomized reports, mergeable across shards."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from aggregator.errors import IncompatibleHistogramsError, InvalidInputError
from client.mechanisms import Mechanism
from client.survey import QuestionSpec


@dataclass(frozen=True, eq=False)
class Histogram:
    """The sufficient statistic of ``n`` reports of one mechanism: what estimates and tests need.

    ``values`` holds category counts (randomized response), bit sums (flip components), support
    counts (optimized unary encoding, Hadamard response, subset selection, local hashing),
    per-group report counts then bit sums (public-coin one-bit reports: 2L numbers) or coordinate
    sums in real units (Gaussian, Laplace). Build it from reports with ``from_reports`` or directly
    from numbers an analyst already has; add histograms of the same mechanism with ``+``.

    Parameters
    ----------
    mechanism : Mechanism
        The mechanism, with its parameters, that randomized every report.
    n : int
        Number of reports, >= 0.
    values : array_like of float, shape (mechanism.statistic_size,)
        The sufficient statistic; integers in 0..n for the counting mechanisms, summing to n for
        randomized response.
    question : QuestionSpec, optional
        The survey question the reports answer (``aggregator.open_survey`` sets it): estimates
        then name their categories by its labels, and ``independence`` reads its table shape.

    Raises
    ------
    InvalidInputError
        A ``mechanism`` that is not a ``Mechanism``, a negative or non-integer ``n``, values of the
        wrong shape, non-finite values, counts that are not integers in 0..n (or, for randomized
        response, do not sum to n), and, from ``from_reports``, reports the mechanism cannot
        aggregate.
    IncompatibleHistogramsError
        ``+`` of histograms of different mechanisms or parameters.

    References
    ----------
    local-chi-square-tests spec §1 (what each mechanism's server side aggregates, after
    [Rogers2017] Ch. 8); the large-domain spec §2 for the large-domain mechanisms.

    Examples
    --------
    >>> import numpy as np
    >>> from aggregator.histogram import Histogram
    >>> from client.mechanisms import RandomizedResponse
    >>> rr = RandomizedResponse(k=3, epsilon=1.0)
    >>> shard_1 = Histogram.from_reports(rr, np.array([0, 2, 2, 1]))
    >>> shard_1
    Histogram(randomized_response(k=3, epsilon=1), n=4, values=[1.0, 1.0, 2.0])
    >>> total = shard_1 + Histogram(rr, 2, [0, 2, 0])
    >>> total.n, total.values.tolist()
    (6, [1.0, 3.0, 2.0])
    >>> total.mean.round(3).tolist()
    [0.167, 0.5, 0.333]
    >>> Histogram(rr, 3, [1, 1, 0])
    Traceback (most recent call last):
        ...
    aggregator.errors.InvalidInputError: randomized-response counts must sum to n=3, got 2
    """

    mechanism: Mechanism
    n: int
    values: np.ndarray
    question: QuestionSpec | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.mechanism, Mechanism):
            raise InvalidInputError("mechanism must be a client.mechanisms.Mechanism")
        if self.question is not None and self.question.mechanism != self.mechanism:
            raise InvalidInputError(
                f"question {self.question.id} is randomized with "
                f"{self.question.mechanism.describe()}, not {self.mechanism.describe()}"
            )
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
        try:
            self.mechanism.check_statistic(values, self.n)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        if self.n == 0 and values.any():
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
    def labels(self) -> tuple[str, ...] | None:
        """The question's category labels in histogram order, if the histogram knows it."""
        return None if self.question is None else tuple(self.question.labels)

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
        question = self.question if self.question == other.question else None
        return Histogram(self.mechanism, self.n + other.n, self.values + other.values, question)

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
