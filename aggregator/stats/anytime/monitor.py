"""The monitoring API over a sequence of looks: each look is the cumulative histogram at some n
(or, from a store, the (n, integer sums) snapshot), and each function says what holds at every
look at once (docs/monitoring.md)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats.anytime import nulls
from aggregator.stats.anytime.eprocess import EProcess, SequentialResult
from aggregator.stats.anytime.sequences import (
    DEFAULT_TUNED_N,
    ConfidenceSequence,
    frequency_sequence,
)
from aggregator.stats.anytime.stopping import forecast_stopping
from client.mechanisms import Mechanism


def looks_from_sums(
    mechanism: Mechanism, snapshots: Sequence[tuple[int, Sequence[int]]]
) -> list[Histogram]:
    """Histograms from a store's snapshots: (n, the mechanism's exact integer sums) at
    successive looks, n never decreasing."""
    looks = []
    for n, sums in snapshots:
        values = mechanism.statistic_values(np.asarray(sums, dtype=np.int64))
        looks.append(Histogram(mechanism, n, values))
    for before, after in itertools.pairwise(looks):
        if after.n < before.n:
            raise InvalidInputError(f"snapshots must not go back in n ({before.n} then {after.n})")
    return looks


def frequency_path(
    looks: Sequence[Histogram],
    alpha: float = 0.05,
    *,
    simultaneous: bool = True,
    tuned_n: int = DEFAULT_TUNED_N,
) -> list[ConfidenceSequence]:
    """The confidence sequence "as of n" at every look: together, with probability at least
    1 - alpha, every interval of every look covers (what a report's "as of n" table draws)."""
    return [frequency_sequence(h, alpha, simultaneous=simultaneous, tuned_n=tuned_n) for h in looks]


def _run(process: EProcess, looks: Sequence[Sequence[Histogram]]) -> SequentialResult:
    if not looks:
        raise InvalidInputError("need at least one look")
    result = None
    for look in looks:
        result = process.update(look)
        if result.stop == "maximum n":
            break
    assert result is not None
    return result


def sequential_goodness_of_fit(
    looks: Sequence[Histogram], p0: object, alpha: float = 0.05, *, max_n: int | None = None
) -> SequentialResult:
    """Sequential test of H0: p = p0 over the looks (cumulative histograms of one question).

    Raises
    ------
    InvalidInputError
        No looks, histograms of different mechanisms, n going down, a bad p0 or alpha,
        public-coin reports.
    """
    mech = _first(looks).mechanism
    process = EProcess(nulls.simple(p0, mech.k), [mech], alpha, max_n)
    return _run(process, [[h] for h in looks])


def sequential_independence(
    looks: Sequence[Histogram],
    shape: tuple[int, int] | None = None,
    alpha: float = 0.05,
    *,
    max_n: int | None = None,
) -> SequentialResult:
    """Sequential test of independence of a two-attribute question's attributes (``shape``
    (rows, columns), row-major categories; read from the question when the histogram has one)."""
    first = _first(looks)
    if shape is None:
        question = first.question
        shape = None if question is None else question.table_shape
        if shape is None:
            raise InvalidInputError("give shape=(rows, columns) for the independence test")
    if shape[0] * shape[1] != first.k:
        raise InvalidInputError(f"shape {shape} does not have {first.k} cells")
    process = EProcess(nulls.independent(shape), [first.mechanism], alpha, max_n)
    return _run(process, [[h] for h in looks])


def sequential_homogeneity(
    looks: Sequence[Sequence[Histogram]], alpha: float = 0.05, *, max_n: int | None = None
) -> SequentialResult:
    """Sequential test that two or more groups answer alike: each look is one cumulative
    histogram per group (groups may use different mechanisms with the same k)."""
    if not looks or len(looks[0]) < 2:
        raise InvalidInputError("each look needs one histogram per group, at least two groups")
    mechanisms = [h.mechanism for h in looks[0]]
    process = EProcess(nulls.homogeneous(mechanisms[0].k), mechanisms, alpha, max_n)
    return _run(process, looks)


def _first(looks: Sequence[Histogram]) -> Histogram:
    if not looks or not isinstance(looks[0], Histogram):
        raise InvalidInputError("looks must be a non-empty sequence of histograms")
    return looks[0]


def expected_stopping_time(
    mechanism: Mechanism,
    alternative: object,
    null: object,
    alpha: float = 0.05,
    *,
    batch: int = 1,
) -> int:
    """The mean number of reports the goodness-of-fit e-process needs to pass 1/alpha under a
    planned alternative, looked at every ``batch`` reports: the mean of
    ``stopping.forecast_stopping`` (its median and 90% point there too), a drift-and-regret
    model of log E_n (survey-design-and-monitoring spec S.2) that the validation table and
    tests/planning/test_sequential_planning.py check against simulation."""
    return forecast_stopping(mechanism, alternative, null, alpha, batch).mean
