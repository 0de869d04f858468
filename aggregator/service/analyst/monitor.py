"""The Analyst's Monitor RPC: anytime-valid monitoring of one question over its release history
(docs/monitoring.md, docs/wire.md §8.8).

The call first releases as every reading RPC does (aggregator/service/analyst/release.py: a snapshot
that is due moves, and is appended to the history in the same transaction), then reads the
history of the cells it watches and computes the confidence sequence and the e-process from
those looks alone (aggregator.stats.anytime.status). The looks are the snapshots every caller
could have seen, so the answer is the same for every caller and reveals nothing below
``min_batch_size``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import grpc
import numpy as np

from aggregator.errors import InsufficientDataError
from aggregator.histogram import Histogram
from aggregator.service.analyst.answers import analysed
from aggregator.service.analyst.execution import caller_of
from aggregator.stats.anytime.names import ANALYSES, SEQUENCES_ONLY
from aggregator.store.sqlite import release_history
from aggregator.survey_file.design import design_refusal
from aggregator.survey_file.groups import two_sample_request_problem
from client.survey import QuestionSpec, SurveySpec
from protos.ldp.v1 import ldp_pb2

#: Released snapshots in release order: (cell, n, sums), as release_history.read gives them.
History = list[tuple[release_history.Cell, int, list[int]]]

if TYPE_CHECKING:
    from aggregator.service.analyst.reads import ReleasedReads
    from aggregator.stats.anytime.status import Monitor, MonitorStatus

#: Monitors a server keeps between calls (MonitorCache).
CACHED_MONITORS = 256


async def monitor(
    reads: ReleasedReads, monitors: MonitorCache, request, context
) -> ldp_pb2.MonitorResponse:
    """Answer one MonitorRequest (status codes: docs/wire.md §8.8), continuing the e-processes
    kept in ``monitors``."""

    analysis = request.analysis or "frequencies"
    if analysis not in ANALYSES:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"analysis must be one of {', '.join(ANALYSES)}, got {analysis!r}",
        )
    test = analysis not in SEQUENCES_ONLY
    known = reads.surveys.get(request.survey_id)
    if known is not None and known.design is not None:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, design_refusal(known.id))
    if analysis == "two_sample":
        a = (request.survey_id, request.question_id, request.group_a)
        b = (request.survey_id, request.question_id, request.group_b)
        problem = two_sample_request_problem(a, b)
        if problem or not request.group_a or request.group:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                problem or "two_sample monitors two groups: give group_a and group_b, not group",
            )
        groups = [request.group_a, request.group_b]
    else:
        if request.group_a or request.group_b:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "group_a and group_b go with two_sample"
            )
        groups = [request.group]
    question = None
    for group in groups:  # release (moves due snapshots) and refuse what is not released
        question, _ = await reads.histogram(
            context, request.survey_id, request.question_id, request.side, group, test=test
        )
    assert question is not None
    if analysis == "independence" and len(question.shape) != 2:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"question {question.id!r} has {len(question.shape)} attribute(s); "
            "independence needs exactly 2",
        )
    if analysis == "mean_score" and len(question.attributes) != 1:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"question {question.id!r} has {len(question.attributes)} attributes; "
            "a mean score needs exactly 1",
        )
    survey = reads.surveys[request.survey_id]
    streams = [cells(survey, question.id, request.side, group) for group in groups]
    executor = reads.executor
    alpha, max_n = request.alpha or 0.05, request.max_n or None
    p0 = list(request.p0) if analysis == "goodness_of_fit" else None

    def work() -> MonitorStatus:
        return from_history(
            reads.store.release_history,
            analysis,
            question,
            streams,
            alpha=alpha,
            p0=p0,
            max_n=max_n,
            with_path=request.with_path,
            cache=monitors,
            scores=list(request.scores) or None,
        )

    async def run():
        async with executor.admitted(caller_of(context)):
            return await executor.in_thread(context, work)

    status = await analysed(context, run())
    return response(status, question)


def cells(
    survey: SurveySpec, question_id: str, side: int, group: str
) -> list[release_history.Cell]:
    """The cells one stream sums: the group, or every group of a pooled read."""
    side = (side or ldp_pb2.EXPLORATION) if survey.split else 0
    label = survey.group_label
    values = label.values if label is not None and not group else (group,)
    return [(survey.id, question_id, side, value) for value in values]


def from_history(
    read_history: Callable[[Sequence[release_history.Cell]], History],
    analysis: str,
    question: QuestionSpec,
    streams: list[list[release_history.Cell]],
    *,
    alpha: float = 0.05,
    p0: list[float] | None = None,
    max_n: int | None = None,
    with_path: bool = False,
    cache: MonitorCache | None = None,
    scores: list[float] | None = None,
) -> MonitorStatus:
    """The analysis over the streams' release history, read by ``read_history`` (blocking),
    continuing the ``cache``'s Monitor of the same analysis when there is one. Raises
    InsufficientDataError when no release is recorded, InvalidInputError for bad arguments."""
    history = read_history([cell for stream in streams for cell in stream])
    looks = release_history.looks(history, streams, question.statistic_size)
    if not looks:  # released before the store kept a history, and not moved since
        raise InsufficientDataError(
            f"{question.id}: no release recorded yet; looks start at the next release"
        )
    histograms = [[_histogram(question, n, sums) for n, sums in look] for look in looks]
    shape = question.table_shape

    from aggregator.stats.anytime.status import Monitor  # SciPy: on the first call, not at start

    def build() -> Monitor:
        mechanisms = [question.mechanism] * len(streams)
        return Monitor(analysis, mechanisms, alpha, p0=p0, shape=shape, max_n=max_n, scores=scores)

    if cache is None:
        return build().advance(histograms, with_path=with_path)
    null = None if p0 is None else tuple(p0)
    scored = None if scores is None else tuple(scores)
    key = (scored, question.digest, analysis, tuple(map(tuple, streams)), alpha, null, max_n)
    lock, monitor = cache.get(key, build)
    with lock:
        if not monitor.continues(histograms):  # not this one's continuation: restart
            monitor = cache.replace(key, build())
        return monitor.advance(histograms, with_path=with_path)


class MonitorCache:
    """Each analysis's Monitor between calls, keyed by question, cells and arguments (one cache
    per store; the least recently used dropped beyond ``size``): a refresh with no new release
    costs a read of the history, a new release one update of the e-process, not a rerun over
    every look."""

    def __init__(self, size: int = CACHED_MONITORS) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple, tuple[threading.Lock, Monitor]] = OrderedDict()

    def get(self, key: tuple, build: Callable[[], Monitor]) -> tuple[threading.Lock, Monitor]:
        """The entry of ``key`` (its lock and Monitor), built on first use."""
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:
            fresh = (threading.Lock(), build())  # may raise: bad arguments are not kept
            with self._lock:
                entry = self._entries.setdefault(key, fresh)
        with self._lock:
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return entry

    def replace(self, key: tuple, monitor: Monitor) -> Monitor:
        """Put a new Monitor under ``key`` (its lock held by the caller); return it."""
        with self._lock:
            lock = self._entries[key][0] if key in self._entries else threading.Lock()
            self._entries[key] = (lock, monitor)
        return monitor


def _histogram(question: QuestionSpec, n: int, sums: list[int]) -> Histogram:
    values = question.mechanism.statistic_values(np.asarray(sums, dtype=np.int64))
    return Histogram(question.mechanism, n, values, question)


def response(status: MonitorStatus, question: QuestionSpec) -> ldp_pb2.MonitorResponse:
    """The MonitorResponse of ``status`` (also what ``watch --db`` shows)."""
    message = ldp_pb2.MonitorResponse(
        n=status.n,
        labels=["mean score"] if status.analysis == "mean_score" else question.labels,
        estimate=status.estimate,
        low=status.low,
        high=status.high,
        interval_guarantee=status.interval_guarantee,
        decision=status.decision,
        alpha=status.alpha,
        max_n=status.max_n or 0,
    )
    result = status.test
    if result is not None:
        message.evalue = result.evalue
        message.max_evalue = result.max_evalue
        message.pvalue = result.pvalue
        message.test_guarantee = result.guarantee
        message.method = result.method
        if result.rejected_at is not None:
            message.rejected_at = result.rejected_at
    log_e = status.log_evalues
    for i, n in enumerate(status.look_ns):
        look = message.looks.add(n=n)
        if i < len(log_e):
            look.log_evalue = log_e[i]
        if status.intervals is not None:
            estimate, low, high = status.intervals[i]
            look.estimate.extend(estimate)
            look.low.extend(low)
            look.high.extend(high)
    return message
