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


def explain(code: str, details: str, tls: TlsSettings | None) -> str:
    """``details`` of a failed call (status ``code`` by name), led by the likely cause when the
    server closed a TLS connection in the handshake; unchanged otherwise."""
    if tls is None or code != "UNAVAILABLE" or CLOSED not in details:
        return details
    if tls.cert is None:
        cause = (
            "the server requires a client certificate (mTLS) and this device sent none: pass "
            "--tls-cert and --tls-key (a device certificate from the aggregator's operator)"
        )
    else:
        cause = (
            f"the server did not accept the device certificate {tls.cert} (signed by a CA it "
            "does not trust, expired, or without the clientAuth usage)"
        )
    return f"{cause}; gRPC: {details}"
