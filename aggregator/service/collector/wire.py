"""Cheap checks on a serialized upload before protobuf materializes it.

Why: parsing is the expensive part of a hostile upload. A 4 MiB UploadRequest can hold about two
million empty ``Report`` messages; parsing them costs half a second of the event loop and about
180 MiB before any limit is looked at. :func:`count_reports` walks only the top-level fields of
the bytes (tag, length, skip) and stops as soon as the count passes the limit, so a refusal costs
at most ``limit + 1`` field headers, never a parse.
"""

from __future__ import annotations

from aggregator.errors import LdpError

_REPORTS_TAG = 0x0A  # field 1 (repeated Report reports), wire type 2 (length-delimited)


#: The smallest serialized Report that can be valid: its 16-byte report_id alone takes a tag, a
#: length and the 16 bytes.
MIN_VALID_REPORT_BYTES = 18


class WireFormatError(LdpError):
    """The bytes are not a well-formed protobuf message at the top level."""


class ShortReportError(LdpError):
    """Report number ``index`` is too short to be valid; ``entry`` is its serialized bytes."""

    def __init__(self, index: int, entry: bytes) -> None:
        super().__init__(f"report[{index}] is {len(entry)} bytes long")
        self.index, self.entry = index, entry


def _varint(raw: bytes, pos: int) -> tuple[int, int]:
    """A base-128 varint at ``pos``: (value, position after it)."""
    value = shift = 0
    end = len(raw)
    while True:
        if pos >= end or shift > 63:
            raise WireFormatError("truncated or overlong varint")
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def count_reports(raw: bytes, limit: int, *, min_length: int = 0) -> int:
    """How many ``reports`` entries the serialized UploadRequest holds, counting at most
    ``limit + 1`` (a result above ``limit`` means "too many"). Other top-level fields are
    skipped by their wire type; a malformed frame raises WireFormatError. Nested messages are not
    looked into: that is protobuf's job once the count is known to be acceptable.

    With ``min_length`` (an all-or-nothing upload: :data:`MIN_VALID_REPORT_BYTES`), the first
    report shorter than that raises ShortReportError at once: a flood of empty reports is then
    refused at its first entry."""
    count = pos = 0
    end = len(raw)
    while pos < end and count <= limit:
        byte = raw[pos]
        if byte == _REPORTS_TAG:  # the common case: one-byte tag, usually a one-byte length
            pos += 1
            if pos < end and raw[pos] < 0x80:
                length, pos = raw[pos], pos + 1
            else:
                length, pos = _varint(raw, pos)
            if length < min_length and pos + length <= end:
                raise ShortReportError(count, raw[pos : pos + length])
            count += 1
        else:
            tag, pos = _varint(raw, pos)
            if tag >> 3 == 0:
                raise WireFormatError("field number 0")
            wire_type = tag & 7
            if wire_type == 0:
                _, pos = _varint(raw, pos)
                length = 0
            elif wire_type == 1:
                length = 8
            elif wire_type == 2:
                length, pos = _varint(raw, pos)
            elif wire_type == 5:
                length = 4
            else:
                raise WireFormatError(f"unsupported wire type {wire_type}")
        pos += length
        if pos > end:
            raise WireFormatError("a field runs past the end of the message")
    return count
