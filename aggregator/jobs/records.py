"""Turn framed shard records into per-question matrices of report ids and payloads, in bulk.

Records written by protobuf encoders (every supported language writes fields in number order)
share one byte layout per question: ``0a 10 <16-byte id> 12 <survey> 1a <question> 22 <payload>``,
followed by ``3a <group>`` for a survey with a public group label (each group its own layout).
Records of one length are compared column-wise with that layout, learnt from one parsed record;
rows that match are sliced into id and payload matrices without touching them one by one. Records
in any other valid encoding are parsed individually with protobuf (correct, just slower).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from google.protobuf.message import DecodeError
from numpy.lib.stride_tricks import sliding_window_view

from aggregator.jobs.framing import Block
from aggregator.store.checks import Rejection, ReportRejectedError, check_group, find_question
from aggregator.store.ingest import REPORT_ID_BYTES
from aggregator.store.shards import ShardFormatError
from client.survey import QuestionSpec, SurveySpec
from protos.ldp.v1 import ldp_pb2

QuestionKey = tuple[str, str, str]  # (survey id, question id, group; '' without a group label)
_ID_COLUMNS = slice(2, 2 + REPORT_ID_BYTES)


@dataclass(frozen=True)
class QuestionRecords:
    """Reports of one question and group: ``ids`` (m, 16) and ``payloads`` (m, payload_size),
    uint8."""

    key: QuestionKey
    ids: np.ndarray
    payloads: np.ndarray

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def classify(block: Block, surveys: dict[str, SurveySpec], name: str) -> list[QuestionRecords]:
    """Group a block's records by question (one entry per question, in first-seen order)."""
    parts: dict[QuestionKey, list[QuestionRecords]] = {}
    for length in np.unique(block.lengths):
        rows = block.starts[block.lengths == length]
        matrix = sliding_window_view(block.data, int(length))[rows]  # copies whole rows
        for part in _split_by_layout(matrix, surveys, name):
            parts.setdefault(part.key, []).append(part)
    return [_concatenate(key, group) for key, group in parts.items()]


def _split_by_layout(
    matrix: np.ndarray, surveys: dict[str, SurveySpec], name: str
) -> Iterator[QuestionRecords]:
    """Records of one length: peel off one canonical layout at a time."""
    while matrix.shape[0]:
        first = _parse(matrix[0].tobytes(), name)
        question = _question(first, surveys)
        template, payload = _template(first, question)
        if template.size != matrix.shape[1]:  # not the canonical encoding: parse each record
            yield from _parse_each(matrix, surveys, name)
            return
        fixed = np.ones(template.size, dtype=bool)  # every byte but the id and the payload
        fixed[_ID_COLUMNS] = False
        fixed[payload] = False
        same = (matrix[:, fixed] == template[fixed]).all(axis=1)
        if not same[0]:  # same length, other field order or encoding
            yield from _parse_each(matrix, surveys, name)
            return
        chosen = matrix if same.all() else matrix[same]
        yield QuestionRecords(
            (first.survey_id, first.question_id, first.group),
            chosen[:, _ID_COLUMNS],
            chosen[:, payload],
        )
        matrix = matrix[~same]


def _template(report: ldp_pb2.Report, question: QuestionSpec) -> tuple[np.ndarray, slice]:
    """The canonical bytes of a report of this question and group (zero id and payload), and
    where its payload sits in them."""
    message = ldp_pb2.Report(
        report_id=bytes(REPORT_ID_BYTES),
        survey_id=report.survey_id,
        question_id=report.question_id,
        payload=bytes(question.mechanism.payload_size),
    )
    end = message.ByteSize()
    message.group = report.group
    payload = slice(end - question.mechanism.payload_size, end)
    return np.frombuffer(message.SerializeToString(), dtype=np.uint8), payload


def _parse_each(
    matrix: np.ndarray, surveys: dict[str, SurveySpec], name: str
) -> Iterator[QuestionRecords]:
    for row in matrix:
        report = _parse(row.tobytes(), name)
        question = _question(report, surveys)
        if len(report.report_id) != REPORT_ID_BYTES:
            raise ReportRejectedError(
                Rejection.MALFORMED, f"{name}: report_id must be {REPORT_ID_BYTES} bytes"
            )
        if len(report.payload) != question.mechanism.payload_size:
            raise ReportRejectedError(Rejection.MALFORMED, f"{name}: payload length")
        yield QuestionRecords(
            (report.survey_id, report.question_id, report.group),
            np.frombuffer(report.report_id, dtype=np.uint8)[None, :],
            np.frombuffer(report.payload, dtype=np.uint8)[None, :],
        )


def _parse(record: bytes, name: str) -> ldp_pb2.Report:
    try:
        return ldp_pb2.Report.FromString(record)
    except DecodeError as exc:
        raise ShardFormatError(f"{name}: record is not an ldp.v1.Report: {exc}") from None


def _question(report: ldp_pb2.Report, surveys: dict[str, SurveySpec]) -> QuestionSpec:
    """The report's question, after its group is checked against the survey's label."""
    survey, question = find_question(surveys, report.survey_id, report.question_id)
    check_group(survey, report.group)
    return question


def _concatenate(key: QuestionKey, parts: list[QuestionRecords]) -> QuestionRecords:
    if len(parts) == 1:
        return parts[0]
    return QuestionRecords(
        key,
        np.concatenate([p.ids for p in parts]),
        np.concatenate([p.payloads for p in parts]),
    )
