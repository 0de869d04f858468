"""Anytime-valid monitoring of one question over its release history (docs/monitoring.md): the
looks are the question's released snapshots, read from the history, and each analysis's status
at the latest look is computed from those looks alone (aggregator.stats.anytime.status), its
Monitor kept between calls so a refresh costs one update per new release. The Analyst's Monitor
RPC (aggregator/service/analyst/monitor.py) answers from it over the wire, advancing the kept
Monitor in an analysis worker process (``advanced``); ``watch --db`` and the report's "as of n"
section read a local store through it directly (``store_look``)."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from aggregator.analysis.monitor_answers import Look, Waiting, Watched, monitor_answer, one_line
from aggregator.analysis.survey_data import SIDES
from aggregator.errors import InsufficientDataError
from aggregator.histogram import Histogram
from aggregator.store.sqlite import confirmations, release_history
from aggregator.store.sqlite.reader import StoreReader
from client.survey import QuestionSpec, SurveySpec

if TYPE_CHECKING:
    from aggregator.analysis.monitor_answers import MonitorAnswer
    from aggregator.stats.anytime.status import Monitor, MonitorStatus

#: Released snapshots in release order: (cell, n, sums), as release_history.read gives them.
History = list[tuple[release_history.Cell, int, list[int]]]
#: Every look so far, each one cumulative histogram per stream.
Looks = list[list[Histogram]]

#: Monitors a server keeps between calls (MonitorCache).
CACHED_MONITORS = 256


def cells(
    survey: SurveySpec, question_id: str, side: int, group: str
) -> list[release_history.Cell]:
    """The cells one stream sums: the group, or every group of a pooled read."""
    side = (side or SIDES["exploration"]) if survey.split else 0
    label = survey.group_label
    values = label.values if label is not None and not group else (group,)
    return [(survey.id, question_id, side, value) for value in values]


@dataclass(frozen=True)
class Monitored:
    """One monitored analysis of a question over some streams (each a list of cells): what
    builds its Monitor (in the process that advances it) and names it between calls."""

    analysis: str
    question: QuestionSpec
    streams: tuple[tuple[release_history.Cell, ...], ...]
    alpha: float = 0.05
    p0: tuple[float, ...] | None = None
    max_n: int | None = None
    scores: tuple[float, ...] | None = None

    @property
    def key(self) -> tuple:
        """What a Monitor of this analysis is kept under (MonitorCache)."""
        args = (self.analysis, self.streams, self.alpha, self.p0, self.max_n, self.scores)
        return (self.question.digest, *args)

    def build(self) -> Monitor:
        from aggregator.stats.anytime.status import Monitor  # SciPy: not at start

        return Monitor(
            self.analysis,
            [self.question.mechanism] * len(self.streams),
            self.alpha,
            p0=None if self.p0 is None else list(self.p0),
            shape=self.question.table_shape,
            max_n=self.max_n,
            scores=None if self.scores is None else list(self.scores),
        )


def monitored(
    analysis: str,
    question: QuestionSpec,
    streams: Sequence[Sequence[release_history.Cell]],
    *,
    alpha: float = 0.05,
    p0: Sequence[float] | None = None,
    max_n: int | None = None,
    scores: Sequence[float] | None = None,
) -> Monitored:
    """The Monitored of these arguments (sequences made tuples)."""
    return Monitored(
        analysis,
        question,
        tuple(tuple(stream) for stream in streams),
        alpha,
        None if p0 is None else tuple(p0),
        max_n,
        None if scores is None else tuple(scores),
    )


def history_looks(
    read_history: Callable[[Sequence[release_history.Cell]], History], w: Monitored
) -> Looks:
    """Every look of ``w``'s streams over the release history read by ``read_history``
    (blocking). Raises InsufficientDataError when no release is recorded."""
    history = read_history([cell for stream in w.streams for cell in stream])
    question = w.question
    looks = release_history.looks(history, w.streams, question.statistic_size)
    if not looks:  # released before the store kept a history, and not moved since
        raise InsufficientDataError(
            f"{question.id}: no release recorded yet; looks start at the next release"
        )
    return [[_histogram(question, n, sums) for n, sums in look] for look in looks]


def advanced(
    w: Monitored, monitor: Monitor | None, looks: Looks, with_path: bool = False
) -> tuple[Monitor, MonitorStatus]:
    """``monitor`` (None: a new one, as also when ``looks`` do not continue its looks) advanced
    to the last of ``looks``, and its status there: one update per look it has not seen. A
    module-level function: the Monitor RPC runs it in an analysis worker process (where a
    caller that goes away stops it), sending the kept Monitor and getting the advanced one
    back. Raises InvalidInputError for bad arguments."""
    if monitor is None or not monitor.continues(looks):
        monitor = w.build()
    return monitor, monitor.advance(looks, with_path=with_path)


def from_history(
    read_history: Callable[[Sequence[release_history.Cell]], History],
    w: Monitored,
    *,
    with_path: bool = False,
    cache: MonitorCache | None = None,
) -> MonitorStatus:
    """The status of ``w`` over the release history read by ``read_history`` (blocking), in
    this thread, continuing the ``cache``'s Monitor of it when there is one."""
    looks = history_looks(read_history, w)
    monitor, status = advanced(w, None if cache is None else cache.get(w.key), looks, with_path)
    if cache is not None:
        cache.put(w.key, monitor)
    return status


class MonitorCache:
    """Each analysis's Monitor between calls, keyed by Monitored.key (one cache per store; the least
    recently used dropped beyond ``size``): a refresh with no new release costs a read of the
    history, a new release one update of the e-process, not a rerun over every look."""

    def __init__(self, size: int = CACHED_MONITORS) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple, Monitor] = OrderedDict()

    def get(self, key: tuple) -> Monitor | None:
        """The Monitor kept under ``key``, if any."""
        with self._lock:
            monitor = self._entries.get(key)
            if monitor is not None:
                self._entries.move_to_end(key)
            return monitor

    def put(self, key: tuple, monitor: Monitor) -> None:
        """Keep ``monitor`` under ``key`` (a later one replaces an earlier one)."""
        with self._lock:
            self._entries[key] = monitor
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)


def _histogram(question: QuestionSpec, n: int, sums: list[int]) -> Histogram:
    values = question.mechanism.statistic_values(np.asarray(sums, dtype=np.int64))
    return Histogram(question.mechanism, n, values, question)


def store_look(db: Path, config: Path, survey: SurveySpec, side: int, group: str | None) -> Look:
    """The Monitor RPC's answer from the store's release history (read only; nothing moves),
    after the survey file ``config`` is checked against the store's pinned definitions and the
    ``side`` is found readable; ``group`` is the one group read (None: all pooled) unless the
    analysis compares two."""
    with StoreReader(db) as reader:
        reader.check_definitions({survey.id: survey}, config)
        confirmations.check_readable(reader.connection, survey, side)
    cache = MonitorCache()  # each refresh continues the e-processes

    def look(w: Watched, with_path: bool = False) -> MonitorAnswer | Waiting:
        question = survey.question(w.question)
        groups = list(w.groups) if w.groups else [group or ""]
        streams = [cells(survey, question.id, side, g) for g in groups]
        watched = monitored(
            w.analysis, question, streams, alpha=w.alpha, p0=w.p0, max_n=w.max_n, scores=w.scores
        )
        try:
            status = from_history(
                functools.partial(release_history.read, str(db)),
                watched,
                with_path=with_path,
                cache=cache,
            )
        except InsufficientDataError as exc:
            return Waiting(one_line(str(exc)))
        return monitor_answer(status, question)

    return look
