"""What a wire report must fit before it counts: a survey and question the aggregator serves, the
definition it was randomized under, the survey's side, group and sampling frame. Each failure
carries a transport-neutral reason (:class:`Rejection`; ``aggregator/service/status.py`` maps
reasons to status codes)."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from client.survey import QuestionSpec, SurveyError, SurveySpec
from protos.ldp.v1 import ldp_pb2


class Rejection(enum.Enum):
    """Why a report is refused, independent of any transport (docs/wire.md §8.2 gives each its
    status code; ``aggregator/service/status.py`` holds the mapping)."""

    UNKNOWN_SURVEY = "unknown survey"
    UNKNOWN_QUESTION = "unknown question"
    STALE_DEFINITION = "randomized under another definition of the question"
    WRONG_SIDE = "a side that does not fit the survey"
    WRONG_GROUP = "a group that does not fit the survey"
    WRONG_DESIGN_KEY = "a design key that does not fit the survey's sampling frame"
    MALFORMED = "a field or payload that does not parse"
    REUSED_ID = "a report id reused for other content in the request"
    OUT_OF_RANGE = "a value the mechanism cannot produce"
    TOO_MANY_CELLS = "more report-by-category cells than one upload may expand into"
    UNSIGNED = "an unsigned report for a survey that requires signatures"
    ANSWERED_BEFORE = "a second report of a device for a question it has a report of"


@dataclass
class ReportRejectedError(Exception):
    """A report failed validation: ``reason`` says why, ``message`` names the report."""

    reason: Rejection
    message: str

    def __str__(self) -> str:
        return self.message


def find_question(surveys: dict[str, SurveySpec], survey_id: str, question_id: str):
    """The question, or a rejection (UNKNOWN_SURVEY, UNKNOWN_QUESTION)."""
    survey = surveys.get(survey_id)
    if survey is None:
        raise ReportRejectedError(Rejection.UNKNOWN_SURVEY, f"unknown survey {survey_id!r}")
    try:
        return survey, survey.question(question_id)
    except KeyError:
        raise ReportRejectedError(
            Rejection.UNKNOWN_QUESTION, f"survey {survey_id!r} has no question {question_id!r}"
        ) from None


def check_digests(question: QuestionSpec, digests: Iterable[bytes]) -> None:
    """Refuse (STALE_DEFINITION) reports randomized under another definition of the question
    than the one served and pinned; an empty digest (a device before 0.2) is taken as the
    current definition, except for a household_shared question: only a device that knows the
    tag (and so lets one respondent per household answer) commits to its digest."""
    expected = question.digest
    for digest in digests:
        if not digest and question.household_shared:
            raise ReportRejectedError(
                Rejection.STALE_DEFINITION,
                f"question {question.id!r} is household_shared: its reports must carry the "
                "definition digest (a device that enforces one respondent per household)",
            )
        if digest and digest != expected:
            raise ReportRejectedError(
                Rejection.STALE_DEFINITION,
                f"question {question.id!r} was randomized under definition {digest.hex()[:16]}, "
                f"the aggregator holds {expected.hex()[:16]}: the definition changed; fetch the "
                "survey again",
            )


def check_side(survey: SurveySpec, side: int) -> None:
    """Refuse (WRONG_SIDE) a report whose side does not fit the survey: a split survey
    needs EXPLORATION or CONFIRMATION, a survey that is not split SIDE_UNSPECIFIED. Either way
    the device holds another definition of the survey than the one served: it fetches it again."""
    if survey.split and side not in (ldp_pb2.EXPLORATION, ldp_pb2.CONFIRMATION):
        raise ReportRejectedError(
            Rejection.WRONG_SIDE,
            f"survey {survey.id!r} is split into exploration and confirmation: a report must "
            "carry its side; fetch the survey again",
        )
    if not survey.split and side != ldp_pb2.SIDE_UNSPECIFIED:
        raise ReportRejectedError(
            Rejection.WRONG_SIDE,
            f"survey {survey.id!r} is not split: a report must not carry a side; fetch the "
            "survey again",
        )


def check_group(survey: SurveySpec, group: str) -> None:
    """Refuse (WRONG_GROUP) a report whose public group does not fit the survey: one of
    its group values for a survey with a group label, empty otherwise."""
    try:
        survey.check_group(group)
    except SurveyError as exc:
        raise ReportRejectedError(Rejection.WRONG_GROUP, str(exc)) from None


def check_design_key(survey: SurveySpec, key: str) -> None:
    """Refuse (WRONG_DESIGN_KEY) a report whose design key does not fit the survey: a key of
    its sampling frame for a survey with a design, empty otherwise."""
    try:
        survey.check_design_key(key)
    except SurveyError as exc:
        raise ReportRejectedError(Rejection.WRONG_DESIGN_KEY, str(exc)) from None
