"""What a refused TLS handshake means, said to the device's user.

A server that requires client certificates (mTLS) checks the device's certificate after the
TLS 1.3 handshake has finished on the device's side, then closes the connection: all gRPC tells
the device is UNAVAILABLE "Socket closed". The device knows what it sent, so it can say what the
server most likely refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from client.device.tls import TlsSettings

CLOSED = "Socket closed"


def likely_cause(code: str, details: str, tls: TlsSettings | None) -> str:
    """What the server most likely refused when it closed a TLS connection in the handshake
    (status ``code`` by name, gRPC's ``details``); "" for any other failure. Only a hint for
    the user: the failure stays what gRPC said (a device with its certificate missing and a
    device out of signal both see "Socket closed", so it still answers offline)."""
    if tls is None or code != "UNAVAILABLE" or CLOSED not in details:
        return ""
    if tls.cert is None:
        return (
            "the server requires a client certificate (mTLS) and this device sent none: pass "
            "--tls-cert and --tls-key (a device certificate from the aggregator's operator)"
        )
    return (
        f"the server did not accept the device certificate {tls.cert} (signed by a CA it "
        "does not trust, expired, or without the clientAuth usage)"
    )
