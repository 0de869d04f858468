"""The aggregator's gRPC server (grpc.aio): collection, analysis, and the standard health service.

Uploads are validated field by field (status codes as in the service conventions), stored with
group commit, and acknowledged only after the transaction holding them committed. Analysis reads
only the stored sufficient statistics and refuses to release anything below a survey's minimum
batch size.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import grpc
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from aggregator.errors import (
    ClusteredReportsError,
    IncompatibleHistogramsError,
    InsufficientDataError,
    InvalidInputError,
)
from aggregator.service import confirm_rpcs, wire
from aggregator.service.answers import (
    released,
    retry_after_ms,
    retry_hint,
    shortened,
    stream_response,
)
from aggregator.service.auth import (
    DEFAULT_WINDOW_SECONDS,
    UNSIGNED,
    DeviceAuthenticator,
)
from aggregator.service.cap_file import CapFile, CapPersistence
from aggregator.service.devices import DeviceRegistry, RegistryWatch
from aggregator.service.limits import (
    DEFAULT_MAX_INFLIGHT_REPORTS,
    Admission,
    CapCounter,
    KeyPseudonyms,
    LimitExceededError,
    UploadGuard,
    limit_key,
)
from aggregator.service.observe import INVALID_CODES, CallOutcome, Observer
from aggregator.service.rejections import status_of
from aggregator.service.store_lock import StoreLock, ensure_port_free
from aggregator.service.streams import (
    ConnectionLimits,
    StreamBudget,
    StreamLimitError,
    StreamLimits,
)
from aggregator.store import definitions, ingest
from aggregator.store.file_kind import create_private
from aggregator.store.ingest import REPORT_ID_BYTES, Rejection, ReportRejectedError
from aggregator.store.report_store import (
    CONFLICT,
    DUPLICATE,
    STORED,
    ConfirmationClosedError,
    ReportBatch,
    ReportStore,
    StoreError,
    StoreFailedError,
    StoreUnavailableError,
    batches_of,
)
from aggregator.survey_file.analyses import check_independent
from aggregator.survey_file.config import SurveyLimits
from aggregator.survey_file.groups import (
    check_same_definition,
    group_name,
    two_sample_request_problem,
)
from client.device.transport import MAX_MESSAGE_BYTES, RETRY_AFTER_KEY
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

if TYPE_CHECKING:
    from aggregator.stats.result import TestResult

log = logging.getLogger(__name__)

MAX_REPORTS_PER_REQUEST = 10_000
NOT_AN_UPLOAD = "the request is not a valid ldp.v1.UploadRequest"
#: How often an idle server checks that its store can still make reports durable.
STORE_PROBE_SECONDS = 1.0
#: Retry hint of an upload the store could not take (a restart is needed, which takes seconds).
STORE_RETRY_AFTER_MS = 5000
#: The largest GetSurvey or ListSurveys request taken (a survey id is a short name).
MAX_SMALL_REQUEST_BYTES = 4096
#: The largest GoodnessOfFit request (its p0 holds 9 bytes per category: k up to ~100,000).
MAX_ANALYST_REQUEST_BYTES = 1 << 20
SERVICE_NAMES = ("ldp.v1.Collector", "ldp.v1.Analyst")


class Store(Protocol):
    """What the servicers need from a report store: the in-process ReportStore, or a worker
    process's RemoteStore that reaches the writer process's one (``serve --workers N``)."""

    def submit_batches(self, batches: Sequence[ReportBatch]) -> Future[list[int]]: ...

    def stored_ids(self, report_ids: Sequence[bytes]) -> set[bytes]: ...

    @property
    def path(self) -> str: ...

    def statistics(
        self, survey_id: str, question_id: str, side: int = 0, group: str = ""
    ) -> tuple[int, np.ndarray]: ...

    def close(self) -> None: ...


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
            await context.abort(
                grpc.StatusCode.NOT_FOUND, shortened(f"unknown survey {request.survey_id!r}")
            )
        return survey.to_proto()

    async def ListSurveys(self, request, context):
        return ldp_pb2.ListSurveysResponse(surveys=[s.to_proto() for s in self._surveys.values()])

    async def Upload(self, request, context, outcome: CallOutcome | None = None):
        outcome = outcome or CallOutcome()
        reports = request.reports
        if not reports:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the request has no reports")
        if len(reports) > MAX_REPORTS_PER_REQUEST:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"at most {MAX_REPORTS_PER_REQUEST} reports per request, got {len(reports)}",
            )
        try:
            self._guard.check_load(len(reports))  # shed before verifying or validating anything
        except LimitExceededError as exc:
            await self._refuse(context, exc)
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
        if outcome is not None:
            outcome.counts.update(_result_kind(result) for result in results)
        return stream_response(results)

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
        slots, valid, first = [], [], {}
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
        REJECTED with RESOURCE_EXHAUSTED and the retry delay, if waiting helps (False)."""
        try:
            admission = await self._guard.admit(key, batches, self._stored_ids)
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
            _result(report_id, flag) for report_id, flag in zip(_ids(batches), flags, strict=True)
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
    return [report_id for batch in batches for report_id in batch.report_ids]


