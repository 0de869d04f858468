#!/usr/bin/env bash
# Run the test suite. Creates a virtual environment (.venv, or $LDP_VENV) if it is missing.
#
#   scripts/test.sh              the full tier: every test (what CI runs)
#   scripts/test.sh --fast       the fast tier: every test not marked `slow` (docs/testing.md)
#   scripts/test.sh tests/cli/test_cli.py -k flow -n 0    other arguments go to pytest
#
# Tests run in $LDP_TEST_WORKERS pytest-xdist processes (default: auto, one per core), a test
# file per process; `-n 0` on the command line runs them in this one.
set -euo pipefail
# Cache bytecode and pytest's rewritten test modules (__pycache__/, ignored by git): collecting
# the suite then takes a third of the time.
unset PYTHONDONTWRITEBYTECODE
cd "$(dirname "$0")/.."
venv="${LDP_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
# (Re)install when pyproject.toml changed since the last install into this venv.
stamp="$venv/.ldp-survey-installed"
wanted="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    "$venv/bin/python" -m pip install --quiet --upgrade pip >/dev/null
    "$venv/bin/python" -m pip install --quiet -e ".[aggregator,dev,beam,plot,metrics,frame,postgres]"
    echo "$wanted" >"$stamp"
fi
tier=()
args=()
for arg in "$@"; do
    if [ "$arg" = "--fast" ]; then
        tier=(-m "not slow")
    else
        args+=("$arg")
    fi
done
exec "$venv/bin/python" -m pytest -n "${LDP_TEST_WORKERS:-auto}" --dist loadfile \
    ${tier[@]+"${tier[@]}"} ${args[@]+"${args[@]}"}
