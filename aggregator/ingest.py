"""How a wire report becomes part of a question's statistics: validation with the specific gRPC
status code of each failure, the report's integer contribution, and the histogram of a question
from its stored integer sums."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import numpy as np

from aggregator.histogram import Histogram
from aggregator.storage import StoredReport
from client.mechanisms import FlipComponents, RandomizedResponse, ReportRangeError
from client.survey import QuestionSpec, SurveySpec
from protos.ldp.v1 import ldp_pb2

REPORT_ID_BYTES = 16


@dataclass
class ReportRejectedError(Exception):
    """A report failed validation; ``code`` is the status the wire answers with."""

    code: grpc.StatusCode
    message: str

    def __str__(self) -> str:
        return self.message


def find_question(surveys: dict[str, SurveySpec], survey_id: str, question_id: str):
    """The question, or ReportRejectedError(NOT_FOUND)."""
    survey = surveys.get(survey_id)
    if survey is None:
        raise ReportRejectedError(grpc.StatusCode.NOT_FOUND, f"unknown survey {survey_id!r}")
    try:
        return survey, survey.question(question_id)
    except KeyError:
        raise ReportRejectedError(
            grpc.StatusCode.NOT_FOUND, f"survey {survey_id!r} has no question {question_id!r}"
        ) from None


def contribution(question: QuestionSpec, payload: bytes) -> np.ndarray:
    """Decode a payload into its int64 contribution to the question's sufficient statistic:
    a one-hot count (randomized response), the bits (flip components) or the grid values."""
    mech = question.mechanism
    try:
        report = mech.decode(payload)
    except ReportRangeError as exc:
        raise ReportRejectedError(grpc.StatusCode.OUT_OF_RANGE, str(exc)) from exc
    except ValueError as exc:
        raise ReportRejectedError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
    if isinstance(mech, RandomizedResponse):
        out = np.zeros(mech.k, dtype=np.int64)
        out[report] = 1
        return out
    return np.asarray(report, dtype=np.int64)


def validate(report: ldp_pb2.Report, surveys: dict[str, SurveySpec]) -> StoredReport:
    """Check every field of a wire report; raise ReportRejectedError with the specific code."""
    if len(report.report_id) != REPORT_ID_BYTES:
        raise ReportRejectedError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"report_id must be {REPORT_ID_BYTES} bytes, got {len(report.report_id)}",
        )
    _, question = find_question(surveys, report.survey_id, report.question_id)
    return StoredReport(
        report_id=bytes(report.report_id),
        survey_id=report.survey_id,
        question_id=report.question_id,
        payload=bytes(report.payload),
        contribution=contribution(question, report.payload),
    )


def histogram(question: QuestionSpec, n: int, sums: np.ndarray) -> Histogram:
    """The question's histogram from stored integer sums (grid units for additive noise)."""
    mech = question.mechanism
    values = np.asarray(sums, dtype=np.float64)
    if not isinstance(mech, RandomizedResponse | FlipComponents):
        values = values / mech.scale  # type: ignore[attr-defined]
    return Histogram(mech, n, values)