CONFLICT_REASON = "this report id is stored with another survey, question or payload"


def _result(report_id: bytes, flag: int) -> ldp_pb2.ReportResult:
    """The result of a report the store answered with ``flag``."""
    if flag == CONFLICT:
        return ldp_pb2.ReportResult(
            report_id=report_id, status=ldp_pb2.CONFLICT, reason=CONFLICT_REASON
        )
    status = ldp_pb2.ACCEPTED if flag == STORED else ldp_pb2.DUPLICATE
    return ldp_pb2.ReportResult(report_id=report_id, status=status)


_ACCEPTED_TAIL = b"\x10" + bytes([ldp_pb2.ACCEPTED])
_DUPLICATE_TAIL = b"\x10" + bytes([ldp_pb2.DUPLICATE])
_RESULT_HEAD = b"\x0a\x14\x0a\x10"  # results: 20 bytes long; its report_id: 16 bytes long


def encode_upload_response(report_ids: Sequence[bytes], flags: Sequence[int]) -> bytes:
    """The serialized UploadResponse of an upload, written directly when no report conflicts:
    one fixed 22-byte record per report (tag + length of the result, tag + length + 16-byte
    report_id, tag + status), several times cheaper than building a message per report. The
    report ids must be 16 bytes long (validation guarantees it). With a conflict (rare: a
    device bug), the message is built the ordinary way, with its reason."""
    if CONFLICT in flags:
        results = [_result(rid, flag) for rid, flag in zip(report_ids, flags, strict=True)]
        return ldp_pb2.UploadResponse(results=results).SerializeToString()
    return b"".join(
        [
            _RESULT_HEAD + report_id + (_ACCEPTED_TAIL if flag else _DUPLICATE_TAIL)
            for report_id, flag in zip(report_ids, flags, strict=True)
        ]
    )


async def _parse(context, message_type, raw: bytes):
    """A request message from its bytes; bytes that do not parse as ``message_type`` are
    INVALID_ARGUMENT (grpc's own deserializer would answer UNKNOWN and log a traceback)."""
    try:
        return message_type.FromString(raw)
    except DecodeError:
        name = message_type.DESCRIPTOR.full_name
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid {name}")


