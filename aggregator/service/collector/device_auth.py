"""Ed25519 device authentication of uploads (surveys with ``require_device_auth``).

A signed call carries ``ldp-device-id``, ``ldp-timestamp`` and ``ldp-signature-bin`` metadata; the
signature covers the canonical bytes of :mod:`client.device.signature`. An upload is verified when
any of its reports belongs to a survey that requires it, or when it carries a signature at all (a
device that signs is held to its signature). Every failure is UNAUTHENTICATED: missing or malformed
metadata, an unknown or revoked device, a timestamp outside the window (default +-300 s), or a
signature that does not match the exact reports received. An unknown device and a bad signature
get one and the same answer, so the answer does not tell which device ids are enrolled.

On the client-streaming RPC the call's metadata signature covers the header alone (device id and
timestamp, no reports) and is checked when the stream opens; each message then carries its own
signature (``UploadRequest.signature``, the canonical bytes of a unary upload of its reports) and
is verified as it arrives, before anything of it is kept: nothing unauthenticated is buffered. A
bad message signature ends the call with UNAUTHENTICATED (earlier messages may be stored). An
unsigned stream has its reports for such surveys REJECTED one by one (code UNAUTHENTICATED), like
any other invalid report.

Replay within the window resends the same report ids, which the store counts once. The verified
device id is returned to the handler (for rate limits); it is never passed to the report
store.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from aggregator.errors import LdpError
from aggregator.service.status import abort
from client.device import signature as sig
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2

DEFAULT_WINDOW_SECONDS = 300.0
_AUTH_KEYS = (sig.DEVICE_ID_KEY, sig.TIMESTAMP_KEY, sig.SIGNATURE_KEY)
_TIMESTAMP = re.compile(r"^[0-9]{1,12}$")
OFF_LOOP_REPORTS = 256  # signed uploads this big are verified in a worker thread
UNSIGNED = "this survey requires a signed upload from an enrolled device"
#: The one answer to an unknown or revoked device and to a signature that does not verify.
NOT_VERIFIED = "the upload's device signature does not verify against an enrolled device"


class DeviceAuthError(LdpError):
    """The call's device authentication failed; the wire answer is UNAUTHENTICATED."""


@dataclass
class SignedCall:
    """A call whose metadata passed the cheap checks; the signature is checked over the reports."""

    device_id: str
    timestamp: int
    signature: bytes
    key: Ed25519PublicKey
    _batches: list[Sequence[ldp_pb2.Report]] = field(default_factory=list)
    _count: int = 0

    def add(self, reports: Sequence[ldp_pb2.Report]) -> None:
        """Append reports as received (a stream signs all its messages' reports, in order)."""
        self._batches.append(reports)
        self._count += len(reports)

    def verify(self) -> str:
        """Check the signature over everything added; the device id, or DeviceAuthError."""
        frames = b"".join(sig.report_frames(batch) for batch in self._batches)
        try:
            self.key.verify(self.signature, sig.header(self.device_id, self.timestamp) + frames)
        except InvalidSignature:
            raise DeviceAuthError(NOT_VERIFIED) from None
        return self.device_id

    def verify_message(self, reports: Sequence[ldp_pb2.Report], signature: bytes) -> None:
        """Check one stream message's own signature over its reports, or DeviceAuthError."""
        if len(signature) != sig.SIGNATURE_BYTES:
            raise DeviceAuthError(
                f"each message of a signed stream carries a {sig.SIGNATURE_BYTES}-byte signature"
            )
        signed = sig.canonical_upload(self.device_id, self.timestamp, reports)
        try:
            self.key.verify(signature, signed)
        except InvalidSignature:
            raise DeviceAuthError(NOT_VERIFIED) from None

    async def verified(self) -> str:
        """:meth:`verify` off the event loop for big uploads (building the signed bytes of 10,000
        reports takes milliseconds)."""
        if self._count >= OFF_LOOP_REPORTS:
            return await asyncio.to_thread(self.verify)
        return self.verify()


