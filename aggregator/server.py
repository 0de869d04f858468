"""The aggregator's gRPC server (grpc.aio): collection, analysis, and the standard health service.

Uploads are validated field by field (status codes as in the service conventions), stored with
group commit, and acknowledged only after the transaction holding them committed. Analysis reads
only the stored sufficient statistics and refuses to release anything below a survey's minimum
batch size.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

import grpc
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from aggregator import ingest
from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.ingest import ReportRejectedError
from aggregator.stats import estimate, goodness_of_fit, independence
from aggregator.stats.result import TestResult
from aggregator.storage import ReportBatch, ReportStore, StoredReport, StoreUnavailableError
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

log = logging.getLogger(__name__)

MAX_REPORTS_PER_REQUEST = 10_000
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
SERVICE_NAMES = ("ldp.v1.Collector", "ldp.v1.Analyst")


class Store(Protocol):
    """What the servicers need from a report store: the in-process ReportStore, or a worker
    process's RemoteStore that reaches the writer process's one (``serve --workers N``)."""

    def submit(self, reports: Sequence[StoredReport]) -> Future[list[bool]]: ...

    def submit_batches(self, batches: Sequence[ReportBatch]) -> Future[list[bool]]: ...

    def statistics(self, survey_id: str, question_id: str) -> tuple[int, np.ndarray]: ...

    def close(self) -> None: ...


class Collector(ldp_pb2_grpc.CollectorServicer):
    """Serves survey definitions and ingests randomized reports."""

    def __init__(self, surveys: dict[str, SurveySpec], store: Store) -> None:
        self._surveys = surveys
        self._store = store

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
            upload = ingest.validate_upload(reports, self._surveys)
        except ReportRejectedError as exc:
            await context.abort(exc.code, exc.message)
        flags = await self._committed(context, self._store.submit_batches(upload.batches))
        return encode_upload_response(upload.report_ids, upload.in_request_order(flags))

    async def UploadStream(self, request_iterator: AsyncIterator, context):
        results: list[ldp_pb2.ReportResult | None] = []
        pending: list[tuple[list[int], asyncio.Future]] = []
        async for request in request_iterator:
            if len(request.reports) > MAX_REPORTS_PER_REQUEST:
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"at most {MAX_REPORTS_PER_REQUEST} reports per message",
                )
            slots, valid = self._validate_each(request.reports, results)
            if valid:
                pending.append((slots, asyncio.ensure_future(self._store_all(context, valid))))
        for slots, future in pending:
            for slot, result in zip(slots, await future, strict=True):
                results[slot] = result
        return ldp_pb2.UploadResponse(results=results)

    def _validate_each(
        self, reports: Sequence[ldp_pb2.Report], results: list[ldp_pb2.ReportResult | None]
    ) -> tuple[list[int], list[StoredReport]]:
        """Validate a stream message (in bulk when all of it is valid); append a REJECTED result
        per invalid report and a placeholder per valid one to ``results``; return the
        placeholders' slots and the valid reports."""
        try:
            valid = ingest.validate_batch(reports, self._surveys)
        except ReportRejectedError:
            slots, valid = [], []
            for report in reports:
                try:
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
            return slots, valid
        start = len(results)
        results.extend([None] * len(valid))
        return list(range(start, len(results))), valid

    async def _committed(self, context, future: Future[list[bool]]) -> list[bool]:
        """Wait until the transaction holding a submit committed; its per-report new/duplicate
        flags. A store whose writer is gone answers UNAVAILABLE, which clients retry."""
        try:
            return await asyncio.wrap_future(future)
        except StoreUnavailableError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    async def _store_all(
        self, context, stored: Sequence[StoredReport]
    ) -> list[ldp_pb2.ReportResult]:
        """Queue for group commit and wait until the transaction holding them committed."""
        fresh = await self._committed(context, self._store.submit(stored))
        return [
            ldp_pb2.ReportResult(
                report_id=r.report_id, status=ldp_pb2.ACCEPTED if new else ldp_pb2.DUPLICATE
            )
            for r, new in zip(stored, fresh, strict=True)
        ]


_ACCEPTED_TAIL = b"\x10" + bytes([ldp_pb2.ACCEPTED])
_DUPLICATE_TAIL = b"\x10" + bytes([ldp_pb2.DUPLICATE])
_RESULT_HEAD = b"\x0a\x14\x0a\x10"  # results: 20 bytes long; its report_id: 16 bytes long


def encode_upload_response(report_ids: Sequence[bytes], fresh: Sequence[bool]) -> bytes:
    """The serialized UploadResponse of an all-accepted-or-duplicate upload, written directly:
    one fixed 22-byte record per report (tag + length of the result, tag + length + 16-byte
    report_id, tag + status), several times cheaper than building a message per report. The
    report ids must be 16 bytes long (validation guarantees it)."""
    return b"".join(
        [
            _RESULT_HEAD + report_id + (_ACCEPTED_TAIL if new else _DUPLICATE_TAIL)
            for report_id, new in zip(report_ids, fresh, strict=True)
        ]
    )


def add_collector_to_server(collector: Collector, server: grpc.aio.Server) -> None:
    """Register the Collector as the generated ``add_CollectorServicer_to_server`` does, except
    that Upload returns bytes already serialized by :func:`encode_upload_response`."""

    def unary(method, request, response):
        return grpc.unary_unary_rpc_method_handler(
            method, request_deserializer=request.FromString, response_serializer=response
        )

    handlers = {
        "GetSurvey": unary(
            collector.GetSurvey, ldp_pb2.GetSurveyRequest, ldp_pb2.Survey.SerializeToString
        ),
        "ListSurveys": unary(
            collector.ListSurveys,
            ldp_pb2.ListSurveysRequest,
            ldp_pb2.ListSurveysResponse.SerializeToString,
        ),
        "Upload": unary(collector.Upload, ldp_pb2.UploadRequest, None),  # None: bytes as is
        "UploadStream": grpc.stream_unary_rpc_method_handler(
            collector.UploadStream,
            request_deserializer=ldp_pb2.UploadRequest.FromString,
            response_serializer=ldp_pb2.UploadResponse.SerializeToString,
        ),
    }
    name = SERVICE_NAMES[0]
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)


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
        est = await _analyse(context, estimate, hist, confidence)
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
            goodness_of_fit,
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
            independence,
            hist,
            question.shape,
            request.alpha or 0.05,
            request.method or None,
        )
        return test_response(result)


async def _analyse(context, function, *args):
    """Run a statistics call off the event loop; user errors become specific status codes."""
    try:
        return await asyncio.to_thread(function, *args)
    except InsufficientDataError as exc:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    except (InvalidInputError, ValueError) as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


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
) -> RunningServer:
    """Open the store, register every question, and start serving on ``address``."""
    store = open_store(surveys, db_path, max_delay=max_delay)
    try:
        return await serve(surveys, store, address, reflection=reflection, credentials=credentials)
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
    share_port: bool = False,
) -> RunningServer:
    """Start serving on ``address`` from an open store. ``share_port`` lets several processes
    listen on one port (SO_REUSEPORT; the kernel spreads connections over them); otherwise it is
    off, so a second server on a busy port fails instead of silently taking half its traffic."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", int(share_port)),
        ]
    )
    add_collector_to_server(Collector(surveys, store), server)
    ldp_pb2_grpc.add_AnalystServicer_to_server(Analyst(surveys, store), server)
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
