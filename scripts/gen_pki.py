"""Create a CA, a server certificate and device certificates for TLS/mTLS (EC P-256, SHA-256),
and an analyst CA with analyst certificates.

Writes ``ca.pem``/``ca.key``, ``server.pem``/``server.key`` (SAN localhost, 127.0.0.1 and every
``--host NAME`` or address the devices dial),
``device-0001.pem``/``.key``..., and with ``--analysts N`` (default 1) ``analyst-ca.pem``/``.key``
and ``analyst-0001.pem``/``.key``... into ``--out``; keys are unencrypted with mode 0600 and
existing files are never overwritten. Then, for example::

    ldp-aggregator serve ... --tls-cert DIR/server.pem --tls-key DIR/server.key \\
        --client-ca DIR/ca.pem --analyst-client-ca DIR/analyst-ca.pem
    ldp-client submit --server localhost:50051 --tls-ca DIR/ca.pem \\
        --tls-cert DIR/device-0001.pem --tls-key DIR/device-0001.key ...

Renewing the server certificate (devices trust the CA, so they notice nothing)::

    python scripts/gen_pki.py --renew-server-from DIR --out NEW --host ingest-1.example.org

writes ``NEW/server.pem``/``.key`` signed by ``DIR/ca.key``; swap them in and restart the node.

An analyst connects to the analyst port (50052) with ``analyst-0001.pem``/``.key``, trusting
``ca.pem`` (the server certificate's CA). Keep ``ca.key`` and ``analyst-ca.key`` off the
aggregator, the devices and the analysts' machines: they only sign new certificates.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    from aggregator.service.server.pki import renew_server, write_pki
except ModuleNotFoundError as missing:  # run by a Python without the project installed
    package = "ldp-survey" if (missing.name or "").startswith("aggregator") else missing.name
    sys.exit(
        f"gen_pki: error: this Python has no {package!r} package; run it in the project's "
        "environment: `. .venv/bin/activate` (scripts/test.sh creates .venv) or "
        "`pip install -e '.[aggregator]'`"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--devices", type=int, default=1, help="device certificates (default 1)")
    parser.add_argument("--days", type=float, default=365, help="validity in days (default 365)")
    parser.add_argument(
        "--analysts", type=int, default=1, help="analyst certificates (default 1; 0: no analyst CA)"
    )
    parser.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME",
        help="a DNS name or IP address devices dial, put in the server certificate beside "
        "localhost and 127.0.0.1 (repeatable)",
    )
    parser.add_argument(
        "--renew-server-from",
        type=Path,
        metavar="DIR",
        help="only a new server certificate, signed by DIR/ca.pem and DIR/ca.key, into --out",
    )
    args = parser.parse_args(argv)
    if args.devices < 0 or args.analysts < 0 or args.days <= 0:
        print("gen_pki: error: --devices/--analysts must be >= 0 and --days > 0", file=sys.stderr)
        return 2
    try:
        if args.renew_server_from is not None:
            written = renew_server(args.out, args.renew_server_from, args.host, args.days)
        else:
            written = write_pki(args.out, args.devices, args.days, args.analysts, args.host)
    except (OSError, ValueError) as exc:
        print(f"gen_pki: error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
