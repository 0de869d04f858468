"""The report's "as of n" section: every analysis the survey file declares ``sequential = true``,
drawn over its looks (the question's releases): the confidence sequences per category, the
e-value path against 1/alpha, and a sentence saying which guarantee each number carries
(docs/monitoring.md, docs/reports.md).

The caller gives how to ask for each analysis's answer (aggregator/analysis/monitor_answers.py:
a Look over the Analyst's Monitor RPC or a store's release history, asked ``with_path``): this
module only reads the plain answers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

import numpy as np

from aggregator.analysis.monitor_answers import Waiting, declared
from aggregator.report.plots import sequence_plot

if TYPE_CHECKING:
    from aggregator.analysis.monitor_answers import Look, MonitorAnswer
    from aggregator.survey_file.analyses import Analysis

#: Looks shown in the text table at most (evenly spread, the last always among them).
TABLE_LOOKS = 12


@dataclass(frozen=True)
class SequentialSection:
    """One sequential analysis as of its latest look (``waiting``: why nothing is shown)."""

    title: str
    analysis: str
    labels: tuple[str, ...] = ()
    alpha: float = 0.05
    max_n: int = 0
    n: int = 0
    look_ns: tuple[int, ...] = ()
    estimate: np.ndarray | None = None  # looks x categories
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    log_evalues: tuple[float, ...] = ()
    evalue: float | None = None
    max_evalue: float | None = None
    pvalue: float | None = None
    rejected_at: int | None = None
    decision: str = ""
    interval_guarantee: str = ""
    test_guarantee: str = ""
    waiting: str = ""

    @classmethod
    def from_monitor(cls, title: str, analysis: str, answer: MonitorAnswer) -> SequentialSection:
        """From a Monitor answer asked ``with_path``."""
        looks = answer.looks
        test = answer.test
        return cls(
            title,
            analysis,
            answer.labels,
            answer.alpha,
            answer.max_n,
            answer.n,
            tuple(look.n for look in looks),
            np.array([list(look.estimate) for look in looks]),
            np.array([list(look.low) for look in looks]),
            np.array([list(look.high) for look in looks]),
            tuple(look.log_evalue for look in looks if look.log_evalue is not None),
            test.evalue if test else None,
            test.max_evalue if test else None,
            test.pvalue if test else None,
            test.rejected_at if test else None,
            answer.decision,
            answer.interval_guarantee,
            test.guarantee if test else "",
        )

    @property
    def what(self) -> str:
        """What the intervals are of."""
        return "difference A − B" if self.analysis == "two_sample" else "frequency"

    def sentence(self) -> str:
        """Which guarantee each number carries, and the stopping rule's verdict."""
        level = f"{100 * (1 - self.alpha):g}%"
        parts = [
            f"As of n = {self.n:,} ({len(self.look_ns)} look(s), one per release). The intervals "
            f"are a {level} confidence sequence of each category's {self.what}: time-uniform, "
            "they cover the true values at every n at once, so they stay valid however often "
            "the results are looked at and whenever collection stops. The estimates are the "
            "ordinary running estimates and carry no guarantee of their own."
        ]
        if self.evalue is not None and self.max_evalue is not None and self.pvalue is not None:
            parts.append(
                f"The e-value is {self.evalue:.3g} (largest so far {self.max_evalue:.3g}); the "
                f"anytime p-value min(1, 1 / largest e-value) = {self.pvalue:.3g} is valid at "
                f"any stopping time: under the null the e-value ever reaches "
                f"1/α = {1 / self.alpha:g} with probability at most α = {self.alpha:g}."
            )
        parts.append(self.verdict())
        return " ".join(parts)

    def verdict(self) -> str:
        if self.decision == "reject":
            return (
                f"Stopping rule: fired, reject the null (the e-value passed {1 / self.alpha:g} "
                f"at n = {self.rejected_at:,})."
            )
        if self.decision == "stop at max_n":
            return f"Stopping rule: fired, the planned maximum n = {self.max_n:,} is reached."
        if self.evalue is not None:
            planned = f" or n reaches {self.max_n:,}" if self.max_n else ""
            return (
                f"Stopping rule: not fired; collection goes on until the e-value passes "
                f"{1 / self.alpha:g}{planned}."
            )
        if self.max_n:
            return f"Stopping rule: not fired; collection goes on until n reaches {self.max_n:,}."
        return "Stopping rule: none (confidence sequences only)."


