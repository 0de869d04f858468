"""What the collection service answers, kept small and safe: retry hints, each report's result,
an upload's response written straight to bytes, a stream's response that never passes the
message limit, and refusals cut loose from the handler frames they were raised in."""

from __future__ import annotations

import math
from collections.abc import Sequence

from aggregator.service.collector.limits import LimitExceededError
from aggregator.store.model import CONFLICT, STORED
from client.device.transport import MAX_MESSAGE_BYTES, RETRY_AFTER_KEY
from protos.ldp.v1 import ldp_pb2

#: A stream's response stays this far below the message limit (room for the status trailer).
MAX_RESPONSE_BYTES = MAX_MESSAGE_BYTES - 64 * 1024


def retry_after_ms(exc: LimitExceededError) -> int:
    """A refusal's retry delay in milliseconds (at least 1), or 0 if retrying cannot help."""
    if exc.retry_after is None:
        return 0
    return max(1, math.ceil(exc.retry_after * 1000))


def retry_hint(exc: LimitExceededError) -> tuple[tuple[str, str], ...]:
    """Trailing metadata telling the device when to retry (none if retrying cannot help)."""
    wait = retry_after_ms(exc)
    return ((RETRY_AFTER_KEY, str(wait)),) if wait else ()


CONFLICT_REASON = "this report id is stored with another survey, question or payload"


def report_result(report_id: bytes, flag: int) -> ldp_pb2.ReportResult:
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
        results = [report_result(rid, flag) for rid, flag in zip(report_ids, flags, strict=True)]
        return ldp_pb2.UploadResponse(results=results).SerializeToString()
    return b"".join(
        [
            _RESULT_HEAD + report_id + (_ACCEPTED_TAIL if flag else _DUPLICATE_TAIL)
            for report_id, flag in zip(report_ids, flags, strict=True)
        ]
    )


def stream_response(
    results: Sequence[ldp_pb2.ReportResult], max_bytes: int = MAX_RESPONSE_BYTES
) -> ldp_pb2.UploadResponse:
    """A stream's answer: every report's result, with counts; when that would pass the message
    limit, only the REJECTED results (bounded by the stream limits) and the counts."""
    accepted = sum(r.status == ldp_pb2.ACCEPTED for r in results)
    duplicates = sum(r.status == ldp_pb2.DUPLICATE for r in results)
    response = ldp_pb2.UploadResponse(results=results, accepted=accepted, duplicates=duplicates)
    if response.ByteSize() <= max_bytes:
        return response
    rejected = [r for r in results if r.status == ldp_pb2.REJECTED]
    return ldp_pb2.UploadResponse(
        results=rejected, accepted=accepted, duplicates=duplicates, summarized=True
    )


def released(exc: BaseException) -> BaseException:
    """``exc`` cut loose from the frames it was raised through (traceback, cause, context).

    Why: a refused request is aborted from deep inside its handler, and the exception's traceback
    keeps every frame of that handler alive, with the request and what was built from it, until
    a cyclic garbage collection happens to run (the exception ends up in a reference cycle).
    Under a flood of refused uploads that was hundreds of MiB; cut loose, the frames go as soon
    as the handler returns."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        following = current.__context__ or current.__cause__
        current.__traceback__ = None
        current.__cause__ = current.__context__ = None
        current = following
    exc.__suppress_context__ = True
    return exc
