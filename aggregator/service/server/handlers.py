"""The Collector and the Analyst registered at the byte level.

Registered as the generated ``add_*Servicer_to_server`` functions do, except that requests
arrive as bytes: each RPC bounds its request size, an upload is screened before protobuf parses
it, and a request that does not parse is INVALID_ARGUMENT.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from aggregator.service.analyst.servicer import Analyst
from aggregator.service.collector.answers import released
from aggregator.service.collector.observe import CallOutcome
from aggregator.service.collector.servicer import Collector
from aggregator.service.collector.streams import StreamBudget, StreamLimitError, StreamLimits
from protos.ldp.v1 import ldp_pb2

#: The largest GetSurvey or ListSurveys request taken (a survey id is a short name).
MAX_SMALL_REQUEST_BYTES = 4096
#: The largest GoodnessOfFit request (its p0 holds 9 bytes per category: k up to ~100,000).
MAX_ANALYST_REQUEST_BYTES = 1 << 20
#: The services registered here, by full name (also what health and reflection report).
SERVICE_NAMES = ("ldp.v1.Collector", "ldp.v1.Analyst")


async def _parse(
    context: grpc.aio.ServicerContext, message_type: type[Message], raw: bytes
) -> Message:
    """A request message from its bytes; bytes that do not parse as ``message_type`` are
    INVALID_ARGUMENT (grpc's own deserializer would answer UNKNOWN and log a traceback)."""
    try:
        return message_type.FromString(raw)
    except DecodeError:
        name = message_type.DESCRIPTOR.full_name
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid {name}")


async def screened_stream(
    collector: Collector,
    context: grpc.aio.ServicerContext,
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
        raw = b""  # parsed: the bytes are not needed any more
        yield request


def _unary(
    method: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
    request_type: type[Message],
    response_serializer: Callable[[Any], bytes] | None,
    max_bytes: int,
) -> grpc.RpcMethodHandler:
    """A unary handler that refuses a request over ``max_bytes`` and parses the rest itself
    (see :func:`_parse`); with a None ``response_serializer`` the method returns bytes already
    serialized. A refusal is released from the handler's frames (:func:`released`)."""

    async def handle(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            if len(raw) > max_bytes:
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"request of {len(raw)} bytes; this call takes at most {max_bytes}",
                )
            request = await _parse(context, request_type, raw)
            raw = b""  # parsed: the bytes are not needed any more
            return await method(request, context)
        except BaseException as exc:
            raw, request = b"", None  # drop the bytes: the re-raised error holds this frame
            raise released(exc) from None

    return grpc.unary_unary_rpc_method_handler(handle, response_serializer=response_serializer)


def _register(
    server: grpc.aio.Server, name: str, handlers: dict[str, grpc.RpcMethodHandler]
) -> None:
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)


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

    async def upload(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        outcome = CallOutcome()
        try:
            await collector.screen(raw, context, outcome=outcome)
            request = await _parse(context, ldp_pb2.UploadRequest, raw)
            raw = b""  # parsed: the bytes are not needed any more
            return await collector.Upload(request, context, outcome)
        except BaseException as exc:
            raw, request = b"", None  # drop the bytes: the re-raised error holds this frame
            raise released(exc) from None
        finally:
            collector.observer.finished("Upload", context, outcome)

    async def upload_stream(
        raw_messages: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> ldp_pb2.UploadResponse:
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
        "GetSurvey": _unary(
            analyst.GetSurvey,
            ldp_pb2.GetSurveyRequest,
            ldp_pb2.Survey.SerializeToString,
            MAX_SMALL_REQUEST_BYTES,
        ),
        "Statistics": _unary(
            analyst.Statistics,
            ldp_pb2.StatisticsRequest,
            ldp_pb2.StatisticsResponse.SerializeToString,
            MAX_SMALL_REQUEST_BYTES,
        ),
        "Monitor": _unary(
            analyst.Monitor,
            ldp_pb2.MonitorRequest,
            ldp_pb2.MonitorResponse.SerializeToString,
            MAX_ANALYST_REQUEST_BYTES,
        ),
    }
    _register(server, SERVICE_NAMES[1], handlers)
