"""The device's Ed25519 signing key, for surveys that require authenticated devices.

The key lives in a file beside the device state (``<state>.device-key.pem``, PKCS#8 PEM, mode
0600; a key readable by others is refused, as ssh does). The device id is derived from the public
key, so there is nothing else to keep in sync: the operator enrolls the printed id and public key
with the aggregator once. Every upload attempt is signed afresh (new timestamp) over the exact
report bytes; the reports themselves are never re-randomized.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from client.device import signature as upload_signature
from protos.ldp.v1 import ldp_pb2

KEY_SUFFIX = ".device-key.pem"
DEVICE_ID_PREFIX = "dev-"


class DeviceKeyError(ValueError):
    """The key file is unreadable, not an Ed25519 PEM key, or readable by other users."""


def device_key_path(state_path: str | os.PathLike[str]) -> Path:
    """Where the key of the device whose state is ``state_path`` lives."""
    state = Path(state_path)
    return state.with_name(state.name + KEY_SUFFIX)


def device_id_for(public_key: Ed25519PublicKey) -> str:
    """``dev-`` and the first 96 bits of SHA-256 of the raw public key, in hex."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return DEVICE_ID_PREFIX + hashlib.sha256(raw).hexdigest()[:24]


class DeviceKey:
    """An Ed25519 private key, the device id derived from it, and upload signing."""

    def __init__(
        self, private_key: Ed25519PrivateKey, clock: Callable[[], float] = time.time
    ) -> None:
        self._key = private_key
        self._clock = clock
        self.device_id = device_id_for(private_key.public_key())

    @classmethod
    def load_or_create(
        cls, path: str | os.PathLike[str], clock: Callable[[], float] = time.time
    ) -> DeviceKey:
        """Load the key at ``path``, creating it (mode 0600, atomically) if there is none."""
        path = Path(path)
        if not path.exists():
            _create(path)
        return cls(_load(path), clock)

    def public_key_pem(self) -> bytes:
        return self._key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def sign_upload(
        self, reports: Sequence[ldp_pb2.Report], timestamp: int | None = None
    ) -> tuple[tuple[str, str | bytes], ...]:
        """gRPC metadata authenticating an upload of exactly ``reports`` (in this order), signed
        now unless ``timestamp`` (integer Unix seconds) is given."""
        when = int(self._clock()) if timestamp is None else timestamp
        message = upload_signature.canonical_upload(self.device_id, when, reports)
        return (
            (upload_signature.DEVICE_ID_KEY, self.device_id),
            (upload_signature.TIMESTAMP_KEY, str(when)),
            (upload_signature.SIGNATURE_KEY, self._key.sign(message)),
        )

    def sign_stream(
        self, messages: Sequence[Sequence[ldp_pb2.Report]], timestamp: int | None = None
    ) -> tuple[tuple[tuple[str, str | bytes], ...], list[bytes]]:
        """A client-streaming upload's call metadata (its signature covers the header alone) and
        each message's own signature (``UploadRequest.signature``), so the server verifies every
        message as it arrives."""
        metadata = self.sign_upload([], timestamp)
        when = int(metadata[1][1])
        signatures = [
            self._key.sign(upload_signature.canonical_upload(self.device_id, when, reports))
            for reports in messages
        ]
        return metadata, signatures


def _create(path: Path) -> None:
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temporary, path)  # atomic, and never replaces a key another process just made
    except FileExistsError:
        pass
    finally:
        temporary.unlink()


def _load(path: Path) -> Ed25519PrivateKey:
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise DeviceKeyError(f"cannot read device key {path}: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise DeviceKeyError(f"device key {path} is accessible by other users: chmod 600 it")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (TypeError, ValueError, UnsupportedAlgorithm):
        raise DeviceKeyError(f"{path} is not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise DeviceKeyError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
    return key
