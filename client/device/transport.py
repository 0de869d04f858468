"""The device's gRPC connection to the aggregator: deadlines on every call, and retries with
exponential backoff and jitter on UNAVAILABLE only (uploads are idempotent thanks to report ids,
every other failure is final for the call). A refusal that carries the server's retry hint
(``retry-after-ms`` trailing metadata: rate limit, overload) is worth retrying later; the same
code without a hint (a cap reached, a batch too large) is not. Plaintext unless TLS settings are
given; a signed upload is signed afresh on every attempt (same report bytes, new
timestamp).

grpc (and the generated stubs) load when the first Transport is made, not on import: a device that
answers offline, or an app that imports the reporter at start-up, does not pay for them until it
talks to the aggregator (docs/performance.md, "Device footprint")."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from client.device import tls_errors
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2

if TYPE_CHECKING:
    import grpc

    from client.device.keys import DeviceKey
    from client.device.tls import TlsSettings

#: Status codes (by name) retried within a call, with backoff.
RETRYABLE = frozenset({"UNAVAILABLE"})
#: The documented permanent refusals (docs/wire.md §8, by name): the request itself is refused,
#: so resending it cannot succeed. RESOURCE_EXHAUSTED is permanent only without a retry hint,
#: and UNAUTHENTICATED is the device's own problem to fix (its reports stay pending).
PERMANENT = frozenset(
    {"INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE", "FAILED_PRECONDITION", "UNAUTHENTICATED"}
)
Metadata = tuple[tuple[str, str | bytes], ...]
RETRY_AFTER_KEY = "retry-after-ms"  # trailing metadata of a refusal worth retrying later
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # the largest message either side accepts


class TransportError(Exception):
    """A call failed for good (or ran out of retries); ``code`` is the gRPC status."""

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        retry_after: float | None = None,
        hint: str = "",
    ) -> None:
        self.code = code
        self.details = details  # as gRPC said it
        self.hint = hint  # the likely cause, for the user (client/device/tls_errors.py)
        self.retry_after = retry_after  # seconds, from the server's hint
        super().__init__(f"{code.name}: {self.reason}")

    @property
    def reason(self) -> str:
        """The details for the user: the likely cause first when there is one."""
        return f"{self.hint}; gRPC: {self.details}" if self.hint else self.details

    @property
    def retryable(self) -> bool:
        """Whether trying again later may succeed: anything but a documented permanent refusal
        (PERMANENT, or RESOURCE_EXHAUSTED without a retry hint). So the server unreachable, slow
        or busy, a call cancelled on the way (this client never cancels its own calls), a
        refusal with a retry hint (rate limit, overload), and any code §8 does not list for
        the call (INTERNAL, UNKNOWN, ABORTED...: the report was not refused, the server
        failed) keep the reports pending."""
        name = self.code.name
        if name == "RESOURCE_EXHAUSTED":
            return self.retry_after is not None
        return name not in PERMANENT


def retry_after(error: grpc.RpcError) -> float | None:
    """The server's retry hint in seconds, if the failed call carried a valid one."""
    for key, value in error.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY:
            try:
                milliseconds = int(value)
            except ValueError:
                return None
            return milliseconds / 1000 if milliseconds >= 0 else None
    return None


class Transport:
    """Synchronous client of the Collector service."""

    def __init__(
        self,
        target: str,
        *,
        tls: TlsSettings | None = None,
        timeout: float = 10.0,
        max_attempts: int = 5,
        initial_backoff: float = 0.1,
        max_backoff: float = 2.0,
    ) -> None:
        # The system resolver (getaddrinfo), gRPC's own default on Android and iOS, rather than
        # c-ares: it honours the device's resolver settings and spares ~1 MB of peak memory
        # (docs/performance.md, "Device footprint"). gRPC reads it when it starts; a value set
        # in the environment wins.
        os.environ.setdefault("GRPC_DNS_RESOLVER", "native")
        import grpc  # lazily (module docstring)

        from protos.ldp.v1 import ldp_pb2_grpc

        self._rpc_error = grpc.RpcError
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        if tls is None:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            self._channel = grpc.secure_channel(target, tls.credentials(), options=options)
        self._stub = ldp_pb2_grpc.CollectorStub(self._channel)
        self._timeout = timeout
        self._max_attempts = max_attempts
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._tls = tls

    def _call(self, method, request, metadata: Callable[[], Metadata] | None = None):
        delay = self._initial_backoff
        for attempt in range(1, self._max_attempts + 1):
            try:
                return method(
                    request,
                    timeout=self._timeout,
                    metadata=None if metadata is None else metadata(),
                )
            except self._rpc_error as exc:
                code = exc.code()
                if code.name not in RETRYABLE or attempt == self._max_attempts:
                    details = exc.details() or ""
                    hint = tls_errors.likely_cause(code.name, details, self._tls)
                    raise TransportError(code, details, retry_after(exc), hint) from None
            import random  # only a retry needs jitter (one answer's memory, module docstring)

            time.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, self._max_backoff)
        raise AssertionError("unreachable")

    def get_survey(self, survey_id: str) -> SurveySpec:
        """Fetch and validate a survey definition."""
        message = self._call(self._stub.GetSurvey, ldp_pb2.GetSurveyRequest(survey_id=survey_id))
        return SurveySpec.from_proto(message)

    def upload(
        self, reports: Sequence[ldp_pb2.Report], signer: DeviceKey | None = None
    ) -> list[ldp_pb2.ReportResult]:
        """Upload a batch (all-or-nothing on the server); per-report accepted/duplicate. With a
        ``signer``, every attempt carries a fresh device signature over exactly these reports."""
        sign = None if signer is None else lambda: signer.sign_upload(reports)
        response = self._call(self._stub.Upload, ldp_pb2.UploadRequest(reports=reports), sign)
        return list(response.results)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