async def screened_stream(
    collector: Collector,
    context,
    raw_messages: AsyncIterator[bytes],
    budget: StreamBudget,
    outcome: CallOutcome | None = None,
) -> AsyncIterator[ldp_pb2.UploadRequest]:
    """A stream's messages, each screened on its raw bytes (:meth:`Collector.screen`) and
    charged to the stream's budget before it is parsed; the duration limit also bounds the wait
    for the next message, so a stream that sends nothing is ended too."""
    messages = aiter(raw_messages)
    while True:
        try:
            raw = await asyncio.wait_for(anext(messages), budget.remaining())
        except StopAsyncIteration:
            return
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(budget.expired()))
        count = await collector.screen(raw, context, allow_empty=True, outcome=outcome)
        try:
            budget.take(len(raw), count)
        except StreamLimitError as exc:
            code = grpc.StatusCode.DEADLINE_EXCEEDED if exc.deadline else None
            await context.abort(code or grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        request = await _parse(context, ldp_pb2.UploadRequest, raw)
        raw = None
        yield request


def _unary(method, request_type, response_serializer, max_bytes: int):
    """A unary handler that refuses a request over ``max_bytes`` and parses the rest itself
    (see :func:`_parse`); with a None ``response_serializer`` the method returns bytes already
    serialized. A refusal is released from the handler's frames (:func:`released`)."""

    async def handle(raw: bytes, context):
        try:
            if len(raw) > max_bytes:
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"request of {len(raw)} bytes; this call takes at most {max_bytes}",
                )
            request = await _parse(context, request_type, raw)
            raw = None
            return await method(request, context)
        except BaseException as exc:
            raw = request = None
            raise released(exc) from None

    return grpc.unary_unary_rpc_method_handler(handle, response_serializer=response_serializer)


def _register(server: grpc.aio.Server, name: str, handlers: dict) -> None:
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)


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


def add_collector_to_server(
    collector: Collector, server: grpc.aio.Server, streams: StreamLimits | None = None
) -> None:
    """Register the Collector as the generated ``add_CollectorServicer_to_server`` does, except
    that requests arrive as bytes and are screened before protobuf parses them: sizes per RPC,
    the number of reports of an upload counted on the raw bytes (:mod:`.wire`), load shedding;
    an unparseable request is INVALID_ARGUMENT; Upload returns bytes already serialized by
    :func:`encode_upload_response`; UploadStream enforces ``streams`` (see :mod:`.streams`);
    every upload call is reported to the collector's observer (metrics, access log)."""
    streams = streams or StreamLimits()

    async def upload(raw: bytes, context):
        outcome = CallOutcome()
        try:
            await collector.screen(raw, context, outcome=outcome)
            request = await _parse(context, ldp_pb2.UploadRequest, raw)
            raw = None
            return await collector.Upload(request, context, outcome)
        except BaseException as exc:
            raw = request = None
            raise released(exc) from None
        finally:
            collector.observer.finished("Upload", context, outcome)

    async def upload_stream(raw_messages: AsyncIterator[bytes], context):
        budget = StreamBudget(streams)
        outcome = CallOutcome()
        messages = screened_stream(collector, context, raw_messages, budget, outcome)
        try:
            return await collector.UploadStream(messages, context, budget, outcome)
        except BaseException as exc:
            raise released(exc) from None
        finally:
            collector.observer.finished("UploadStream", context, outcome)

    handlers = {
        "GetSurvey": _unary(
            collector.GetSurvey,
            ldp_pb2.GetSurveyRequest,
            ldp_pb2.Survey.SerializeToString,
            MAX_SMALL_REQUEST_BYTES,
        ),
        "ListSurveys": _unary(
            collector.ListSurveys,
            ldp_pb2.ListSurveysRequest,
            ldp_pb2.ListSurveysResponse.SerializeToString,
            MAX_SMALL_REQUEST_BYTES,
        ),
        "Upload": grpc.unary_unary_rpc_method_handler(upload),
        "UploadStream": grpc.stream_unary_rpc_method_handler(
            upload_stream,
            response_serializer=ldp_pb2.UploadResponse.SerializeToString,
        ),
    }
    _register(server, SERVICE_NAMES[0], handlers)


