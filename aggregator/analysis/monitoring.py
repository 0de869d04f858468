"""Anytime-valid monitoring of one question over its release history (docs/monitoring.md): the
looks are the question's released snapshots, read from the history, and each analysis's status
at the latest look is computed from those looks alone (aggregator.stats.anytime.status), its
Monitor kept between calls so a refresh costs one update per new release. The Analyst's Monitor
RPC (aggregator/service/analyst/monitor.py) answers from it over the wire; ``watch --db`` and
the report's "as of n" section read a local store through it directly (``store_look``)."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
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
        try:
            status = from_history(
                functools.partial(release_history.read, str(db)),
                w.analysis,
                question,
                streams,
                alpha=w.alpha,
                p0=None if w.p0 is None else list(w.p0),
                max_n=w.max_n,
                with_path=with_path,
                cache=cache,
                scores=None if w.scores is None else list(w.scores),
            )
        except InsufficientDataError as exc:
            return Waiting(one_line(str(exc)))
        return monitor_answer(status, question)

    return look
