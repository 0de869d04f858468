"""What a refused or failed Analyst call becomes on the analyst's side: a typed error with one
line of text, the status code kept for callers that act on it."""

from __future__ import annotations

import re

import grpc

from aggregator.errors import LdpError

#: Codes whose details are the server's own words about the request (the same sentences the
#: command line says on a report store): shown as they are. Other codes are about the call
#: (network, credentials, load) and are shown with the server's address and the code.
REQUEST_CODES = frozenset(
    {
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
    }
)
#: Codes that mean "try again soon" (not a mistake of the request): a watch retries them.
TRANSIENT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)
#: A refusal because nothing is released yet (docs/wire.md §8.4, §8.5, §8.7): its threshold.
_BELOW_THRESHOLD = re.compile(r"; results are released from (\d+)\b")


class RemoteError(LdpError):
    """An Analyst call that did not answer: ``code`` is its gRPC status code."""

    def __init__(self, message: str, code: grpc.StatusCode) -> None:
        super().__init__(message)
        self.code = code


class NotReleasedError(RemoteError):
    """Nothing of the question (or group) is released yet: fewer reports than the survey's
    ``min_batch_size``, how many the server does not say."""

    def __init__(self, message: str, min_batch_size: int) -> None:
        super().__init__(message, grpc.StatusCode.FAILED_PRECONDITION)
        self.min_batch_size = min_batch_size


def remote_error(error: grpc.RpcError, address: str) -> RemoteError:
    """The typed error of a failed call to the server at ``address``."""
    code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = " ".join(((error.details() if isinstance(error, grpc.Call) else "") or "").split())
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        below = _BELOW_THRESHOLD.search(details)
        if below:
            return NotReleasedError(details, int(below[1]))
    if code in REQUEST_CODES:
        return RemoteError(details, code)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return RemoteError(
            f"server {address} does not answer this call ({details}): is it older than this "
            "client, or is this not its analyst address?",
            code,
        )
    if code == grpc.StatusCode.UNAVAILABLE and "failed to connect" in details.lower():
        return RemoteError(f"cannot reach the server at {address}: {details}", code)
    return RemoteError(f"server {address}: {code.name}: {details}", code)