class DeviceAuthenticator:
    """Verifies signed uploads against the enrolled keys."""

    def __init__(
        self,
        surveys: Mapping[str, SurveySpec],
        keys: Mapping[str, Ed25519PublicKey],
        *,
        window: float = DEFAULT_WINDOW_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if window <= 0:
            raise ValueError("the timestamp window must be positive")
        self._required = frozenset(s.id for s in surveys.values() if s.require_device_auth)
        self._keys: Mapping[str, Ed25519PublicKey] = dict(keys)
        self._window = window
        self._clock = clock

    def replace_keys(self, keys: Mapping[str, Ed25519PublicKey]) -> None:
        """Verify with these enrolled keys from now on, kept as given: a live mapping
        (:class:`~aggregator.service.collector.registry.LiveKeys`) answers from the registry file
        itself."""
        self._keys = keys

    def required(self, reports: Iterable[ldp_pb2.Report]) -> bool:
        """Whether any of the reports belongs to a survey that requires device auth."""
        return bool(self._required) and any(r.survey_id in self._required for r in reports)

    def open_call(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> SignedCall | None:
        """Parse and check the call's metadata (known device, fresh timestamp). None if the call
        carries no authentication metadata at all; DeviceAuthError if it is partial or bad."""
        found: dict[str, str | bytes] = {}
        for name, value in metadata or ():
            if name in _AUTH_KEYS:
                if name in found:
                    raise DeviceAuthError(f"metadata {name} appears more than once")
                found[name] = value
        if not found:
            return None
        missing = [k for k in _AUTH_KEYS if k not in found]
        if missing:
            raise DeviceAuthError(f"missing authentication metadata: {', '.join(missing)}")
        device_id, stamp, signature = (found[k] for k in _AUTH_KEYS)
        if not isinstance(stamp, str) or not _TIMESTAMP.match(stamp):
            raise DeviceAuthError(f"{sig.TIMESTAMP_KEY} must be integer Unix seconds")
        if not isinstance(signature, bytes) or len(signature) != sig.SIGNATURE_BYTES:
            raise DeviceAuthError(f"{sig.SIGNATURE_KEY} must be {sig.SIGNATURE_BYTES} bytes")
        timestamp = int(stamp)
        skew = timestamp - self._clock()
        if abs(skew) > self._window:  # checked first: it must not depend on the device id
            raise DeviceAuthError(
                f"signature timestamp is {skew:+.0f} s from server time (allowed +-"
                f"{self._window:g} s): check the device clock"
            )
        key = self._keys.get(device_id) if isinstance(device_id, str) else None
        if key is None or not isinstance(device_id, str):
            raise DeviceAuthError(NOT_VERIFIED)
        return SignedCall(device_id, timestamp, signature, key)

    def open_upload(
        self,
        metadata: Iterable[tuple[str, str | bytes]] | None,
        reports: Sequence[ldp_pb2.Report],
    ) -> SignedCall | None:
        """A unary upload's signed call, ready to verify; None for an unsigned upload that needs
        no authentication; DeviceAuthError for one that does."""
        call = self.open_call(metadata)
        if call is None:
            if self.required(reports):
                raise DeviceAuthError(UNSIGNED)
            return None
        call.add(reports)
        return call

    async def authenticate_upload(self, context, reports: Sequence[ldp_pb2.Report]) -> str | None:
        """The verified device id of a unary upload (None if unsigned and not required);
        failures abort the call with UNAUTHENTICATED."""
        try:
            call = self.open_upload(context.invocation_metadata(), reports)
            return None if call is None else await call.verified()
        except DeviceAuthError as exc:
            await abort(context, grpc.StatusCode.UNAUTHENTICATED, str(exc))

    async def open_stream(self, context) -> SignedCall | None:
        """:meth:`open_call` for a streaming handler, with the metadata signature checked over
        the header alone; failures abort with UNAUTHENTICATED."""
        try:
            call = self.open_call(context.invocation_metadata())
            if call is not None:
                call.verify()  # no reports added: the header only
            return call
        except DeviceAuthError as exc:
            await abort(context, grpc.StatusCode.UNAUTHENTICATED, str(exc))

    async def verify_message(self, context, call: SignedCall, request: ldp_pb2.UploadRequest):
        """Verify one message of a signed stream as it arrives (off the event loop when big)."""
        try:
            if len(request.reports) >= OFF_LOOP_REPORTS:
                await asyncio.to_thread(call.verify_message, request.reports, request.signature)
            else:
                call.verify_message(request.reports, request.signature)
        except DeviceAuthError as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