def add_analyst_to_server(analyst: Analyst, server: grpc.aio.Server) -> None:
    """Register the Analyst as the generated ``add_AnalystServicer_to_server`` does, except that
    requests are parsed in the handler (an unparseable one is INVALID_ARGUMENT)."""
    handlers = {
        "Estimate": _unary(
            analyst.Estimate,
            ldp_pb2.EstimateRequest,
            ldp_pb2.EstimateResponse.SerializeToString,
            MAX_SMALL_REQUEST_BYTES,
        ),
        "GoodnessOfFit": _unary(
            analyst.GoodnessOfFit,
            ldp_pb2.GoodnessOfFitRequest,
            ldp_pb2.TestResponse.SerializeToString,
            MAX_ANALYST_REQUEST_BYTES,
        ),
        "Independence": _unary(
            analyst.Independence,
            ldp_pb2.IndependenceRequest,
            ldp_pb2.TestResponse.SerializeToString,
            MAX_SMALL_REQUEST_BYTES,
        ),
        "Preregister": _unary(
            analyst.Preregister,
            ldp_pb2.PreregisterRequest,
            ldp_pb2.PreregisterResponse.SerializeToString,
            MAX_ANALYST_REQUEST_BYTES,
        ),
        "Confirm": _unary(
            analyst.Confirm,
            ldp_pb2.ConfirmRequest,
            ldp_pb2.ConfirmResponse.SerializeToString,
            MAX_SMALL_REQUEST_BYTES,
        ),
        "HoldoutTest": _unary(
            analyst.HoldoutTest,
            ldp_pb2.HoldoutRequest,
            ldp_pb2.HoldoutResponse.SerializeToString,
            MAX_ANALYST_REQUEST_BYTES,
        ),
        "TwoSample": _unary(
            analyst.TwoSample,
            ldp_pb2.TwoSampleRequest,
            ldp_pb2.TestResponse.SerializeToString,
            MAX_SMALL_REQUEST_BYTES,
        ),
    }
    _register(server, SERVICE_NAMES[1], handlers)


#: Trailing metadata of a read of a survey with a group label that pools every group.
POOLED_METADATA = ("ldp-groups", "pooled")


