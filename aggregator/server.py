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
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from aggregator import ingest
from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.ingest import ReportRejectedError
from aggregator.storage import ReportStore, StoredReport
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

if TYPE_CHECKING:
    from aggregator.stats.result import TestResult

log = logging.getLogger(__name__)

MAX_REPORTS_PER_REQUEST = 10_000
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
SERVICE_NAMES = ("ldp.v1.Collector", "ldp.v1.Analyst")


class Collector(ldp_pb2_grpc.CollectorServicer):
    """Serves survey definitions and ingests randomized reports."""

    def __init__(self, surveys: dict[str, SurveySpec], store: ReportStore) -> None:
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
            stored = ingest.validate_batch(reports, self._surveys)
        except ReportRejectedError as exc:
            await context.abort(exc.code, exc.message)
        return ldp_pb2.UploadResponse(results=await self._store_all(stored))

    async def UploadStream(self, request_iterator: AsyncIterator, context):
        results: list[ldp_pb2.ReportResult | None] = []
        pending: list[tuple[list[int], asyncio.Future]] = []
        async for request in request_iterator:
            if len(request.reports) > MAX_REPORTS_PER_REQUEST:
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"at most {MAX_REPORTS_PER_REQUEST} reports per message",
                )
            slots, valid = [], []
            for report in request.reports:
                try:
                    valid.append(ingest.validate(report, self._surveys))
                    slots.append(len(results))
                    results.append(None)
                except ReportRejectedError as exc:
                    results.append(
                        ldp_pb2.ReportResult(
                            report_id=report.report_id,
                            status=ldp_pb2.REJECTED,
                            code=exc.code.name,
                            reason=exc.message,
                        )
                    )
            if valid:
                pending.append((slots, asyncio.ensure_future(self._store_all(valid))))
        for slots, future in pending:
            for slot, result in zip(slots, await future, strict=True):
                results[slot] = result
        return ldp_pb2.UploadResponse(results=results)

    async def _store_all(self, stored: Sequence[StoredReport]) -> list[ldp_pb2.ReportResult]:
        """Queue for group commit and wait until the transaction holding them committed."""
        fresh = await asyncio.wrap_future(self._store.submit(stored))
        return [
            ldp_pb2.ReportResult(
                report_id=r.report_id, status=ldp_pb2.ACCEPTED if new else ldp_pb2.DUPLICATE
            )
            for r, new in zip(stored, fresh, strict=True)
        ]


class Analyst(ldp_pb2_grpc.AnalystServicer):
    """Estimates and tests computed from stored sufficient statistics."""

    def __init__(self, surveys: dict[str, SurveySpec], store: ReportStore) -> None:
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


@dataclass
class RunningServer:
    """A started aggregator: its port, and how to stop it gracefully."""

    server: grpc.aio.Server
    port: int
    store: ReportStore
    health: health.aio.HealthServicer

    async def stop(self, grace: float = 5.0) -> None:
        """Report NOT_SERVING, drain in-flight calls for up to ``grace`` seconds, close the store
        (which commits everything already queued)."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        await asyncio.to_thread(self.store.close)


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
    store = ReportStore(db_path, max_delay=max_delay)
    for survey in surveys.values():
        for question in survey.questions:
            store.register_question(survey.id, question.id, question.k)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
    )
    ldp_pb2_grpc.add_CollectorServicer_to_server(Collector(surveys, store), server)
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
        store.close()
        raise OSError(f"cannot bind {address}")
    await server.start()
    for name in ("", *SERVICE_NAMES):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("aggregator listening on port %d", port)
    return RunningServer(server, port, store, health_servicer)
