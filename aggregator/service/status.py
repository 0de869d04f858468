"""How any servicer (Collector and Analyst alike) ends a call on a refusal: the status code of each
reason a report or a read is refused (docs/wire.md §8.2, §8.3), a reason cut to a bounded length,
and an abort that says it never returns.

Validation says why in transport-neutral terms (:class:`aggregator.store.checks.Rejection`); the
table here is the one place that turns a reason into gRPC."""

from __future__ import annotations

from typing import NoReturn

import grpc

from aggregator.store.checks import Rejection

#: Reasons of REJECTED results, and messages quoting client-chosen ids, are cut to this length.
MAX_REASON_CHARS = 160

STATUS_OF: dict[Rejection, grpc.StatusCode] = {
    Rejection.UNKNOWN_SURVEY: grpc.StatusCode.NOT_FOUND,
    Rejection.UNKNOWN_QUESTION: grpc.StatusCode.NOT_FOUND,
    Rejection.STALE_DEFINITION: grpc.StatusCode.FAILED_PRECONDITION,
    Rejection.WRONG_SIDE: grpc.StatusCode.FAILED_PRECONDITION,
    Rejection.WRONG_GROUP: grpc.StatusCode.INVALID_ARGUMENT,
    Rejection.WRONG_DESIGN_KEY: grpc.StatusCode.INVALID_ARGUMENT,
    Rejection.MALFORMED: grpc.StatusCode.INVALID_ARGUMENT,
    Rejection.REUSED_ID: grpc.StatusCode.INVALID_ARGUMENT,
    Rejection.OUT_OF_RANGE: grpc.StatusCode.OUT_OF_RANGE,
    Rejection.TOO_MANY_CELLS: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Rejection.UNSIGNED: grpc.StatusCode.UNAUTHENTICATED,
    # Permanent for the device (it dead-letters the report), like a stale definition.
    Rejection.ANSWERED_BEFORE: grpc.StatusCode.FAILED_PRECONDITION,
}


def status_of(reason: Rejection) -> grpc.StatusCode:
    """The status code a refused report answers with on the wire."""
    return STATUS_OF[reason]


def shortened(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """``text`` cut to ``limit`` characters: reasons may quote ids a client chose, of any size."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


async def abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    """End the call with ``code``: ``context.abort`` raises, and saying so lets a handler that
    returns a value end on a refusal."""
    await context.abort(code, message)
    raise AssertionError("grpc.aio's abort returned instead of raising")
