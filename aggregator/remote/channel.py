"""How an analyst reaches a server's Analyst service: the address, TLS (server CA, optionally an
analyst client certificate) and a bearer token, checked before any call. Without a CA the
channel is plaintext, which is allowed to a loopback address only: anywhere else the token,
the plan and the statistics would cross the network in the clear."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from client.device.tls import read_certificates, read_key_pair
from client.device.transport import MAX_MESSAGE_BYTES

#: Host names that resolve to the loopback interface without asking DNS.
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class ConnectionSettingsError(ValueError):
    """An address or credential that cannot work: refused before any call."""


@dataclass(frozen=True)
class AnalystCredentials:
    """The analyst's side of the Analyst listener's credentials (docs/operations.md): the CA
    that signed the server certificate (None: plaintext, loopback only), an analyst client
    certificate and key (mTLS), and a bearer token sent as ``authorization: Bearer <token>``."""

    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    token: str | None = None

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConnectionSettingsError("--tls-cert and --tls-key go together")
        if self.tls_cert is not None and self.tls_ca is None:
            raise ConnectionSettingsError(
                "a client certificate needs --tls-ca (the CA of the server's certificate)"
            )
        if self.token is not None and (not self.token or any(c in self.token for c in "\r\n")):
            raise ConnectionSettingsError("the token must be one non-empty line")

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The call metadata every RPC carries: the bearer token, if any."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


def read_token(path: str | os.PathLike[str]) -> str:
    """The token of a token file: its one line, without the line break."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConnectionSettingsError(f"cannot read token file {path}: {exc}") from None
    lines = text.splitlines()
    if len(lines) != 1 or not lines[0].strip():
        raise ConnectionSettingsError(f"token file {path} must hold the token on one line")
    return lines[0].strip()


def host_of(address: str) -> str:
    """The host of HOST:PORT or [IPv6]:PORT; ConnectionSettingsError for anything else."""
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise ConnectionSettingsError(f"--server {address!r}: expected HOST:PORT")
    return host


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or a loopback name."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_channel(address: str, credentials: AnalystCredentials) -> grpc.Channel:
    """A channel to ``address``: TLS with the given CA (and client certificate), or plaintext
    to a loopback address; the certificate files are read now, so mistakes surface here."""
    host = host_of(address)
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    if credentials.tls_ca is None:
        if not is_loopback(host):
            raise ConnectionSettingsError(
                f"--server {address}: plaintext is allowed to a loopback address only; give "
                "--tls-ca (the CA of the server's certificate)"
            )
        return grpc.insecure_channel(address, options=options)
    roots = read_certificates(credentials.tls_ca, "CA certificate")
    if credentials.tls_cert is None or credentials.tls_key is None:
        tls = grpc.ssl_channel_credentials(root_certificates=roots)
    else:
        chain, key = read_key_pair(credentials.tls_cert, credentials.tls_key, "analyst")
        tls = grpc.ssl_channel_credentials(
            root_certificates=roots, private_key=key, certificate_chain=chain
        )
    return grpc.secure_channel(address, tls, options=options)
