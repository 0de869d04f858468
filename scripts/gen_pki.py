"""Create a CA, a server certificate and device certificates for TLS/mTLS (EC P-256, SHA-256),
and an analyst CA with analyst certificates.

Writes ``ca.pem``/``ca.key``, ``server.pem``/``server.key`` (SAN localhost and 127.0.0.1),
``device-0001.pem``/``.key``..., and with ``--analysts N`` (default 1) ``analyst-ca.pem``/``.key``
and ``analyst-0001.pem``/``.key``... into ``--out``; keys are unencrypted with mode 0600 and
existing files are never overwritten. Then, for example::

    ldp-aggregator serve ... --tls-cert DIR/server.pem --tls-key DIR/server.key \\
        --client-ca DIR/ca.pem --analyst-client-ca DIR/analyst-ca.pem
    ldp-client submit --server localhost:50051 --tls-ca DIR/ca.pem \\
        --tls-cert DIR/device-0001.pem --tls-key DIR/device-0001.key ...

An analyst connects to the analyst port (50052) with ``analyst-0001.pem``/``.key``, trusting
``ca.pem`` (the server certificate's CA). Keep ``ca.key`` and ``analyst-ca.key`` off the
aggregator, the devices and the analysts' machines: they only sign new certificates.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    from aggregator.service.server.pki import write_pki
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
    args = parser.parse_args(argv)
    if args.devices < 0 or args.analysts < 0 or args.days <= 0:
        print("gen_pki: error: --devices/--analysts must be >= 0 and --days > 0", file=sys.stderr)
        return 2
    try:
        written = write_pki(args.out, args.devices, args.days, args.analysts)
    except OSError as exc:
        print(f"gen_pki: error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
