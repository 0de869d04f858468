"""The aggregator's gRPC server (grpc.aio): collection, analysis, and the standard health service.

Uploads are validated field by field (status codes as in the service conventions), stored with
group commit, and acknowledged only after the transaction holding them committed. Analysis reads
only the stored sufficient statistics and refuses to release anything below a survey's minimum
batch size.
"""

from __future__ import annotations

import asyncio
import logging
import math
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

from aggregator.config import SurveyLimits
from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.service.auth import (
    DEFAULT_WINDOW_SECONDS,
    UNSIGNED,
    DeviceAuthenticator,
)
from aggregator.service.limits import (
    DEFAULT_MAX_INFLIGHT_REPORTS,
    Admission,
    CapCounter,
    KeyPseudonyms,
    LimitExceededError,
    UploadGuard,
    limit_key,
)
from aggregator.store import ingest
from aggregator.store.ingest import ReportRejectedError
from aggregator.store.report_store import (
    CONFLICT,
    STORED,
    ReportBatch,
    ReportStore,
    StoreUnavailableError,
    WriteHook,
    batches_of,
)
from client.device.transport import MAX_MESSAGE_BYTES, RETRY_AFTER_KEY
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

if TYPE_CHECKING:
    from aggregator.stats.result import TestResult

log = logging.getLogger(__name__)

MAX_REPORTS_PER_REQUEST = 10_000
SERVICE_NAMES = ("ldp.v1.Collector", "ldp.v1.Analyst")


class Store(Protocol):
    """What the servicers need from a report store: the in-process ReportStore, or a worker
    process's RemoteStore that reaches the writer process's one (``serve --workers N``)."""

    def submit_batches(
        self, batches: Sequence[ReportBatch], on_write: WriteHook | None = None
    ) -> Future[list[bool]]: ...

    def stored_ids(self, report_ids: Sequence[bytes]) -> set[bytes]: ...

    def statistics(self, survey_id: str, question_id: str) -> tuple[int, np.ndarray]: ...

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
    ) -> None:
        """``pseudonym`` turns a limit key into what the limits keep (a keyed hash; by default
        with a secret that lives as long as this object)."""
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
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown survey {request.survey_id!r}")
        return survey.to_proto()

    async def ListSurveys(self, request, context):
        return ldp_pb2.ListSurveysResponse(surveys=[s.to_proto() for s in self._surveys.values()])

    async def Upload(self, request, context):
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
            await context.abort(exc.code, exc.message)
        except LimitExceededError as exc:
            await self._refuse(context, exc)
        flags = await self._committed(context, upload.batches, admission)
        return encode_upload_response(upload.report_ids, upload.in_request_order(flags))

    async def UploadStream(self, request_iterator: AsyncIterator, context):
        signed = await self._auth.open_stream(context)
        results: list[ldp_pb2.ReportResult | None] = []
        pending: list[tuple[list[int], asyncio.Future]] = []
        held: list[tuple[list[int], list[ReportBatch]]] = []  # stored once the signature holds
        key = self._limit_key(context, None) if signed is None else ""
        async for request in request_iterator:
            if len(request.reports) > MAX_REPORTS_PER_REQUEST:
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"at most {MAX_REPORTS_PER_REQUEST} reports per message",
                )
            if signed is not None:
                signed.add(request.reports)
            slots, batches = self._validate_each(request.reports, results, signed is not None)
            if batches and signed is None:
                await self._admit_message(context, key, slots, batches, results, pending)
            elif batches:
                held.append((slots, batches))
        if signed is not None:
            key = self._limit_key(context, await self._auth.finish_stream(context, signed))
            for slots, batches in held:
                await self._admit_message(context, key, slots, batches, results, pending)
        for slots, future in pending:
            for slot, result in zip(slots, await future, strict=True):
                results[slot] = result
        return ldp_pb2.UploadResponse(results=results)

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
                    raise ReportRejectedError(grpc.StatusCode.INVALID_ARGUMENT, ingest.REUSED_ID)
                if not signed and self._auth.required((report,)):
                    raise ReportRejectedError(grpc.StatusCode.UNAUTHENTICATED, UNSIGNED)
                valid.append(ingest.validate(report, self._surveys))
            except ReportRejectedError as exc:
                results.append(
                    ldp_pb2.ReportResult(
                        report_id=report.report_id,
                        status=ldp_pb2.REJECTED,
                        code=exc.code.name,
                        reason=exc.message,
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
    ) -> None:
        """Admit one stream message's valid reports and queue them; refused ones are REJECTED."""
        try:
            admission = await self._guard.admit(key, batches, self._stored_ids)
        except LimitExceededError as exc:
            for slot, report_id in zip(slots, _ids(batches), strict=True):
                results[slot] = ldp_pb2.ReportResult(
                    report_id=report_id,
                    status=ldp_pb2.REJECTED,
                    code=grpc.StatusCode.RESOURCE_EXHAUSTED.name,
                    reason=str(exc),
                )
            return
        pending.append((slots, asyncio.ensure_future(self._store_all(context, batches, admission))))

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
            future = self._store.submit_batches(batches, admission.on_write)
        except BaseException as exc:
            admission.close(None)
            if isinstance(exc, StoreUnavailableError):
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            raise
        future.add_done_callback(admission.finish)
        try:
            flags = await asyncio.wrap_future(future)
        except StoreUnavailableError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        conflicts = flags.count(CONFLICT)
        if conflicts:
            self.conflicts += conflicts
            log.warning("%d report(s) refused as CONFLICT: id stored with other content", conflicts)
        return flags

    async def _store_all(
        self, context, batches: Sequence[ReportBatch], admission: Admission
    ) -> list[ldp_pb2.ReportResult]:
        """Store a stream message's reports; one result per report, in the batches' order."""
        flags = await self._committed(context, batches, admission)
        return [
            _result(report_id, flag) for report_id, flag in zip(_ids(batches), flags, strict=True)
        ]


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


async def _parse_stream(context, raw_messages: AsyncIterator[bytes]):
    async for raw in raw_messages:
        yield await _parse(context, ldp_pb2.UploadRequest, raw)


def _unary(method, request_type, response_serializer):
    """A unary handler that parses its request itself (see :func:`_parse`); with a None
    ``response_serializer`` the method returns bytes already serialized."""

    async def handle(raw: bytes, context):
        return await method(await _parse(context, request_type, raw), context)

    return grpc.unary_unary_rpc_method_handler(handle, response_serializer=response_serializer)


def _register(server: grpc.aio.Server, name: str, handlers: dict) -> None:
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)


