"""Per-group columns of a pooled report (a survey with a public group label): each group's
estimate and interval beside the pooled one, nothing of a group below the release threshold.

The pooled histogram is the sum of the groups' histograms, so releasing the pooled estimate and
every group but one would give that one by differencing (docs/DESIGN: a release below
``min_batch_size`` must not be recoverable by differencing other releases). When the groups
withheld for their size hold between 1 and ``min_batch_size - 1`` reports together, the
smallest released groups are withheld too, until the withheld groups together reach the
threshold (complementary suppression).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aggregator.histogram import Histogram
from aggregator.stats import Estimate, estimate
from client.survey import QuestionSpec, SurveySpec

BELOW = "below release threshold"
COMPLEMENT = "withheld (differencing)"
#: What COMPLEMENT means, said once under a table that has such a column.
COMPLEMENT_NOTE = (
    "withheld (differencing): the group reaches the release threshold, but with the pooled "
    "estimate and the other groups it would reveal a group below the threshold"
)


@dataclass(frozen=True)
class GroupColumn:
    """One group's column: its estimate, or why it shows nothing (``withheld``)."""

    group: str
    n: int
    estimate: Estimate | None
    withheld: str = ""


def group_columns(
    survey: SurveySpec,
    question: QuestionSpec,
    histograms: Mapping[tuple[str, str], Histogram],
    threshold: int,
    confidence: float,
) -> tuple[GroupColumn, ...]:
    """A column per value of the survey's group label, in its declared order."""
    label = survey.group_label
    if label is None:
        return ()
    empty = Histogram.empty(question.mechanism)
    hists = {g: histograms.get((question.id, g), empty) for g in label.values}
    why = {g: BELOW for g, hist in hists.items() if hist.n < threshold}
    for g in sorted((g for g in hists if g not in why), key=lambda g: (hists[g].n, g)):
        hidden = sum(hists[h].n for h in why)
        if hidden == 0 or hidden >= threshold:
            break
        why[g] = COMPLEMENT
    return tuple(
        GroupColumn(g, hist.n, None, why[g])
        if g in why
        else GroupColumn(g, hist.n, estimate(hist, confidence))
        for g, hist in hists.items()
    )
