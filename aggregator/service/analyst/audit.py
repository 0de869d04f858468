"""The analyst audit log: one JSON line per state-changing Analyst call, and per outcome.

Preregister, Confirm and HoldoutTest change a survey's state for good (a registered plan, a
seal, a spent holdout query), so each is recorded with the analyst's identity (the gate's
:data:`~aggregator.service.analyst.auth.CALLER`). Order: an ``attempt`` line is written before
the call runs; if it cannot be written the call is UNAVAILABLE and nothing changes. After the call
a ``done`` line (plan sha256, seal, query index and level) or a ``refused`` line (the status
code) is written before the response goes out; a ``done`` line that cannot be written turns the
answer into UNAVAILABLE too (the change did happen: its ``attempt`` line records it; Preregister
and Confirm retried answer ``already``, a HoldoutTest retried spends another query).

Every line is one ``write`` to a file opened O_APPEND (mode 0600 when created), fsynced before
the call goes on, on one thread so lines never interleave. The file is opened per line, so a
rotated or removed log is recreated.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from aggregator.errors import LdpError
from aggregator.service.analyst.auth import ANALYST_PREFIX, CALLER
from aggregator.service.status import shortened
from protos.ldp.v1 import ldp_pb2

log = logging.getLogger(__name__)

#: The longest string field copied from a request into a line (ids a client chose).
MAX_FIELD_CHARS = 200


class AuditLogError(LdpError):
    """The audit log cannot be written."""


def default_path(db_path: str | os.PathLike[str]) -> Path:
    """The audit log's default path, beside the store: ``<db>.audit.jsonl``."""
    return Path(f"{os.fspath(db_path)}.audit.jsonl")


def _request_fields(request: Any) -> dict[str, Any]:
    fields = {"survey": shortened(request.survey_id, MAX_FIELD_CHARS)}
    if isinstance(request, ldp_pb2.HoldoutRequest):
        fields["question"] = shortened(request.question_id, MAX_FIELD_CHARS)
        fields["test"] = shortened(request.test, MAX_FIELD_CHARS)
    return fields


def _preregistered(response: Any) -> dict[str, Any]:
    return {
        "plan_sha256": response.plan_sha256,
        "registered_at": response.registered_at,
        "already": response.already,
    }


def _confirmed(response: Any) -> dict[str, Any]:
    return {
        "plan_sha256": response.plan_sha256,
        "sealed": True,
        "sealed_at": response.sealed_at,
        "already": response.already,
    }


def _answered(response: Any) -> dict[str, Any]:
    return {
        "query": response.query,
        "max_queries": response.max_queries,
        "level": response.level,
        "reject": response.reject,
    }


#: The audited RPCs: request type, and what of the response a ``done`` line records.
AUDITED: dict[str, tuple[type[Message], Callable[[Any], dict[str, Any]]]] = {
    "Preregister": (ldp_pb2.PreregisterRequest, _preregistered),
    "Confirm": (ldp_pb2.ConfirmRequest, _confirmed),
    "HoldoutTest": (ldp_pb2.HoldoutRequest, _answered),
}


class AuditLog:
    """Appends fsynced JSON lines to one file, from one thread."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._thread = ThreadPoolExecutor(1, "ldp-audit")

    def check(self) -> None:
        """Create the file if needed and make sure it can be appended to (AuditLogError)."""
        try:
            os.close(self._open())
            parent = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(parent)  # the new file's name is durable too
            finally:
                os.close(parent)
        except OSError as exc:
            raise AuditLogError(f"cannot write the audit log {self.path}: {exc.strerror}") from None

    def _open(self) -> int:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(self.path, flags, 0o600)

    def append(self, entry: dict[str, Any]) -> None:
        """Append ``entry`` as one line and fsync it (OSError if that fails)."""
        data = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
        fd = self._open()
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(0, f"short write ({written} of {len(data)} bytes)")
            os.fsync(fd)
        finally:
            os.close(fd)

    async def record(self, entry: dict[str, Any]) -> None:
        """:meth:`append` on the log's thread, with the time added (UTC)."""
        stamped = {"time": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"), **entry}
        await asyncio.get_running_loop().run_in_executor(self._thread, self.append, stamped)

    def close(self) -> None:
        self._thread.shutdown(wait=True)


class AuditInterceptor(grpc.aio.ServerInterceptor):
    """Records every audited Analyst call (:data:`AUDITED`) in an :class:`AuditLog`."""

    def __init__(self, audit: AuditLog) -> None:
        self.audit = audit

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = getattr(details, "method", "") or ""
        rpc = method.removeprefix(ANALYST_PREFIX)
        if handler is None or rpc == method or rpc not in AUDITED or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary

        async def audited(request: Any, context: grpc.aio.ServicerContext) -> Any:
            return await self._audited(rpc, inner, request, context)

        return grpc.unary_unary_rpc_method_handler(
            audited, handler.request_deserializer, handler.response_serializer
        )

    async def _audited(self, rpc: str, inner: Any, request: Any, context: Any) -> Any:
        message_type, outcome = AUDITED[rpc]
        entry: dict[str, Any] = {"analyst": CALLER.get() or "unknown", "rpc": rpc}
        try:
            parsed = message_type.FromString(request) if isinstance(request, bytes) else request
            entry.update(_request_fields(parsed))
        except DecodeError:
            entry["survey"] = None  # the handler answers INVALID_ARGUMENT
        await self._write(context, {**entry, "event": "attempt"}, "nothing was changed")
        try:
            response = await inner(request, context)
        except BaseException as exc:
            code = context.code()
            if code is None and isinstance(exc, asyncio.CancelledError):
                code = grpc.StatusCode.CANCELLED
            name = code.name if isinstance(code, grpc.StatusCode) else str(code or "UNKNOWN")
            try:
                await self.audit.record({**entry, "event": "refused", "code": name})
            except OSError as error:  # the refusal stands; its attempt line is written
                log.error("audit log %s: %s", self.audit.path, error)
            raise
        written = "the call took effect; its attempt is in the audit log"
        await self._write(context, {**entry, "event": "done", **outcome(response)}, written)
        return response

    async def _write(self, context: Any, entry: dict[str, Any], consequence: str) -> None:
        try:
            await self.audit.record(entry)
        except OSError as exc:
            log.error("audit log %s: %s", self.audit.path, exc)
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"the audit log cannot be written ({exc.strerror or exc}): {consequence}",
            )