def sequential_sections(analyses: list[Analysis], look: Look) -> tuple[SequentialSection, ...]:
    """The "as of n" sections of the declared sequential ``analyses``, each asked of ``look``
    with the intervals at every look (the report's source: a server or a store)."""
    sections = []
    for analysis in analyses:
        w = declared(analysis)
        answer = look(w, True)
        if isinstance(answer, Waiting):
            waiting = f"Not shown yet: {answer.why}"
            sections.append(SequentialSection(w.title, w.analysis, waiting=waiting))
        else:
            sections.append(SequentialSection.from_monitor(w.title, w.analysis, answer))
    return tuple(sections)


def shown_looks(count: int) -> list[int]:
    """Indices of the looks the table shows: all up to TABLE_LOOKS, else spread evenly."""
    if count <= TABLE_LOOKS:
        return list(range(count))
    return sorted({round(i * (count - 1) / (TABLE_LOOKS - 1)) for i in range(TABLE_LOOKS)})


def render_html(sections: tuple[SequentialSection, ...], plots: bool) -> str:
    """The "as of n" section of the HTML page."""
    parts = [
        '<section id="as-of-n"><h2>As of n: anytime-valid monitoring</h2>',
        '<p class="note">The analyses declared <code>sequential = true</code>, computed at '
        "every release of their question (the looks). Unlike the fixed-n intervals and "
        "p-values above, these numbers keep their guarantee at every n at once: looking after "
        "every release, or stopping as soon as a result looks clear, does not inflate the "
        "error rate.</p>",
    ]
    for section in sections:
        parts.append(f"<h3>{escape(section.title)}</h3>")
        if section.waiting:
            parts.append(f'<p class="held">{escape(section.waiting)}</p>')
            continue
        parts.append(f'<p class="test">{escape(section.sentence())}</p>')
        if plots and section.low is not None:
            parts.append(f"<figure>{_plot(section)}</figure>")
        parts.append(_table(section))
    parts.append("</section>")
    return "\n".join(parts)


def _plot(section: SequentialSection) -> str:
    assert section.low is not None and section.high is not None and section.estimate is not None
    return sequence_plot(
        section.look_ns,
        section.labels,
        section.estimate,
        section.low,
        section.high,
        section.log_evalues,
        section.alpha,
        f"{section.title}: as of n",
        section.what,
    )


def _table(section: SequentialSection) -> str:
    """Per shown look: n, each category's interval, and the e-value."""
    low, high = section.low, section.high
    with_intervals = low is not None and high is not None and low.size > 0
    heads = "".join(f"<th>{escape(label)}</th>" for label in section.labels) * with_intervals
    e_head = "<th>e-value</th>" if section.log_evalues else ""
    rows = []
    for i in shown_looks(len(section.look_ns)):
        cells = ""
        if low is not None and high is not None and with_intervals:
            cells = "".join(
                f"<td>[{low[i, j]:.3f}, {high[i, j]:.3f}]</td>" for j in range(len(section.labels))
            )
        e = ""
        if section.log_evalues:
            logs = section.log_evalues
            e = f"<td>{_evalue(logs[i])}</td>" if i < len(logs) else "<td>—</td>"
        rows.append(f"<tr><td>{section.look_ns[i]:,}</td>{cells}{e}</tr>")
    return (
        f"<table><thead><tr><th>n</th>{heads}{e_head}</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def _evalue(log_e: float) -> str:
    return f"{math.exp(log_e):.3g}" if log_e < 700 else "≥ 1e304"


def render_markdown(sections: tuple[SequentialSection, ...]) -> list[str]:
    """The "as of n" section as Markdown lines (tables, no plots)."""
    lines = [
        "",
        "## As of n: anytime-valid monitoring",
        "",
        "The analyses declared `sequential = true`, at every release of their question; their "
        "guarantees hold at every n at once (looking often or stopping early does not inflate "
        "the error rate).",
    ]
    for section in sections:
        lines += ["", f"### {section.title}", ""]
        if section.waiting:
            lines.append(section.waiting)
            continue
        lines.append(section.sentence())
        low, high = section.low, section.high
        if low is None or high is None or low.size == 0:
            continue
        e_head = " e-value |" if section.log_evalues else ""
        lines += ["", "| n | " + " | ".join(section.labels) + f" |{e_head}"]
        lines.append("|---:|" + "---|" * len(section.labels) + ("---:|" if e_head else ""))
        logs = section.log_evalues
        for i in shown_looks(len(section.look_ns)):
            cells = " | ".join(
                f"[{low[i, j]:.3f}, {high[i, j]:.3f}]" for j in range(len(section.labels))
            )
            e = (f" {_evalue(logs[i])} |" if i < len(logs) else " — |") if e_head else ""
            lines.append(f"| {section.look_ns[i]:,} | {cells} |{e}")
    return lines
