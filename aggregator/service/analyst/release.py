"""What the Analyst service releases of a question (docs/threat-model.md, "What is released").

Every reading RPC (estimates, tests, two-sample tests) releases cells' snapshots
(aggregator/store/releases.py), never the live statistics: a cell's release moves only once it
has grown by ``min_batch_size`` reports, so polling before and after one upload shows nothing of
it. A pooled read of a survey with a group label is the sum of its groups' released snapshots:
the groups below the threshold contribute nothing, and the answer names the groups it sums, so
pooled minus the other groups is only ever a released group.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from aggregator.store.contract import AnalysisStore
from client.survey import SurveySpec

#: Trailing metadata key of a pooled read of a survey with a group label: the JSON list of the
#: groups whose released snapshots it sums (ASCII, escaped).
RELEASED_GROUPS_KEY = "ldp-released-groups"


@dataclass(frozen=True)
class Release:
    """What one read releases: n and the int64 sums, and for a pooled read of a survey with a
    group label the groups summed (None otherwise). n = 0: nothing is releasable."""

    n: int
    sums: np.ndarray
    groups: tuple[str, ...] | None = None

    def groups_metadata(self) -> tuple[str, str]:
        """The trailing metadata naming the groups summed."""
        return RELEASED_GROUPS_KEY, json.dumps(list(self.groups or ()))


def release(
    store: AnalysisStore, survey: SurveySpec, question_id: str, side: int, group: str
) -> Release:
    """The released statistic of ``question_id`` on ``side`` (0 for a survey that is not split)
    and of ``group`` ('': the whole question; for a survey with a group label, the sum of its
    groups' released snapshots). Blocking: call it on the analysis threads."""
    label = survey.group_label
    pooled = label.values if label is not None and not group else None
    cells = [(survey.id, question_id, side, value) for value in pooled or (group,)]
    snapshots = store.release(cells, survey.min_batch_size)
    summed = {cell[3]: snap for cell, snap in snapshots.items() if snap is not None}
    k = survey.question(question_id).statistic_size
    totals = [sum(column) for column in zip(*(sums for _, sums in summed.values()), strict=True)]
    n = sum(count for count, _ in summed.values())
    sums = np.array(totals or [0] * k, dtype=np.int64)
    return Release(n, sums, tuple(summed) if pooled else None)


def too_few(survey: SurveySpec, question_id: str, group: str) -> str:
    """Why nothing is released: the cell has fewer than ``min_batch_size`` reports (how many
    is not said: that count moves with every upload)."""
    m, label = survey.min_batch_size, survey.group_label
    name = f"{survey.id}/{question_id}"
    if label is not None and not group:
        return (
            f"no {label.name} of {name} has reached {m} reports; results are released from {m} "
            f"(pooled: the sum of the {label.name} values released)"
        )
    of = f" of {label.name} {group!r}" if label is not None else ""
    return f"{name}{of} has fewer than {m} reports; results are released from {m}"
