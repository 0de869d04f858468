"""What a report store keeps and answers, on every engine: one validated report
(:class:`StoredReport`), one question's reports in bulk (:class:`ReportBatch`, the form every
engine's writer consumes), a validated request in that form (:class:`ValidatedUpload`), the
flags a submit resolves to, and the sizes and resolutions a stored report has."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

REPORT_ID_BYTES = 16
RECEIVED_RESOLUTION = 86_400  # received_at keeps the UTC day only: arrival seconds group uploads
CONFIRMATION = 2  # ldp.v1.CONFIRMATION

#: What the store did with one submitted report (the flags its futures resolve to). STORED is 1
#: and DUPLICATE 0, so they read as the booleans "newly stored" / "not stored" they once were.
STORED = 1  # newly stored and counted
DUPLICATE = 0  # the identical report (same id, survey, question, payload) was stored before
CONFLICT = 2  # the id is stored with another survey, question or payload: refused


@dataclass(frozen=True)
class StoredReport:
    """One validated randomized report, as the store keeps it."""

    report_id: bytes
    survey_id: str
    question_id: str
    payload: bytes
    contribution: np.ndarray  # int64, length k: what the report adds to the question's sums
    side: int = 0  # ldp.v1.Side: 0 for a survey that is not split
    group: str = ""  # the public group value; '' for a survey without a group label
    design_key: str = ""  # the public design key; '' for a survey without a design


@dataclass(frozen=True, slots=True)
class ReportBatch:
    """Validated reports of ONE question in bulk form: the shape the writer consumes without
    building an object per report. Row i of ``contributions`` (int64, shape (m, k)) is what
    report i adds to the question's sums."""

    survey_id: str
    question_id: str
    report_ids: list[bytes]
    payloads: list[bytes]
    contributions: np.ndarray
    side: int = 0  # ldp.v1.Side of every report of the batch
    group: str = ""  # the public group value of every report of the batch
    #: Each report's public design key (design_statistics); () for a survey without a design.
    design_keys: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.report_ids)


def batches_of(reports: Iterable[StoredReport]) -> list[ReportBatch]:
    """Reports as batches, one per run of consecutive reports of the same question, so the
    batches' flags concatenated are in the order of the reports. Each question's contribution
    vectors must have one length (``ReportStore.submit`` checks them first)."""
    out = []
    for (survey_id, question_id, side, group_value), run in itertools.groupby(
        reports, key=lambda r: (r.survey_id, r.question_id, r.side, r.group)
    ):
        group = list(run)
        out.append(
            ReportBatch(
                survey_id,
                question_id,
                [r.report_id for r in group],
                [r.payload for r in group],
                np.stack([r.contribution for r in group]),
                side,
                group_value,
                tuple(r.design_key for r in group) if group[0].design_key else (),
            )
        )
    return out


@dataclass(frozen=True)
class ValidatedUpload:
    """A valid request in bulk form: one batch per question (in order of first appearance),
    the report ids in request order, and where each batch's reports sit in the request."""

    report_ids: list[bytes]
    batches: list[ReportBatch]
    positions: list[list[int]]

    def in_request_order(self, flags: list[int]) -> list[int]:
        """Per-report flags given in batch order (as the store answers), in request order."""
        if len(self.batches) == 1:
            return flags
        out = [0] * len(self.report_ids)
        for position, flag in zip(
            (p for positions in self.positions for p in positions), flags, strict=True
        ):
            out[position] = flag
        return out