class Analyst(ldp_pb2_grpc.AnalystServicer):
    """Estimates and tests computed from stored sufficient statistics."""

    def __init__(self, surveys: dict[str, SurveySpec], store: Store) -> None:
        self._surveys = surveys
        self._store = store

    async def _released(
        self,
        context,
        survey_id: str,
        question_id: str,
        side: int = 0,
        group: str = "",
        *,
        test: bool = False,
    ):
        """The question's histogram on the requested side (confirm_rpcs.read_side) and of one
        public ``group`` ('': all groups pooled), if the survey's minimum batch size is reached
        (by the group); for a ``test``, FAILED_PRECONDITION if its reports may be clustered by
        household (privacy-accounting spec §D.3). A group the survey does not declare is
        INVALID_ARGUMENT."""
        try:
            survey, question = ingest.find_question(self._surveys, survey_id, question_id)
            if group:
                ingest.check_group(survey, group)
        except ReportRejectedError as exc:
            await context.abort(status_of(exc.reason), shortened(exc.message))
        if test:
            try:
                check_independent(survey, question)
            except ClusteredReportsError as exc:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, shortened(str(exc)))
        side = await confirm_rpcs.read_side(context, self._store, survey, side)
        if survey.group_label is not None and not group:  # every group pooled: say so
            labels = [POOLED_METADATA]
            if side == ldp_pb2.EXPLORATION:
                labels.append(confirm_rpcs.EXPLORATORY_METADATA)
            context.set_trailing_metadata(tuple(labels))
        n, sums = await asyncio.to_thread(
            self._store.statistics, survey_id, question_id, side, group
        )
        if n < survey.min_batch_size:
            of = f" of {survey.group_label.name} {group!r}" if group else ""  # type: ignore[union-attr]
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{survey_id}/{question_id} has {n} reports{of}; results are released from "
                f"{survey.min_batch_size}",
            )
        return question, ingest.histogram(question, n, sums)

    async def Estimate(self, request, context):
        question, hist = await self._released(
            context, request.survey_id, request.question_id, request.side, request.group
        )
        confidence = request.confidence or 0.95
        est = await _analyse(context, "estimate", hist, confidence)
        return ldp_pb2.EstimateResponse(
            n=est.n,
            labels=question.labels,
            frequencies=est.frequencies,
            standard_errors=est.standard_errors,
            ci_low=est.ci_low,
            ci_high=est.ci_high,
            confidence=est.confidence,
            mechanism=est.mechanism,
            projected=est.projected(),
            interval_method=est.interval_method,
        )

    async def GoodnessOfFit(self, request, context):
        _, hist = await self._released(
            context, request.survey_id, request.question_id, request.side, request.group, test=True
        )
        result = await _analyse(
            context,
            "goodness_of_fit",
            hist,
            np.asarray(request.p0, dtype=float),
            request.alpha or 0.05,
            request.method or None,
            **_calibration(request),
        )
        return test_response(result)

    async def Independence(self, request, context):
        question, hist = await self._released(
            context, request.survey_id, request.question_id, request.side, request.group, test=True
        )
        if len(question.shape) != 2:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"question {question.id!r} has {len(question.shape)} attribute(s); "
                "independence needs exactly 2",
            )
        result = await _analyse(
            context,
            "independence",
            hist,
            question.shape,
            request.alpha or 0.05,
            request.method or None,
            **_calibration(request),
        )
        return test_response(result)

    async def Preregister(self, request, context):
        return await confirm_rpcs.preregister(context, self._store, self._surveys, request)

    async def Confirm(self, request, context):
        return await confirm_rpcs.confirm(context, self._store, self._surveys, request)

    async def HoldoutTest(self, request, context):
        return await confirm_rpcs.holdout_test(context, self._store, self._surveys, request)

    async def TwoSample(self, request, context):
        groups = (request.group_a, request.group_b)
        survey_b = request.survey_b or (request.survey_a if any(groups) else "")
        question_b = request.question_b or (request.question_a if any(groups) else "")
        problem = two_sample_request_problem(
            (request.survey_a, request.question_a, request.group_a),
            (survey_b, question_b, request.group_b),
        )
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        question_a, hist_a = await self._released(
            context, request.survey_a, request.question_a, group=request.group_a, test=True
        )
        question_b, hist_b = await self._released(
            context, survey_b, question_b, group=request.group_b, test=True
        )
        names = (
            group_name(request.survey_a, request.question_a, request.group_a),
            group_name(survey_b, question_b, request.group_b),
        )
        try:
            check_same_definition(question_a, question_b, names)
        except IncompatibleHistogramsError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        result = await _analyse(
            context,
            "two_sample",
            hist_a,
            hist_b,
            request.alpha or 0.05,
            **_calibration(request),
        )
        return test_response(result)


def _calibration(request) -> dict:
    """The calibration and seed arguments of a test request ("auto" when unset)."""
    seed = request.seed if request.HasField("seed") else None
    return {"calibration": request.calibration or "auto", "rng": seed}


async def _analyse(context, function: str, *args, **kwargs):
    """Run ``aggregator.stats.<function>`` off the event loop; user errors become specific status
    codes."""
    try:
        return await asyncio.to_thread(_call_stats, function, *args, **kwargs)
    except InsufficientDataError as exc:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    except (InvalidInputError, ValueError) as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


def _call_stats(function: str, *args, **kwargs):
    """The statistics package is imported on first use, in a worker thread: it pulls in SciPy,
    which would add about a second to every start (health SERVING comes later after a crash) and
    would stall the event loop if imported there."""
    from aggregator import stats

    return getattr(stats, function)(*args, **kwargs)


def test_response(result: TestResult) -> ldp_pb2.TestResponse:
    message = ldp_pb2.TestResponse(
        statistic=result.statistic,
        pvalue=result.pvalue,
        method=result.method,
        n=result.n,
        alpha=result.alpha,
        reject=result.reject,
        inconclusive=result.inconclusive,
        reason=result.reason,
        expected=result.expected,
        observed=result.observed,
        mechanism=result.mechanism,
        calibration=result.calibration,
        calibration_reason=result.calibration_reason,
    )
    if result.dof is not None:
        message.dof = result.dof
    if result.n_draws is not None:
        message.n_draws = result.n_draws
    return message