def add_collector_to_server(collector: Collector, server: grpc.aio.Server) -> None:
    """Register the Collector as the generated ``add_CollectorServicer_to_server`` does, except
    that requests are parsed in the handler (an unparseable one is INVALID_ARGUMENT) and Upload
    returns bytes already serialized by :func:`encode_upload_response`."""

    async def upload_stream(raw_messages: AsyncIterator[bytes], context):
        return await collector.UploadStream(_parse_stream(context, raw_messages), context)

    handlers = {
        "GetSurvey": _unary(
            collector.GetSurvey, ldp_pb2.GetSurveyRequest, ldp_pb2.Survey.SerializeToString
        ),
        "ListSurveys": _unary(
            collector.ListSurveys,
            ldp_pb2.ListSurveysRequest,
            ldp_pb2.ListSurveysResponse.SerializeToString,
        ),
        "Upload": _unary(collector.Upload, ldp_pb2.UploadRequest, None),
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
            analyst.Estimate, ldp_pb2.EstimateRequest, ldp_pb2.EstimateResponse.SerializeToString
        ),
        "GoodnessOfFit": _unary(
            analyst.GoodnessOfFit,
            ldp_pb2.GoodnessOfFitRequest,
            ldp_pb2.TestResponse.SerializeToString,
        ),
        "Independence": _unary(
            analyst.Independence,
            ldp_pb2.IndependenceRequest,
            ldp_pb2.TestResponse.SerializeToString,
        ),
    }
    _register(server, SERVICE_NAMES[1], handlers)


class Analyst(ldp_pb2_grpc.AnalystServicer):
    """Estimates and tests computed from stored sufficient statistics."""

    def __init__(self, surveys: dict[str, SurveySpec], store: Store) -> None:
        self._surveys = surveys
        self._store = store

    async def _released(self, context, survey_id: str, question_id: str):
        """The question's histogram, if the survey's minimum batch size is reached."""
        try:
            survey, question = ingest.find_question(self._surveys, survey_id, question_id)
        except ReportRejectedError as exc:
            await context.abort(exc.code, exc.message)
        n, sums = await asyncio.to_thread(self._store.statistics, survey_id, question_id)
        if n < survey.min_batch_size:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{survey_id}/{question_id} has {n} reports; results are released from "
                f"{survey.min_batch_size}",
            )
        return question, ingest.histogram(question, n, sums)

    async def Estimate(self, request, context):
        question, hist = await self._released(context, request.survey_id, request.question_id)
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
        )

    async def GoodnessOfFit(self, request, context):
        _, hist = await self._released(context, request.survey_id, request.question_id)
        result = await _analyse(
            context,
            "goodness_of_fit",
            hist,
            np.asarray(request.p0, dtype=float),
            request.alpha or 0.05,
            request.method or None,
        )
        return test_response(result)

    async def Independence(self, request, context):
        question, hist = await self._released(context, request.survey_id, request.question_id)
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
        )
        return test_response(result)


