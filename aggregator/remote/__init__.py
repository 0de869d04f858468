"""The analyst's way to a running server: ``aggregator.remote.connect("host:port", ...)``
gives a RemoteAnalyst whose histograms, estimates and tests are those of the local API
(aggregator.open_survey, aggregator.stats) computed from what the server releases, and whose
preregister, confirm and holdout run on the server (docs/architecture.md, "Reaching a running
server"). It imports nothing of the server side (service, store writers, command line)."""

from __future__ import annotations

import os

from aggregator.remote.analyst import (
    DEFAULT_TIMEOUT,
    HoldoutAnswer,
    Registration,
    Released,
    RemoteAnalyst,
)
from aggregator.remote.channel import AnalystCredentials, ConnectionSettingsError, read_token
from aggregator.remote.errors import NotReleasedError, RemoteError

__all__ = [
    "AnalystCredentials",
    "ConnectionSettingsError",
    "HoldoutAnswer",
    "NotReleasedError",
    "Registration",
    "Released",
    "RemoteAnalyst",
    "RemoteError",
    "connect",
]


def connect(
    address: str,
    *,
    tls_ca: str | os.PathLike[str] | None = None,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    token: str | None = None,
    token_file: str | os.PathLike[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> RemoteAnalyst:
    """The Analyst service at ``address`` (HOST:PORT): TLS with the server's CA ``tls_ca``
    (without it plaintext, to a loopback address only), an analyst certificate and key for
    mTLS, a bearer ``token`` (or the one line of ``token_file``). Raises
    ConnectionSettingsError (a ValueError) for settings that cannot work; nothing is sent yet."""
    from pathlib import Path

    if token is not None and token_file is not None:
        raise ConnectionSettingsError("give token or token_file, not both")
    credentials = AnalystCredentials(
        tls_ca=None if tls_ca is None else Path(tls_ca),
        tls_cert=None if tls_cert is None else Path(tls_cert),
        tls_key=None if tls_key is None else Path(tls_key),
        token=read_token(token_file) if token_file is not None else token,
    )
    return RemoteAnalyst(address, credentials, timeout)
