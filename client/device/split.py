"""Which side of a survey's exploration/confirmation split this device reports on.

The side is a keyed hash of the survey id under a secret that never leaves the device, so every
report of one device in one survey falls on the same side (across restarts), the aggregator
learns only the side, and nobody without the secret can predict or steer it. The mapping is the
normative one of docs/wire.md §3.10 (conformance vectors in protos/ldp/v1/testvectors.json).
"""

from __future__ import annotations

import hashlib
import hmac
import os

from client.device.database import connect, immediate
from client.device.household import household_secret
from protos.ldp.v1 import ldp_pb2

SECRET_BYTES = 32
DOMAIN = b"ldp-survey split v1"


def split_point(secret: bytes, survey_id: str) -> int:
    """v in [0, 2^64): the first 8 bytes, big-endian, of HMAC-SHA256(secret, len || DOMAIN ||
    len || survey id as UTF-8), each len 8 bytes big-endian (the device's point is v / 2^64)."""
    if not isinstance(secret, bytes) or len(secret) < 16:
        raise ValueError("the split secret must be at least 16 bytes")
    fields = (DOMAIN, survey_id.encode("utf-8"))
    message = b"".join(len(field).to_bytes(8, "big") + field for field in fields)
    digest = hmac.new(secret, message, hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big")


def split_side(secret: bytes, survey_id: str, exploration_fraction: float) -> ldp_pb2.Side:
    """The ``ldp.v1.Side`` of this device's reports: EXPLORATION when v < fraction * 2^64
    (compared exactly; Python compares an int with a float exactly), else CONFIRMATION;
    SIDE_UNSPECIFIED for a survey that is not split (fraction 0)."""
    if not exploration_fraction:
        return ldp_pb2.SIDE_UNSPECIFIED
    if not 0 < exploration_fraction < 1:
        raise ValueError(f"exploration_fraction must be in (0, 1), got {exploration_fraction!r}")
    if split_point(secret, survey_id) < exploration_fraction * 2.0**64:
        return ldp_pb2.EXPLORATION
    return ldp_pb2.CONFIRMATION


def split_secret(path: str | os.PathLike[str]) -> bytes:
    """The secret that decides this device's sides: the household secret of a device enrolled in
    a household (so a household falls on one side, privacy-accounting spec §D.3), else 32
    random bytes created once in the device database (0600)."""
    shared = household_secret(path)
    if shared is not None:
        return shared
    conn = connect(path)
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS split_secret ("
            " id INTEGER PRIMARY KEY CHECK (id = 1),"
            " secret BLOB NOT NULL CHECK (length(secret) = 32))"
        )
        with immediate(conn):
            row = conn.execute("SELECT secret FROM split_secret WHERE id = 1").fetchone()
            if row is not None:
                return row[0]
            secret = os.urandom(SECRET_BYTES)
            conn.execute("INSERT INTO split_secret VALUES (1, ?)", (secret,))
        return secret
    finally:
        conn.close()
