"""The ``ldp-aggregator`` console script: checks that the ``aggregator`` extra is installed, then
hands over to :mod:`aggregator.cli`.

``pip install ldp-survey`` installs a device (numpy, grpcio, protobuf, cryptography); the
aggregator's dependencies come with ``pip install 'ldp-survey[aggregator]'``. Without them this
prints one line naming the extra and exits 2, never a traceback from deep inside an import.
Standard library only until the check has passed.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence

#: Import name -> distribution of every package the ``aggregator`` extra adds (tqdm is optional
#: everywhere: without it there is simply no progress bar).
EXTRA_MODULES = {
    "scipy": "scipy",
    "grpc_health": "grpcio-health-checking",
    "grpc_reflection": "grpcio-reflection",
}
EXTRA_HINT = "pip install 'ldp-survey[aggregator]'"


def missing_modules() -> list[str]:
    """Distributions of the ``aggregator`` extra that cannot be imported here."""
    return [dist for module, dist in EXTRA_MODULES.items() if not _importable(module)]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def main(argv: Sequence[str] | None = None) -> int:
    missing = missing_modules()
    if missing:
        print(
            f"ldp-aggregator: error: the aggregator needs the 'aggregator' extra "
            f"({', '.join(missing)} missing): {EXTRA_HINT}",
            file=sys.stderr,
        )
        return 2
    from aggregator.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
