"""The canonical byte string a device signs for an upload, and the gRPC metadata that carries the
signature. Devices build it to sign; the aggregator rebuilds it from the received reports to verify.

Layout (all integers big-endian)::

    DOMAIN                                  "ldp-survey/upload-signature/v1" and a NUL byte
    u32 len | device id (UTF-8)
    u64 timestamp                           integer Unix seconds at signing
    per report, in request order:
        u32 len | survey_id (UTF-8)
        u32 len | question_id (UTF-8)
        u32 len | report_id
        u32 len | payload

Every variable field is length-prefixed, so two different uploads never produce the same bytes;
the domain string keeps these signatures from being valid for any other purpose or version. On
the client-streaming RPC the call's metadata signs the header alone (no reports) and each message
carries the signature of its own reports, so the server verifies every message as it arrives
(``DeviceKey.sign_stream``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from protos.ldp.v1 import ldp_pb2

DOMAIN = b"ldp-survey/upload-signature/v1\x00"
DEVICE_ID_KEY = "ldp-device-id"
TIMESTAMP_KEY = "ldp-timestamp"
SIGNATURE_KEY = "ldp-signature-bin"  # "-bin": gRPC carries the value as raw bytes
SIGNATURE_BYTES = 64

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


def _field(value: bytes) -> bytes:
    return _U32.pack(len(value)) + value


def header(device_id: str, timestamp: int) -> bytes:
    """The part that identifies the signer and the signing time."""
    return DOMAIN + _field(device_id.encode()) + _U64.pack(timestamp)


def report_frames(reports: Iterable[ldp_pb2.Report]) -> bytes:
    """The part that binds the exact reports, in order."""
    return b"".join(
        _field(r.survey_id.encode())
        + _field(r.question_id.encode())
        + _field(r.report_id)
        + _field(r.payload)
        for r in reports
    )


def canonical_upload(device_id: str, timestamp: int, reports: Iterable[ldp_pb2.Report]) -> bytes:
    """The bytes signed for one upload."""
    return header(device_id, timestamp) + report_frames(reports)
