"""The Collector servicer: serves survey definitions and takes randomized reports.

An upload is screened on its raw bytes, authenticated where its survey requires it, validated
field by field (status codes as in docs/wire.md), admitted within the upload limits, stored with
group commit, and acknowledged only after the transaction holding it committed.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence

import grpc
from google.protobuf.message import DecodeError

from aggregator.service.collector import wire
from aggregator.service.collector.answers import (
    encode_upload_response,
    report_result,
    retry_after_ms,
    retry_hint,
    stream_response,
)
from aggregator.service.collector.device_auth import UNSIGNED, DeviceAuthenticator
from aggregator.service.collector.limits import (
    Admission,
    KeyPseudonyms,
    LimitExceededError,
    UploadGuard,
    limit_key,
)
from aggregator.service.collector.observe import INVALID_CODES, CallOutcome, Observer
from aggregator.service.collector.streams import StreamBudget, StreamLimitError, StreamLimits
from aggregator.service.status import abort, shortened, status_of
from aggregator.store import ingest
from aggregator.store.checks import Rejection, ReportRejectedError
from aggregator.store.contract import Store
from aggregator.store.errors import (
    ConfirmationClosedError,
    StoreError,
    StoreFailedError,
    StoreUnavailableError,
)
from aggregator.store.ingest import REPORT_ID_BYTES
from aggregator.store.model import (
    CONFLICT,
    DUPLICATE,
    STORED,
    ReportBatch,
    StoredReport,
    batches_of,
)
from client.device.transport import RETRY_AFTER_KEY
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

log = logging.getLogger(__name__)

MAX_REPORTS_PER_REQUEST = 10_000
NOT_AN_UPLOAD = "the request is not a valid ldp.v1.UploadRequest"
#: Retry hint of an upload the store could not take (a restart is needed, which takes seconds).
STORE_RETRY_AFTER_MS = 5000


class Collector(ldp_pb2_grpc.CollectorServicer):
    """Serves survey definitions and ingests randomized reports: authenticated where a survey
    requires it, within the upload limits, acknowledged after commit."""

    def __init__(
        self,
        surveys: dict[str, SurveySpec],
        store: Store,
        guard: UploadGuard,
        auth: DeviceAuthenticator | None = None,
        pseudonym: Callable[[str], str] | None = None,
        on_store_failure: Callable[[str], None] = lambda reason: None,
        observer: Observer | None = None,
    ) -> None:
        """``pseudonym`` turns a limit key into what the limits keep (a keyed hash; by default
        with a secret that lives as long as this object); ``on_store_failure(reason)`` runs when
        the store stops acknowledging (the server turns health NOT_SERVING); ``observer``
        records every upload call (metrics, access log)."""
        self._on_store_failure = on_store_failure
        self.observer = observer or Observer()
        self._surveys = surveys
        self._store = store
        self._guard = guard
        self._auth = auth or DeviceAuthenticator(surveys, {})  # no enrolled devices
        self._pseudonym = pseudonym or KeyPseudonyms(os.urandom(KeyPseudonyms.SECRET_BYTES))
        #: Reports refused as CONFLICT since start (an id resent with other content): a device
        #: with a report-id bug shows here (docs/wire.md §6).
        self.conflicts = 0

    async def GetSurvey(self, request, context):
        survey = self._surveys.get(request.survey_id)
        if survey is None:
            await abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                shortened(f"unknown survey {request.survey_id!r}"),
            )
        return survey.to_proto(key_digests=True)  # a device checks its design key with them

    async def ListSurveys(self, request, context):
        """Every survey, without design key digests (up to 800,000 bytes each: a listing of
        several would not fit a message; a device fetches its survey with GetSurvey)."""
        return ldp_pb2.ListSurveysResponse(surveys=[s.to_proto() for s in self._surveys.values()])

    async def Upload(self, request, context, outcome: CallOutcome | None = None):
        """A unary upload, all or nothing. Its raw bytes passed :meth:`screen` first (the only
        registration is the byte-level one of ``handlers.py``): it holds 1 to
        MAX_REPORTS_PER_REQUEST reports and was not shed; authenticate, validate, admit, commit,
        answer."""
        outcome = outcome or CallOutcome()
        reports = request.reports
        device = await self._auth.authenticate_upload(context, reports)
        try:
            upload = ingest.validate_upload(reports, self._surveys)
            admission = await self._guard.admit(
                self._limit_key(context, device), upload.batches, self._stored_ids
            )
        except ReportRejectedError as exc:
            await context.abort(status_of(exc.reason), shortened(exc.message))
        except LimitExceededError as exc:
            await self._refuse(context, exc)
        flags = await self._committed(context, upload.batches, admission)
        outcome.add("accepted", flags.count(STORED))
        outcome.add("duplicate", flags.count(DUPLICATE))
        outcome.add("conflict", flags.count(CONFLICT))
        self.observer.stored(upload.batches, flags)
        return encode_upload_response(upload.report_ids, upload.in_request_order(flags))

    async def screen(
        self,
        raw: bytes,
        context,
        *,
        allow_empty: bool = False,
        outcome: CallOutcome | None = None,
    ) -> int:
        """Refuse an upload on its raw bytes, before protobuf builds anything: malformed framing
        (INVALID_ARGUMENT), no reports, more than MAX_REPORTS_PER_REQUEST (RESOURCE_EXHAUSTED;
        counting stops there), or an overloaded store (shed with a retry hint). The count.
        A unary upload (all or nothing) is also refused at its first report too short to hold a
        report id, with the answer validation gives that report. A stream message
        (``allow_empty``) may be empty, and its invalid reports are REJECTED one by one later.
        ``outcome`` counts the reports received (and, when shed, as shed)."""
        min_length = 0 if allow_empty else wire.MIN_VALID_REPORT_BYTES
        try:
            n = wire.count_reports(raw, MAX_REPORTS_PER_REQUEST, min_length=min_length)
        except wire.WireFormatError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, NOT_AN_UPLOAD)
        except wire.ShortReportError as exc:
            code, message = _short_report(exc)
            await context.abort(code, message)
        if n == 0 and not allow_empty:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the request has no reports")
        if n > MAX_REPORTS_PER_REQUEST:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"at most {MAX_REPORTS_PER_REQUEST} reports per request",
            )
        if outcome is not None:
            outcome.received += n
        try:
            self._guard.check_load(n)
        except LimitExceededError as exc:
            if outcome is not None:
                outcome.add("shed", n)
            await self._refuse(context, exc)
        return n

    async def UploadStream(
        self,
        request_iterator: AsyncIterator,
        context,
        budget: StreamBudget | None = None,
        outcome: CallOutcome | None = None,
    ):
        """Each message is admitted as it arrives: a signed stream's messages each carry their
        own signature and are verified before anything of them is kept; the response lists every
        report's result unless that would pass the message limit (then only REJECTED ones, with
        counts of the rest)."""
        signed = await self._auth.open_stream(context)
        key = self._limit_key(context, None if signed is None else signed.device_id)
        results: list[ldp_pb2.ReportResult | None] = []
        pending: list[tuple[list[int], asyncio.Future]] = []
        budget = budget or StreamBudget(StreamLimits())
        async for request in request_iterator:
            if signed is not None:
                await self._auth.verify_message(context, signed, request)
            slots, batches = self._validate_each(request.reports, results, signed is not None)
            refused = len(request.reports) - len(slots)
            if batches and not await self._admit_message(
                context, key, slots, batches, results, pending
            ):
                refused = len(request.reports)
            try:
                budget.reject(refused)
            except StreamLimitError as exc:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        for slots, future in pending:
            for slot, result in zip(slots, await future, strict=True):
                results[slot] = result
        answered = [result for result in results if result is not None]
        assert len(answered) == len(results), "a report's commit filled no result"
        if outcome is not None:
            outcome.counts.update(_result_kind(result) for result in answered)
        return stream_response(answered)

    def _validate_each(
        self,
        reports: Sequence[ldp_pb2.Report],
        results: list[ldp_pb2.ReportResult | None],
        signed: bool,
    ) -> tuple[list[int], list[ReportBatch]]:
        """Validate a stream message (in bulk when all of it is valid); append a REJECTED result
        per invalid report and a placeholder per valid one to ``results``; return the valid
        reports in bulk form and their placeholders' slots, in the batches' order. In an
        unsigned stream, a report of a survey that requires device authentication is REJECTED
        with UNAUTHENTICATED; one that reuses the id of an earlier report of the same message
        with other content is REJECTED with INVALID_ARGUMENT."""
        start = len(results)
        if signed or not self._auth.required(reports):
            try:
                upload = ingest.validate_upload(reports, self._surveys)
            except ReportRejectedError:
                pass
            else:
                results.extend([None] * len(reports))
                return [start + p for ps in upload.positions for p in ps], upload.batches
        slots: list[int] = []
        valid: list[StoredReport] = []
        first: dict[bytes, tuple[str, str, bytes]] = {}
        for report in reports:
            try:
                content = (report.survey_id, report.question_id, report.payload)
                if first.setdefault(report.report_id, content) != content:
                    raise ReportRejectedError(Rejection.REUSED_ID, ingest.REUSED_ID)
                if not signed and self._auth.required((report,)):
                    raise ReportRejectedError(Rejection.UNSIGNED, UNSIGNED)
                valid.append(ingest.validate(report, self._surveys))
            except ReportRejectedError as exc:
                results.append(
                    ldp_pb2.ReportResult(
                        report_id=report.report_id[:REPORT_ID_BYTES],
                        status=ldp_pb2.REJECTED,
                        code=status_of(exc.reason).name,
                        reason=shortened(exc.message),
                    )
                )
            else:
                slots.append(len(results))
                results.append(None)
        return slots, batches_of(valid)

    async def _admit_message(
        self,
        context,
        key: str,
        slots: list[int],
        batches: list[ReportBatch],
        results: list[ldp_pb2.ReportResult | None],
        pending: list[tuple[list[int], asyncio.Future]],
    ) -> bool:
        """Admit one stream message's valid reports and queue them (True); refused ones are
        REJECTED with RESOURCE_EXHAUSTED and the retry delay, if waiting helps, or with
        FAILED_PRECONDITION for a device's second answer to a question (False)."""
        try:
            admission = await self._guard.admit(key, batches, self._stored_ids)
        except ReportRejectedError as exc:  # a repeated answer (one answer per device)
            for slot, report_id in zip(slots, _ids(batches), strict=True):
                results[slot] = ldp_pb2.ReportResult(
                    report_id=report_id,
                    status=ldp_pb2.REJECTED,
                    code=status_of(exc.reason).name,
                    reason=shortened(exc.message),
                )
            return False
        except LimitExceededError as exc:
            wait = retry_after_ms(exc)
            for slot, report_id in zip(slots, _ids(batches), strict=True):
                results[slot] = ldp_pb2.ReportResult(
                    report_id=report_id,
                    status=ldp_pb2.REJECTED,
                    code=grpc.StatusCode.RESOURCE_EXHAUSTED.name,
                    reason=str(exc),
                    retry_after_ms=wait,
                )
            return False
        pending.append((slots, asyncio.ensure_future(self._store_all(context, batches, admission))))
        return True

    def _limit_key(self, context, device: str | None) -> str:
        """Who the per-device limits count this call as (a keyed hash); empty when no survey has
        per-device limits, which spares every call the lookup."""
        if not self._guard.per_device:
            return ""
        return self._pseudonym(limit_key(context, device))

    async def _refuse(self, context, exc: LimitExceededError) -> None:
        await context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), trailing_metadata=retry_hint(exc)
        )

    async def _stored_ids(self, report_ids: list[bytes]) -> set[bytes]:
        return await asyncio.to_thread(self._store.stored_ids, report_ids)

    async def _committed(
        self, context, batches: Sequence[ReportBatch], admission: Admission
    ) -> list[int]:
        """Queue for group commit and wait until the transaction holding the reports committed;
        their store flags (STORED, DUPLICATE, CONFLICT; conflicts are counted). The admission is
        settled when the store resolves them, even if the caller gave up. A store whose writer is
        gone answers UNAVAILABLE (retryable)."""
        try:
            future = self._store.submit_batches(batches)
        except BaseException as exc:
            admission.close(None)
            if isinstance(exc, StoreError):
                await self._store_failed(context, exc)
            raise
        future.add_done_callback(admission.finish)
        try:
            flags = await asyncio.wrap_future(future)
        except StoreError as exc:
            await self._store_failed(context, exc)
        conflicts = flags.count(CONFLICT)
        if conflicts:
            self.conflicts += conflicts
            log.warning("%d report(s) refused as CONFLICT: id stored with other content", conflicts)
        return flags

    async def _store_failed(self, context, exc: StoreError) -> None:
        """Nothing of the call was acknowledged: a store that is unreachable or failed answers
        UNAVAILABLE with a retry hint (and health turns NOT_SERVING); any other store refusal
        is INTERNAL. Never UNKNOWN, never a class name. Confirmation-side reports of a survey
        whose results are sealed are FAILED_PRECONDITION (docs/wire.md §8)."""
        if isinstance(exc, ConfirmationClosedError):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, shortened(str(exc)))
        if isinstance(exc, StoreUnavailableError):
            if isinstance(exc, StoreFailedError):
                self._on_store_failure(str(exc))
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                shortened(f"the report store is unavailable: {exc}", 300),
                trailing_metadata=((RETRY_AFTER_KEY, str(STORE_RETRY_AFTER_MS)),),
            )
        log.error("store refused a commit: %s", exc)
        await context.abort(grpc.StatusCode.INTERNAL, "the report store refused the reports")

    async def _store_all(
        self, context, batches: Sequence[ReportBatch], admission: Admission
    ) -> list[ldp_pb2.ReportResult]:
        """Store a stream message's reports; one result per report, in the batches' order."""
        flags = await self._committed(context, batches, admission)
        self.observer.stored(batches, flags)
        return [
            report_result(report_id, flag)
            for report_id, flag in zip(_ids(batches), flags, strict=True)
        ]


