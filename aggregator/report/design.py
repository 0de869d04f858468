"""The design-based estimate of a question of a survey with a sampling design, as the report
shows it: the headline table and plot (Hájek shares, their design standard errors and
intervals) with the design effect split into weighting and clustering beside, above the
simple-random-sample estimate, which is labelled as ignoring the design (docs/designs.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

import numpy as np

from aggregator.analysis.design_answers import DesignEstimateAnswer
from aggregator.presentation.numbers import interval, share


@dataclass(frozen=True)
class DesignSummary:
    """One question's design-based estimate (one domain), or why there is none (``why``)."""

    description: str  # e.g. "stratified cluster design: 12 strata, 240 PSUs, weights"
    estimate: np.ndarray | None = None
    standard_error: np.ndarray | None = None
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    deff: np.ndarray | None = None
    weighting: float = float("nan")
    clustering: np.ndarray | None = None
    variance: str = ""
    why: str = ""

    @classmethod
    def of(cls, answer: DesignEstimateAnswer) -> DesignSummary:
        """From a design-based estimate as --db and --server both give it (a post-stratified or
        raked one has no design effects: they are not defined after calibration)."""
        nan = np.full(len(answer.labels), np.nan)
        weighting = answer.weighting_effect
        return cls(
            answer.design,
            answer.estimate,
            answer.standard_error,
            answer.ci_low,
            answer.ci_high,
            nan if answer.deff is None else answer.deff,
            float("nan") if weighting is None else float(weighting[0]),
            nan if answer.clustering_effect is None else answer.clustering_effect,
            answer.variance,
        )

    def title(self) -> str:
        return f"Design-based estimate ({self.description}; variance: {self.variance})"

    def plotted(self) -> bool:
        """Whether the headline plot shows this estimate (there is one)."""
        return self.estimate is not None

    def rows(self, labels: Sequence[str], shown: Sequence[int] | np.ndarray) -> list[list[str]]:
        """Per category shown: label, estimate, s.e., interval, deff, weighting, clustering."""
        if self.estimate is None:
            return []
        parts = (self.standard_error, self.low, self.high, self.deff, self.clustering)
        se, low, high, deff, clustering = (np.asarray(p) for p in parts)
        return [
            [
                labels[j],
                share(self.estimate[j]),
                share(se[j]),
                interval(low[j], high[j]),
                _effect(deff[j]),
                _effect(self.weighting),
                _effect(clustering[j]),
            ]
            for j in shown
        ]


HEADER = ["category", "estimate", "s.e.", "interval", "deff", "weighting", "clustering"]
NOTE = (
    "deff: the design variance over a simple random sample's of the same size; weighting (Kish) "
    "times clustering make up the model design effect"
)


def design_html(
    summary: DesignSummary | None, labels: Sequence[str], shown: Sequence[int] | np.ndarray
) -> str:
    """The design-based table (empty without a design)."""
    if summary is None:
        return ""
    if summary.why:
        return f'<p class="held">No design-based estimate: {escape(summary.why)}.</p>'
    head = "".join(f"<th>{name}</th>" for name in HEADER)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>"
        for row in summary.rows(labels, shown)
    )
    return (
        f'<h3>{escape(summary.title())}</h3>\n<table class="estimate design"><thead><tr>{head}'
        f'</tr></thead><tbody>{body}</tbody></table>\n<p class="note">{escape(NOTE)}.</p>'
    )


def design_markdown(
    summary: DesignSummary | None, labels: Sequence[str], shown: Sequence[int] | np.ndarray
) -> list[str]:
    """The design-based table as Markdown lines (none without a design)."""
    if summary is None:
        return []
    if summary.why:
        return ["", f"No design-based estimate: {summary.why}."]
    lines = ["", f"{summary.title()}:", "", "| " + " | ".join(HEADER) + " |"]
    lines.append("|---|" + "---:|" * 2 + "---|" + "---:|" * 3)
    lines += ["| " + " | ".join(row) + " |" for row in summary.rows(labels, shown)]
    return [*lines, "", f"{NOTE}."]


def _effect(value: float) -> str:
    return "—" if np.isnan(value) else f"{value:.3g}"
