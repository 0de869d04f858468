"""How the Analyst's RPCs answer what an analysis gave: a refusal by the analysis limits, a
stopped analysis and a user error each as its own status code (``analysed``), and a test
result as a TestResponse (``test_response``); shared by every Analyst RPC module."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.service.analyst.execution import AnalysisRefusedError, AnalysisStoppedError
from client.device.transport import RETRY_AFTER_KEY
from protos.ldp.v1 import ldp_pb2

if TYPE_CHECKING:
    from aggregator.stats.result import TestResult


async def analysed(context, work):
    """Await ``work`` (an analysis on the executor): a refusal by the analysis limits is
    RESOURCE_EXHAUSTED (with the ``retry-after-ms`` trailer when waiting can help), an analysis
    stopped by its deadline DEADLINE_EXCEEDED, user errors specific status codes."""
    try:
        return await work
    except AnalysisRefusedError as exc:
        hint = () if exc.retry_after_ms is None else ((RETRY_AFTER_KEY, str(exc.retry_after_ms)),)
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), trailing_metadata=hint)
    except AnalysisStoppedError as exc:
        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
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
        calibration=result.calibration,
        calibration_reason=result.calibration_reason,
    )
    if result.dof is not None:
        message.dof = result.dof
    if result.n_draws is not None:
        message.n_draws = result.n_draws
    return message


test_response.__test__ = False  # type: ignore[attr-defined]  # not a pytest test
