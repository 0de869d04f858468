"""A health probe for containers and service managers: asks a running aggregator's standard gRPC
health service whether it is SERVING.

    python -m aggregator.service.server.healthcheck --server 127.0.0.1:50051 --insecure
    python -m aggregator.service.server.healthcheck --server localhost:50051 --tls-ca ca.pem \
        [--tls-cert probe.pem --tls-key probe.key]      # mTLS servers need a client certificate

Exit 0 when SERVING, 1 when the server answers anything else (NOT_SERVING while it drains or its
store has failed), 2 when it cannot be reached or the flags are wrong; one line on stdout or stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client.device.tls import TlsConfigError, TlsSettings


def check(target: str, tls: TlsSettings | None, service: str = "", timeout: float = 3.0) -> str:
    """The serving status name the server reports for ``service`` ("" = the whole server)."""
    if tls is None:
        channel = grpc.insecure_channel(target)
    else:
        channel = grpc.secure_channel(target, tls.credentials())
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aggregator.service.server.healthcheck", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--server", required=True, help="host:port of the aggregator")
    parser.add_argument("--insecure", action="store_true", help="plaintext (loopback only)")
    parser.add_argument("--tls-ca", type=Path, help="CA certificate that signed the server's")
    parser.add_argument("--tls-cert", type=Path, help="client certificate (mTLS servers)")
    parser.add_argument("--tls-key", type=Path, help="client key (mTLS servers)")
    parser.add_argument("--service", default="", help="one service name (default: the server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds (default: 3)")
    args = parser.parse_args(argv)
    if args.insecure == (args.tls_ca is not None):
        print("healthcheck: give exactly one of --insecure and --tls-ca", file=sys.stderr)
        return 2
    try:
        tls = None if args.insecure else TlsSettings(args.tls_ca, args.tls_cert, args.tls_key)
        status = check(args.server, tls, args.service, args.timeout)
    except TlsConfigError as exc:
        print(f"healthcheck: {exc}", file=sys.stderr)
        return 2
    except grpc.RpcError as exc:
        print(f"healthcheck: {args.server}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 2
    print(status)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
