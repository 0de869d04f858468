"""The design-based estimate of a question of a survey with a sampling design, as the report
shows it beside the simple-random-sample estimate: Hájek shares, their design standard errors
and intervals, and the design effect split into weighting and clustering (docs/designs.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

import numpy as np

from aggregator.presentation.numbers import interval, share
from aggregator.stats.design.estimate import DesignEstimate


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
    def of(cls, est: DesignEstimate, description: str, confidence: float) -> DesignSummary:
        low, high = est.intervals(confidence)
        return cls(
            description,
            est.estimate[0],
            est.standard_error[0],
            low[0],
            high[0],
            est.deff[0],
            float(est.weighting_effect[0]),
            est.clustering_effect[0],
            est.variance_method,
        )

    @classmethod
    def post_stratified(cls, est, description: str, confidence: float) -> DesignSummary:
        """From a ``PostStratified`` estimate: no design effects (not defined after
        calibration)."""
        low, high = est.intervals(confidence)
        k = len(est.estimate)
        nan = np.full(k, np.nan)
        return cls(
            description, est.estimate, est.standard_error, low, high, nan, float("nan"), nan,
            est.variance_method,
        )  # fmt: skip

    def title(self) -> str:
        return f"Design-based estimate ({self.description}; variance: {self.variance})"

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
