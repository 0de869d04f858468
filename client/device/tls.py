"""TLS material from PEM files, checked before gRPC sees it.

gRPC reports a bad certificate or key late and vaguely (a failed bind, or every call UNAVAILABLE),
so the files are parsed with ``cryptography`` first and each mistake gets a one-line
:class:`TlsConfigError` naming the file. The aggregator reuses the readers for its side.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes


class TlsConfigError(ValueError):
    """A certificate or key file is missing, unreadable, not PEM, encrypted, or mismatched."""


def _read(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TlsConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def read_certificates(path: str | os.PathLike[str], what: str) -> bytes:
    """The PEM bytes of a file holding one or more certificates (leaf first for a chain)."""
    data = _read(path, what)
    try:
        x509.load_pem_x509_certificates(data)
    except ValueError:
        raise TlsConfigError(f"{what} {path} holds no valid PEM certificate") from None
    return data


def _load_key(data: bytes, path: str | os.PathLike[str], what: str) -> PrivateKeyTypes:
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise TlsConfigError(f"{what} {path} is encrypted; give an unencrypted key") from None
    except (ValueError, UnsupportedAlgorithm):
        raise TlsConfigError(f"{what} {path} holds no valid PEM private key") from None


def read_key_pair(
    cert_path: str | os.PathLike[str], key_path: str | os.PathLike[str], what: str
) -> tuple[bytes, bytes]:
    """(certificate chain PEM, private key PEM), checked to belong together and to be valid now
    (an expired certificate would only show up as UNAVAILABLE on every call)."""
    chain = read_certificates(cert_path, f"{what} certificate")
    key_pem = _read(key_path, f"{what} key")
    key = _load_key(key_pem, key_path, f"{what} key")
    leaf = x509.load_pem_x509_certificates(chain)[0]
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    encoding = serialization.Encoding.DER
    if leaf.public_key().public_bytes(encoding, public) != key.public_key().public_bytes(
        encoding, public
    ):
        raise TlsConfigError(f"{what} key {key_path} does not match certificate {cert_path}")
    now = dt.datetime.now(dt.UTC)
    if not leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc:
        raise TlsConfigError(
            f"{what} certificate {cert_path} is valid only from {leaf.not_valid_before_utc} "
            f"to {leaf.not_valid_after_utc}"
        )
    return chain, key_pem


@dataclass(frozen=True)
class TlsSettings:
    """How a device reaches the aggregator over TLS: the CA that signed the server certificate,
    and for mTLS the device's own certificate and key."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise TlsConfigError("a device certificate needs its key and vice versa")

    def credentials(self) -> grpc.ChannelCredentials:
        """Channel credentials from the files (read now, so mistakes surface before any call)."""
        roots = read_certificates(self.ca, "CA certificate")
        if self.cert is None or self.key is None:
            return grpc.ssl_channel_credentials(root_certificates=roots)
        chain, key = read_key_pair(self.cert, self.key, "device")
        return grpc.ssl_channel_credentials(
            root_certificates=roots, private_key=key, certificate_chain=chain
        )
