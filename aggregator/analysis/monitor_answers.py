"""Anytime-valid monitoring answers as both ways of reading give them: computed from a store's
release history (aggregator/analysis/monitoring.py, for ``watch --db``, the report and the
Analyst's Monitor RPC), or rebuilt from the Analyst's MonitorResponse (aggregator/remote/
monitoring.py, for ``--server``), so ``watch`` and the report's "as of n" section render the
same plain values whichever source they read (docs/monitoring.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aggregator.stats.anytime.status import MonitorStatus
    from aggregator.survey_file.analyses import Analysis
    from client.survey import QuestionSpec


@dataclass(frozen=True)
class Watched:
    """One analysis to watch: what the Monitor RPC takes."""

    title: str
    question: str
    analysis: str
    alpha: float = 0.05
    p0: tuple[float, ...] | None = None
    groups: tuple[str, str] | None = None
    max_n: int | None = None
    scores: tuple[float, ...] | None = None


def declared(analysis: Analysis) -> Watched:
    """The sequential analysis a survey file declares, to watch."""
    a = analysis
    return Watched(a.title, a.question_id, a.test, a.alpha, a.p0, a.groups, a.max_n)


@dataclass(frozen=True)
class MonitorTest:
    """The sequential test at the latest look: the e-value, its largest value so far, the
    anytime p-value, where the e-value first passed 1/alpha (None: not yet), its guarantee and
    method."""

    evalue: float
    max_evalue: float
    pvalue: float
    guarantee: str
    method: str
    rejected_at: int | None = None


@dataclass(frozen=True)
class MonitorLook:
    """One look (a release): its reports, the e-process there (None: no test, or past max_n)
    and, asked ``with_path``, the running estimate and confidence sequence there."""

    n: int
    log_evalue: float | None = None
    estimate: tuple[float, ...] = ()
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()


@dataclass(frozen=True)
class MonitorAnswer:
    """One monitored analysis at its latest look: per category (``labels``; "mean score" for
    mean_score's one row) the running estimate and its confidence sequence, the test (None for
    frequencies and mean_score), the stopping rule's ``decision`` (continue, reject or "stop at
    max_n"; ``max_n`` 0: none) and every look in order."""

    n: int
    labels: tuple[str, ...]
    estimate: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    interval_guarantee: str
    decision: str
    alpha: float
    max_n: int
    test: MonitorTest | None
    looks: tuple[MonitorLook, ...]


@dataclass(frozen=True)
class Waiting:
    """Why an analysis has no answer yet (nothing of its question or group released, or no
    release recorded): a state to show, not an error. ``why`` is one line."""

    why: str


#: One analysis's answer at its latest look (with the intervals at every look when asked), or
#: why there is none yet: over a server's Monitor RPC or from a store's release history.
Look = Callable[[Watched, bool], MonitorAnswer | Waiting]


def one_line(text: str) -> str:
    """``text`` on one line, its runs of white space single spaces."""
    return " ".join(text.split())


def monitor_answer(status: MonitorStatus, question: QuestionSpec) -> MonitorAnswer:
    """The answer of ``status``, an analysis of ``question`` (what the Monitor RPC sends)."""
    result = status.test
    test = None
    if result is not None:
        test = MonitorTest(
            float(result.evalue),
            float(result.max_evalue),
            float(result.pvalue),
            result.guarantee,
            result.method,
            None if result.rejected_at is None else int(result.rejected_at),
        )
    log_e = status.log_evalues
    looks = []
    for i, n in enumerate(status.look_ns):
        path = status.intervals[i] if status.intervals is not None else ((), (), ())
        estimate, low, high = (_floats(values) for values in path)
        log_evalue = float(log_e[i]) if i < len(log_e) else None
        looks.append(MonitorLook(int(n), log_evalue, estimate, low, high))
    return MonitorAnswer(
        n=int(status.n),
        labels=("mean score",) if status.analysis == "mean_score" else tuple(question.labels),
        estimate=_floats(status.estimate),
        low=_floats(status.low),
        high=_floats(status.high),
        interval_guarantee=status.interval_guarantee,
        decision=status.decision,
        alpha=float(status.alpha),
        max_n=status.max_n or 0,
        test=test,
        looks=tuple(looks),
    )


def _floats(values) -> tuple[float, ...]:
    return tuple(float(x) for x in values)
