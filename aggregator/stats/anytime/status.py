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
from aggregator.stats.anytime import nulls
from aggregator.stats.anytime.eprocess import EProcess, SequentialResult
from aggregator.stats.anytime.names import ANALYSES, CONTINUE, REJECT, STOP_AT_MAX_N
from aggregator.stats.anytime.sequences import (
    DEFAULT_TUNED_N,
    difference_sequence,
    frequency_sequence,
    mean_score_sequence,
)
from aggregator.stats.validate import check_alpha
from client.mechanisms import Mechanism


@dataclass(frozen=True)
class MonitorStatus:
    """An analysis at its latest look. ``estimate``/``low``/``high``: per category, the running
    estimate and its confidence sequence (for two groups: of the difference A - B; for
    ``mean_score`` one row, the mean score). ``test`` is None for ``frequencies`` and
    ``mean_score``; ``decision`` is continue, reject (the e-value passed 1/alpha)
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
    scores: Sequence[float] | None = None,
) -> MonitorStatus:
    """``analysis`` (one of ANALYSES) over ``looks``: each look one cumulative histogram per
    stream (two streams for two_sample, one otherwise). The confidence sequence is tuned to
    ``max_n`` when given (the planned size), else to the default; ``with_path`` also computes
    it at every look (one sequence: together they hold with probability 1 - alpha). The test
    is exactly ``sequential_goodness_of_fit`` / ``sequential_independence`` /
    ``sequential_homogeneity`` over the same looks.

    Raises
    ------
    InvalidInputError
        An unknown analysis, no looks, the wrong number of streams, a bad p0, shape, alpha or
        max_n.
    """
    if not looks or not looks[0]:
        raise InvalidInputError("need at least one look")
    mechanisms = [h.mechanism for h in looks[0]]
    monitor = Monitor(analysis, mechanisms, alpha, p0=p0, shape=shape, max_n=max_n, scores=scores)
    return monitor.advance(looks, with_path=with_path)


class Monitor:
    """One analysis followed look by look: ``advance`` takes every look so far and feeds the
    test only those it has not seen, so a service that keeps it between calls pays per new
    look, not per look (the answers are those of :func:`monitor_status` over all the looks).
    Not thread-safe: one caller at a time."""

    def __init__(
        self,
        analysis: str,
        mechanisms: Sequence[Mechanism],
        alpha: float = 0.05,
        *,
        p0: Sequence[float] | None = None,
        shape: tuple[int, int] | None = None,
        max_n: int | None = None,
        scores: Sequence[float] | None = None,
    ) -> None:
        if analysis not in ANALYSES:
            raise InvalidInputError(
                f"analysis must be one of {', '.join(ANALYSES)}, got {analysis!r}"
            )
        if max_n is not None and (
            isinstance(max_n, bool) or not isinstance(max_n, int) or max_n < 1
        ):
            raise InvalidInputError(f"max_n must be a positive integer, got {max_n!r}")
        self.streams = 2 if analysis == "two_sample" else 1
        if len(mechanisms) != self.streams:
            raise InvalidInputError(f"{analysis} needs looks of {self.streams} histogram(s) each")
        self.analysis, self.alpha, self.max_n = analysis, check_alpha(alpha), max_n
        self.tuned = DEFAULT_TUNED_N if max_n is None else max_n
        self.process = _process(analysis, mechanisms, self.alpha, p0, shape, max_n)
        self.scores = None if scores is None else tuple(float(s) for s in scores)
        if analysis == "mean_score":  # check the scores now, not at the first look
            if shape is not None:
                raise InvalidInputError("mean_score needs a question of one attribute")
            mean_score_sequence(_empty(mechanisms[0]), self.scores, self.alpha)
        self.result: SequentialResult | None = None  # the test's, at the last look it took
        self.seen: list[tuple[int, ...]] = []  # every look's n per stream, to check a prefix
        self.intervals: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._last: tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray, str]] | None = None

    def continues(self, looks: Sequence[Sequence[Histogram]]) -> bool:
        """Whether ``looks`` begin with the looks already taken (else start a new Monitor)."""
        return [tuple(h.n for h in look) for look in looks[: len(self.seen)]] == self.seen

    def advance(
        self, looks: Sequence[Sequence[Histogram]], *, with_path: bool = False
    ) -> MonitorStatus:
        """The status at the last of ``looks`` (all looks so far, the earlier ones as before)."""
        if not looks or any(len(look) != self.streams for look in looks):
            raise InvalidInputError(
                f"{self.analysis} needs looks of {self.streams} histogram(s) each"
            )
        if not self.continues(looks):
            raise InvalidInputError("the earlier looks changed: start a new Monitor")
        ns = [tuple(h.n for h in look) for look in looks]
        for look in looks[len(self.seen) :]:
            if self.process is not None and (
                self.result is None or self.result.stop != "maximum n"
            ):
                self.result = self.process.update(look)
        self.seen = ns
        if self._last is None or self._last[0] != len(looks):
            self._last = (len(looks), self._interval(looks[-1]))
        estimate, low, high, said = self._last[1]
        path = None
        if with_path:
            self.intervals += [self._interval(look)[:3] for look in looks[len(self.intervals) :]]
            path = tuple(self.intervals)
        look_ns = tuple(sum(n) for n in ns)
        n = look_ns[-1]
        if self.result is not None and self.result.reject:
            decision = REJECT
        elif self.max_n is not None and n >= self.max_n:
            decision = STOP_AT_MAX_N
        else:
            decision = CONTINUE
        return MonitorStatus(
            self.analysis,
            n,
            self.alpha,
            self.max_n,
            estimate,
            low,
            high,
            said,
            self.result,
            decision,
            look_ns,
            path,
        )

    def _interval(
        self, look: Sequence[Histogram]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
        if self.analysis == "two_sample":
            diff = difference_sequence(look[0], look[1], self.alpha, tuned_n=self.tuned)
            return diff.difference, diff.low, diff.high, diff.guarantee
        if self.analysis == "mean_score":
            ms = mean_score_sequence(look[0], self.scores, self.alpha, tuned_n=self.tuned)
            one = (np.array([ms.mean]), np.array([ms.low]), np.array([ms.high]))
            return (*one, ms.guarantee)
        cs = frequency_sequence(look[0], self.alpha, tuned_n=self.tuned)
        return cs.estimate, cs.low, cs.high, cs.guarantee


def _empty(mechanism: Mechanism) -> Histogram:
    """A histogram of no reports (to check a mean score's scores before the first look)."""
    return Histogram(
        mechanism, 0, mechanism.statistic_values(np.zeros(mechanism.statistic_size, np.int64))
    )


def _process(
    analysis: str,
    mechanisms: Sequence[Mechanism],
    alpha: float,
    p0: Sequence[float] | None,
    shape: tuple[int, int] | None,
    max_n: int | None,
) -> EProcess | None:
    """The e-process of the analysis, as the sequential_* functions build it (None: no test)."""
    k = mechanisms[0].k
    if analysis == "goodness_of_fit":
        if p0 is None:
            raise InvalidInputError("goodness_of_fit needs p0")
        return EProcess(nulls.simple(p0, k), mechanisms, alpha, max_n)
    if analysis == "independence":
        if shape is None:
            raise InvalidInputError("independence needs a question with two attributes")
        if shape[0] * shape[1] != k:
            raise InvalidInputError(f"shape {shape} does not have {k} cells")
        return EProcess(nulls.independent(shape), mechanisms, alpha, max_n)
    if analysis == "two_sample":
        return EProcess(nulls.homogeneous(k), mechanisms, alpha, max_n)
    return None
