"""One monitored analysis at its latest look: the confidence sequence there, the e-process over
every look, the anytime p-value and the stopping rule's decision, as the Monitor RPC, ``watch``
and the report's "as of n" section show them (docs/monitoring.md). A pure function of the looks,
so every client computing from the same release history gets the same numbers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats.anytime.eprocess import SequentialResult
from aggregator.stats.anytime.monitor import (
    sequential_goodness_of_fit,
    sequential_homogeneity,
    sequential_independence,
)
from aggregator.stats.anytime.sequences import (
    DEFAULT_TUNED_N,
    difference_sequence,
    frequency_sequence,
)

#: What can be monitored: frequencies only (a confidence sequence), or a sequential test.
ANALYSES = ("frequencies", "goodness_of_fit", "independence", "two_sample")
#: The stopping rule's verdicts.
CONTINUE, REJECT, STOP_AT_MAX_N = "continue", "reject", "stop at max_n"


@dataclass(frozen=True)
class MonitorStatus:
    """An analysis at its latest look. ``estimate``/``low``/``high``: per category, the running
    estimate and its confidence sequence (for two groups: of the difference A - B). ``test``
    is None for ``frequencies``; ``decision`` is continue, reject (the e-value passed 1/alpha)
    or "stop at max_n"."""

    analysis: str
    n: int
    alpha: float
    max_n: int | None
    estimate: np.ndarray
    low: np.ndarray
    high: np.ndarray
    interval_guarantee: str
    test: SequentialResult | None
    decision: str
    look_ns: tuple[int, ...] = ()
    #: With ``with_path``: (estimate, low, high) at every look, in order.
    intervals: tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...] | None = None

    @property
    def log_evalues(self) -> tuple[float, ...]:
        """log E at every look of the test, in order (empty without one; shorter than
        ``look_ns`` when the test stopped at max_n)."""
        if self.test is None:
            return ()
        return tuple(math.log(e) for _, e in self.test.path)


def monitor_status(
    analysis: str,
    looks: Sequence[Sequence[Histogram]],
    alpha: float = 0.05,
    *,
    p0: Sequence[float] | None = None,
    shape: tuple[int, int] | None = None,
    max_n: int | None = None,
    with_path: bool = False,
) -> MonitorStatus:
    """``analysis`` (one of ANALYSES) over ``looks``: each look one cumulative histogram per
    stream (two streams for two_sample, one otherwise). The confidence sequence is tuned to
    ``max_n`` when given (the planned size), else to the default; ``with_path`` also computes
    it at every look (one sequence: together they hold with probability 1 - alpha).

    Raises
    ------
    InvalidInputError
        An unknown analysis, no looks, the wrong number of streams, a bad p0, alpha or max_n.
    """
    if analysis not in ANALYSES:
        raise InvalidInputError(f"analysis must be one of {', '.join(ANALYSES)}, got {analysis!r}")
    if max_n is not None and (isinstance(max_n, bool) or not isinstance(max_n, int) or max_n < 1):
        raise InvalidInputError(f"max_n must be a positive integer, got {max_n!r}")
    streams = 2 if analysis == "two_sample" else 1
    if not looks or any(len(look) != streams for look in looks):
        raise InvalidInputError(f"{analysis} needs looks of {streams} histogram(s) each")
    tuned = DEFAULT_TUNED_N if max_n is None else max_n

    def interval(look: Sequence[Histogram]) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
        if analysis == "two_sample":
            diff = difference_sequence(look[0], look[1], alpha, tuned_n=tuned)
            return diff.difference, diff.low, diff.high, diff.guarantee
        cs = frequency_sequence(look[0], alpha, tuned_n=tuned)
        return cs.estimate, cs.low, cs.high, cs.guarantee

    estimate, low, high, said = interval(looks[-1])
    path = tuple(interval(look)[:3] for look in looks) if with_path else None
    look_ns = tuple(sum(h.n for h in look) for look in looks)
    n = look_ns[-1]
    test: SequentialResult | None = None
    if analysis == "two_sample":
        test = sequential_homogeneity(looks, alpha, max_n=max_n)
    else:
        one = [look[0] for look in looks]
        if analysis == "goodness_of_fit":
            if p0 is None:
                raise InvalidInputError("goodness_of_fit needs p0")
            test = sequential_goodness_of_fit(one, p0, alpha, max_n=max_n)
        elif analysis == "independence":
            test = sequential_independence(one, shape, alpha, max_n=max_n)
    if test is not None and test.reject:
        decision = REJECT
    elif max_n is not None and n >= max_n:
        decision = STOP_AT_MAX_N
    else:
        decision = CONTINUE
    return MonitorStatus(
        analysis, n, alpha, max_n, estimate, low, high, said, test, decision, look_ns, path
    )
