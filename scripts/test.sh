#!/usr/bin/env bash
# Run the test suite. Creates a virtual environment (.venv, or $LDP_VENV) if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${LDP_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip >/dev/null
"$venv/bin/python" -m pip install --quiet -e ".[aggregator,dev,beam,plot,metrics,frame]"
exec "$venv/bin/python" -m pytest "$@"
