"""One port, one service: a server refuses to start on an address another program already
serves, instead of sharing it by accident (SO_REUSEPORT) or failing later."""

from __future__ import annotations

import socket

from aggregator.errors import LdpError


class PortInUseError(LdpError):
    """The address asked for is already bound by another socket (another aggregator, maybe)."""


def ensure_port_free(host: str, port: int) -> None:
    """Raise PortInUseError if anything is bound to ``host:port`` (0: nothing to check). The
    probe binds without SO_REUSEPORT, so a group of servers sharing the port conflicts too, and
    with SO_REUSEADDR, so connections of an earlier server in TIME_WAIT do not."""
    if port == 0:
        return
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError:
            raise PortInUseError(f"{host}:{port} is in use: another program serves it") from None