test_response.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


@dataclass
class RunningServer:
    """A started aggregator: its port, and how to stop it gracefully."""

    server: grpc.aio.Server
    port: int
    store: Store
    health: health.aio.HealthServicer
    lock: StoreLock | None = None
    caps: CapPersistence | None = None
    registry: RegistryWatch | None = None
    watchdog: asyncio.Task | None = None

    async def stop(self, grace: float = 5.0) -> None:
        """Report NOT_SERVING, drain in-flight calls for up to ``grace`` seconds, close the store
        (which commits everything already queued), release the store's lock."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        if self.watchdog is not None:
            self.watchdog.cancel()
            await asyncio.gather(self.watchdog, return_exceptions=True)
        if self.registry is not None:
            await self.registry.close()
        if self.caps is not None:
            await self.caps.close()
        await asyncio.to_thread(self.store.close)
        if self.lock is not None:
            self.lock.release()


def open_store(
    surveys: dict[str, SurveySpec],
    db_path: str,
    *,
    max_delay: float = 0.002,
    on_commit: Callable[[float, int], None] | None = None,
) -> ReportStore:
    """Open the report store (its files private to their owner: 0600), check every question of
    the surveys against its pinned definition (aggregator/store/definitions.py) and register it."""
    create_private(db_path)
    for suffix in ("-wal", "-shm"):
        if os.path.exists(db_path + suffix):
            create_private(db_path + suffix)
    store = ReportStore(db_path, max_delay=max_delay, on_commit=on_commit)
    try:
        definitions.register(store, surveys)
    except BaseException:
        store.close()
        raise
    return store


async def start_server(
    surveys: dict[str, SurveySpec],
    db_path: str,
    address: str = "127.0.0.1:0",
    *,
    reflection: bool = False,
    credentials: grpc.ServerCredentials | None = None,
    max_delay: float = 0.002,
    device_keys: Mapping[str, Ed25519PublicKey] | None = None,
    auth_window: float = DEFAULT_WINDOW_SECONDS,
    limits: Mapping[str, SurveyLimits] | None = None,
    max_inflight_reports: int = DEFAULT_MAX_INFLIGHT_REPORTS,
    streams: StreamLimits | None = None,
    connections: ConnectionLimits | None = None,
    observer: Observer | None = None,
    devices: str | os.PathLike[str] | None = None,
) -> RunningServer:
    """Open the store, register every question, and start serving on ``address``.

    ``credentials`` (see ``aggregator.service.tls.server_credentials``) switch on TLS or mTLS;
    ``device_keys`` are the enrolled Ed25519 keys that signed uploads are verified with, and
    ``auth_window`` the allowed clock difference of a signature in seconds. ``limits`` are the
    surveys' per-device limits (their counts persist in ``<db>.caps``, under keyed hashes);
    ``max_inflight_reports`` bounds the reports waiting for the store, past which uploads are
    shed (RESOURCE_EXHAUSTED with a retry hint). ``streams`` and ``connections`` bound each
    client stream and each HTTP/2 connection (defaults: :mod:`.streams`, docs/limits.md).
    ``observer`` records uploads and commits (metrics, access log; default: nothing).
    ``devices`` is the device registry file: its keys replace ``device_keys``, and are reloaded
    when it changes (revocation without a restart).
    """
    observer = observer or Observer()
    lock = StoreLock(db_path)  # before anything is opened: one server per store
    try:
        caps = CapFile.beside(db_path)
        caps.adopt_legacy(db_path)
        store = open_store(
            surveys, db_path, max_delay=max_delay, on_commit=observer.recorder.commit
        )
    except BaseException:
        lock.release()
        raise
    try:
        guard = UploadGuard(
            limits or {}, CapCounter(caps.load()), max_inflight_reports=max_inflight_reports
        )
        registry = None
        if devices is not None:
            with DeviceRegistry(devices) as opened:
                device_keys = opened.active_keys()
        auth = DeviceAuthenticator(surveys, device_keys or {}, window=auth_window)
        if devices is not None:
            registry = RegistryWatch(devices, auth.replace_keys)
        running = await serve(
            surveys,
            store,
            address,
            guard=guard,
            reflection=reflection,
            credentials=credentials,
            auth=auth,
            observer=observer,
            pseudonym=KeyPseudonyms.beside(db_path),
            streams=streams,
            connections=connections,
        )
    except BaseException:
        store.close()
        lock.release()
        raise
    running.lock = lock
    if registry is not None:
        running.registry = registry
        registry.start()
    running.caps = CapPersistence(caps, guard.changed_counts, guard.keep_changed)
    running.caps.start()
    return running


async def serve(
    surveys: dict[str, SurveySpec],
    store: Store,
    address: str,
    *,
    reflection: bool = False,
    credentials: grpc.ServerCredentials | None = None,
    guard: UploadGuard | None = None,
    auth: DeviceAuthenticator | None = None,
    pseudonym: Callable[[str], str] | None = None,
    share_port: bool = False,
    observer: Observer | None = None,
    streams: StreamLimits | None = None,
    connections: ConnectionLimits | None = None,
) -> RunningServer:
    """Start serving on ``address`` from an open store (see :func:`start_server` for the
    security and limit arguments; ``guard`` defaults to load shedding only). ``share_port`` lets
    several processes listen on one port (SO_REUSEPORT; the kernel spreads connections over
    them); otherwise it is off, so a second server on a busy port fails instead of silently
    taking half its traffic."""
    guard = guard or UploadGuard({}, CapCounter())
    connections = connections or ConnectionLimits()
    server = grpc.aio.server(
        options=[
            # The largest message of any RPC: an Upload of MAX_REPORTS_PER_REQUEST reports fits
            # with room to spare; the smaller RPCs have their own bounds in their handlers.
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", int(share_port)),
            *connections.options(),
        ]
    )
    health_servicer = health.aio.HealthServicer()
    loop = asyncio.get_running_loop()

    turning: list[asyncio.Task] = []  # the one task that turns health NOT_SERVING

    def store_failed(reason: str) -> None:
        if not turning:
            log.error("the report store stopped acknowledging: %s", reason)
            turning.append(loop.create_task(health_servicer.enter_graceful_shutdown()))

    collector = Collector(surveys, store, guard, auth, pseudonym, store_failed, observer)
    add_collector_to_server(collector, server, streams)
    add_analyst_to_server(Analyst(surveys, store), server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if reflection:
        from grpc_reflection.v1alpha import reflection as grpc_reflection

        names = (*SERVICE_NAMES, grpc_reflection.SERVICE_NAME, health.SERVICE_NAME)
        grpc_reflection.enable_server_reflection(names, server)
    host, _, port_text = address.rpartition(":")
    if not share_port and port_text.isdigit():
        ensure_port_free(host.strip("[]"), int(port_text))
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    if port == 0:
        raise OSError(f"cannot bind {address}")
    await server.start()
    for name in ("", *SERVICE_NAMES):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("aggregator listening on port %d", port)
    running = RunningServer(server, port, store, health_servicer)
    running.watchdog = loop.create_task(_probe_store(store, store_failed))
    return running


async def _probe_store(store: Store, failed: Callable[[str], None]) -> None:
    """Every STORE_PROBE_SECONDS, an empty submit: its (empty) commit runs the store's file
    checks, so a WAL deleted while no upload comes in turns health NOT_SERVING too (and what
    was committed is rescued into the database file right away). With ``--workers`` every
    worker probes through its link, so every worker turns NOT_SERVING."""
    while True:
        await asyncio.sleep(STORE_PROBE_SECONDS)
        try:
            await asyncio.wrap_future(store.submit_batches([]))
        except StoreFailedError as exc:
            failed(str(exc))
            return
        except StoreError:  # closed: the server is stopping
            return