async def _analyse(context, function: str, *args):
    """Run ``aggregator.stats.<function>`` off the event loop; user errors become specific status
    codes."""
    try:
        return await asyncio.to_thread(_call_stats, function, *args)
    except InsufficientDataError as exc:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    except (InvalidInputError, ValueError) as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


def _call_stats(function: str, *args):
    """The statistics package is imported on first use, in a worker thread: it pulls in SciPy,
    which would add about a second to every start (health SERVING comes later after a crash) and
    would stall the event loop if imported there."""
    from aggregator import stats

    return getattr(stats, function)(*args)


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
    )
    if result.dof is not None:
        message.dof = result.dof
    return message


test_response.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


def retry_hint(exc: LimitExceededError) -> tuple[tuple[str, str], ...]:
    """Trailing metadata telling the device when to retry (none if retrying cannot help)."""
    if exc.retry_after is None:
        return ()
    return ((RETRY_AFTER_KEY, str(max(1, math.ceil(exc.retry_after * 1000)))),)


@dataclass
class RunningServer:
    """A started aggregator: its port, and how to stop it gracefully."""

    server: grpc.aio.Server
    port: int
    store: Store
    health: health.aio.HealthServicer

    async def stop(self, grace: float = 5.0) -> None:
        """Report NOT_SERVING, drain in-flight calls for up to ``grace`` seconds, close the store
        (which commits everything already queued)."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        await asyncio.to_thread(self.store.close)


def open_store(
    surveys: dict[str, SurveySpec], db_path: str, *, max_delay: float = 0.002
) -> ReportStore:
    """Open the report store and register every question of the surveys."""
    store = ReportStore(db_path, max_delay=max_delay)
    try:
        for survey in surveys.values():
            for question in survey.questions:
                store.register_question(survey.id, question.id, question.k)
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
) -> RunningServer:
    """Open the store, register every question, and start serving on ``address``.

    ``credentials`` (see ``aggregator.service.tls.server_credentials``) switch on TLS or mTLS;
    ``device_keys`` are the enrolled Ed25519 keys that signed uploads are verified with, and
    ``auth_window`` the allowed clock difference of a signature in seconds. ``limits`` are the
    surveys' per-device limits (their counts persist in the store, under keyed hashes);
    ``max_inflight_reports`` bounds the reports waiting for the store, past which uploads are
    shed (RESOURCE_EXHAUSTED with a retry hint).
    """
    store = open_store(surveys, db_path, max_delay=max_delay)
    try:
        guard = UploadGuard(
            limits or {}, CapCounter.load(db_path), max_inflight_reports=max_inflight_reports
        )
        return await serve(
            surveys,
            store,
            address,
            guard=guard,
            reflection=reflection,
            credentials=credentials,
            auth=DeviceAuthenticator(surveys, device_keys or {}, window=auth_window),
            pseudonym=KeyPseudonyms.beside(db_path),
        )
    except BaseException:
        store.close()
        raise


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
) -> RunningServer:
    """Start serving on ``address`` from an open store (see :func:`start_server` for the
    security and limit arguments; ``guard`` defaults to load shedding only). ``share_port`` lets
    several processes listen on one port (SO_REUSEPORT; the kernel spreads connections over
    them); otherwise it is off, so a second server on a busy port fails instead of silently
    taking half its traffic."""
    guard = guard or UploadGuard({}, CapCounter())
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", int(share_port)),
        ]
    )
    add_collector_to_server(Collector(surveys, store, guard, auth, pseudonym), server)
    add_analyst_to_server(Analyst(surveys, store), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if reflection:
        from grpc_reflection.v1alpha import reflection as grpc_reflection

        names = (*SERVICE_NAMES, grpc_reflection.SERVICE_NAME, health.SERVICE_NAME)
        grpc_reflection.enable_server_reflection(names, server)
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
    return RunningServer(server, port, store, health_servicer)
