"""How a wire report becomes part of a question's statistics: validation by the checks of
aggregator/store/checks.py (a typed reason for each failure), the report's integer contribution,
and the histogram of a question from its stored integer sums. Requests are
validated in bulk (numpy per question), into the per-question
:class:`~aggregator.store.model.ReportBatch` form the store writes without building an object
per report."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from aggregator.histogram import Histogram
from aggregator.store.checks import (
    Rejection,
    ReportRejectedError,
    check_design_key,
    check_digests,
    check_group,
    check_side,
    find_question,
)
from aggregator.store.model import REPORT_ID_BYTES, ReportBatch, StoredReport, ValidatedUpload
from client.mechanisms import ReportRangeError
from client.survey import QuestionSpec, SurveySpec
from protos.ldp.v1 import ldp_pb2

#: The most report-by-category cells one upload may expand into for a mechanism whose statistic
#: rows are wider than its payloads (``statistic_expands``: each report's contribution is a row of
#: int64, 2^25 cells is 256 MiB). A Hadamard or local-hashing payload is a few bytes whatever k,
#: so without it 10,000 tiny reports of a k = 65,536 question would ask for 5 GiB.
MAX_SUPPORT_CELLS = 2**25


@contextmanager
def _payload_rejections() -> Iterator[None]:
    """The mechanism's decoding errors as rejections: ``ReportRangeError`` is OUT_OF_RANGE, any
    other ``ValueError`` MALFORMED."""
    try:
        yield
    except ReportRangeError as exc:
        raise ReportRejectedError(Rejection.OUT_OF_RANGE, str(exc)) from exc
    except ValueError as exc:
        raise ReportRejectedError(Rejection.MALFORMED, str(exc)) from exc


def contribution(question: QuestionSpec, payload: bytes) -> np.ndarray:
    """Decode a payload into its int64 contribution to the question's sufficient statistic
    (the mechanism's ``statistic_rows``: a one-hot count, the bits, the supported categories,
    the group's count and bit, or the grid values)."""
    mech = question.mechanism
    with _payload_rejections():
        reports = np.asarray([mech.decode(payload)])
        mech.check_accepted(reports)
    return mech.statistic_rows(reports)[0]


def validate(report: ldp_pb2.Report, surveys: dict[str, SurveySpec]) -> StoredReport:
    """Check every field of a wire report; raise ReportRejectedError with the specific code."""
    if len(report.report_id) != REPORT_ID_BYTES:
        raise ReportRejectedError(
            Rejection.MALFORMED,
            f"report_id must be {REPORT_ID_BYTES} bytes, got {len(report.report_id)}",
        )
    survey, question = find_question(surveys, report.survey_id, report.question_id)
    check_digests(question, (report.definition_digest,))
    check_side(survey, report.side)
    check_group(survey, report.group)
    check_design_key(survey, report.design_key)
    return StoredReport(
        report_id=bytes(report.report_id),
        survey_id=report.survey_id,
        question_id=report.question_id,
        payload=bytes(report.payload),
        contribution=contribution(question, report.payload),
        side=report.side,
        group=report.group,
        design_key=report.design_key,
    )


def validate_upload(
    reports: Sequence[ldp_pb2.Report], surveys: dict[str, SurveySpec]
) -> ValidatedUpload:
    """Validate a request's reports with vectorized checks per question.

    Accepts exactly what ``[validate(r, surveys) for r in reports]`` accepts; when a vectorized
    check fails the reports are re-checked one by one, and the error names the first bad one
    (``report[i]``). A report id repeated within the request must repeat the same report
    (survey, question, payload; the store answers the later copies DUPLICATE), else the request
    is refused (REUSED_ID) (docs/wire.md §6).
    """
    columns: dict[
        tuple[str, str, int, str],
        tuple[list[int], list[bytes], list[bytes], set[bytes], list[str]],
    ] = {}
    report_ids: list[bytes] = []
    for i, report in enumerate(reports):
        key = (report.survey_id, report.question_id, report.side, report.group)
        column = columns.get(key)
        if column is None:
            column = columns[key] = ([], [], [], set(), [])
        report_id = report.report_id
        column[0].append(i)
        column[1].append(report_id)
        column[2].append(report.payload)
        column[3].add(report.definition_digest)
        column[4].append(report.design_key)
        report_ids.append(report_id)
    batches = []
    try:
        for (survey_id, question_id, side, group), column in columns.items():
            _, ids, payloads, digests, keys = column
            survey, question = find_question(surveys, survey_id, question_id)
            check_digests(question, digests)
            check_side(survey, side)
            check_group(survey, group)
            for design_key in set(keys):
                check_design_key(survey, design_key)
            if set(map(len, ids)) - {REPORT_ID_BYTES}:
                raise ReportRejectedError(Rejection.MALFORMED, "report_id length")
            rows = _contributions(question, payloads)
            design_keys = tuple(keys) if survey.design is not None else ()
            batches.append(
                ReportBatch(survey_id, question_id, ids, payloads, rows, side, group, design_keys)
            )
    except ReportRejectedError:
        for i, report in enumerate(reports):  # find and name the first bad report
            try:
                validate(report, surveys)
            except ReportRejectedError as exc:
                raise ReportRejectedError(exc.reason, f"report[{i}]: {exc.message}") from None
        raise
    if len(set(report_ids)) != len(report_ids):
        check_repeats(reports)
    return ValidatedUpload(report_ids, batches, [column[0] for column in columns.values()])


REUSED_ID = "report_id is reused with another survey, question or payload in this request"


def check_repeats(reports: Sequence[ldp_pb2.Report]) -> None:
    """REUSED_ID naming the first report whose id an earlier report of the same request
    has with other content: which copy the store would keep would be arbitrary."""
    first: dict[bytes, tuple[int, tuple[str, str, bytes]]] = {}
    for i, report in enumerate(reports):
        content = (report.survey_id, report.question_id, report.payload)
        earlier, known = first.setdefault(report.report_id, (i, content))
        if known != content:
            raise ReportRejectedError(
                Rejection.REUSED_ID, f"report[{i}]: {REUSED_ID} (report[{earlier}])"
            )


def validate_batch(
    reports: Sequence[ldp_pb2.Report], surveys: dict[str, SurveySpec]
) -> list[StoredReport]:
    """:func:`validate_upload`, answered as one StoredReport per report in request order."""
    upload = validate_upload(reports, surveys)
    out: list[StoredReport | None] = [None] * len(reports)
    for batch, positions in zip(upload.batches, upload.positions, strict=True):
        keys = batch.design_keys or ("",) * len(batch)
        for i, report_id, payload, row, design_key in zip(
            positions, batch.report_ids, batch.payloads, batch.contributions, keys, strict=True
        ):
            out[i] = StoredReport(
                report_id,
                batch.survey_id,
                batch.question_id,
                payload,
                row,
                batch.side,
                batch.group,
                design_key,
            )
    return out  # type: ignore[return-value]


def _contributions(question: QuestionSpec, payloads: list[bytes]) -> np.ndarray:
    """Integer contributions (m, statistic_size) of many payloads of one question, checked in
    bulk."""
    mech = question.mechanism
    size, width = mech.payload_size, mech.statistic_size
    if any(len(p) != size for p in payloads):
        raise ReportRejectedError(Rejection.MALFORMED, "payload length")
    if mech.statistic_expands and len(payloads) * width > MAX_SUPPORT_CELLS:
        raise ReportRejectedError(
            Rejection.TOO_MANY_CELLS,
            f"at most {MAX_SUPPORT_CELLS // width} reports of question {question.id} per upload",
        )
    packed = np.frombuffer(b"".join(payloads), dtype=np.uint8).reshape(len(payloads), size)
    return mech.statistic_rows(decode_payloads(question, packed))


def decode_payloads(question: QuestionSpec, packed: np.ndarray) -> np.ndarray:
    """Check and decode a (m, payload_size) uint8 matrix of one question's payloads into the
    mechanism's stack of reports (``decode_many``, then its accepted range). Raises
    ReportRejectedError with the reason a single report would get."""
    mech = question.mechanism
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    if packed.ndim != 2 or packed.shape[1] != mech.payload_size:
        raise ReportRejectedError(Rejection.MALFORMED, "payload length")
    with _payload_rejections():
        decoded = mech.decode_many(packed)
        mech.check_accepted(decoded)
    return decoded


def sum_decoded(question: QuestionSpec, decoded: np.ndarray) -> np.ndarray:
    """The int64 sums (length statistic_size) of decoded reports, i.e. the sum of their
    contributions.
    Exact: raises OverflowError rather than wrap (possible only for enormous additive sums)."""
    try:
        return question.mechanism.statistic_sums(decoded)
    except OverflowError:
        raise OverflowError(
            f"sums of {len(decoded)} reports of {question.id} may overflow int64"
        ) from None


def histogram(question: QuestionSpec, n: int, sums: np.ndarray) -> Histogram:
    """The question's histogram from stored integer sums (grid units for additive noise)."""
    mech = question.mechanism
    return Histogram(mech, n, mech.statistic_values(sums))
