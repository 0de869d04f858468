"""Server-side TLS: gRPC server credentials from PEM files, with one-line errors for bad files.

Without a client CA the server authenticates itself only (TLS); with one, every client must present
a certificate chaining to that CA with EKU clientAuth, valid now (mTLS). gRPC's TLS stack enforces
all of that during the handshake, so a refused client sees UNAVAILABLE, never a response.
"""

from __future__ import annotations

import os

import grpc

from client.device.tls import read_certificates, read_key_pair


def server_credentials(
    cert: str | os.PathLike[str],
    key: str | os.PathLike[str],
    client_ca: str | os.PathLike[str] | None = None,
) -> grpc.ServerCredentials:
    """Credentials for ``start_server``; mTLS (client certificate required) iff ``client_ca``.

    Raises ``TlsConfigError`` for an unreadable, invalid, encrypted or mismatched file.
    """
    chain, key_pem = read_key_pair(cert, key, "server")
    if client_ca is None:
        return grpc.ssl_server_credentials([(key_pem, chain)])
    roots = read_certificates(client_ca, "client CA certificate")
    return grpc.ssl_server_credentials(
        [(key_pem, chain)], root_certificates=roots, require_client_auth=True
    )