def _result_kind(result: ldp_pb2.ReportResult) -> str:
    """How a stream report's result counts: accepted, duplicate, rejected (invalid) or refused
    (a limit, or a survey that requires signed uploads)."""
    if result.status == ldp_pb2.ACCEPTED:
        return "accepted"
    if result.status == ldp_pb2.DUPLICATE:
        return "duplicate"
    if result.status == ldp_pb2.CONFLICT:
        return "conflict"
    return "rejected" if result.code in INVALID_CODES else "refused"


def _ids(batches: Sequence[ReportBatch]) -> list[bytes]:
    """Every report id of ``batches``, in the batches' order."""
    return [report_id for batch in batches for report_id in batch.report_ids]


def _short_report(exc: wire.ShortReportError) -> tuple[grpc.StatusCode, str]:
    """The code and message of a report too short to be valid: what validating that one report
    answers (it never passes), without parsing the rest of the request."""
    try:
        ingest.validate(ldp_pb2.Report.FromString(exc.entry), {})
    except DecodeError:
        return grpc.StatusCode.INVALID_ARGUMENT, NOT_AN_UPLOAD
    except ReportRejectedError as rejected:
        return status_of(rejected.reason), shortened(f"report[{exc.index}]: {rejected.message}")
    return grpc.StatusCode.INVALID_ARGUMENT, f"report[{exc.index}] is invalid"
