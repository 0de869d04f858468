#!/usr/bin/env bash
# The device install, checked for real: build the device distribution (ldp-survey-device: client
# and protos only, scripts/build_device_wheel.py), install it into a fresh venv the way a phone,
# kiosk or tablet would (python -m venv, pip install <wheel>), check that it pulled only numpy,
# grpcio, protobuf and cryptography (and what they require) and that the aggregator, scipy, tqdm
# and the gRPC plug-ins are absent, then let that device answer and flush against a real
# aggregator started from the full environment on loopback, and replay the conformance vectors
# shipped in the wheel. Fails loudly. Run by .ci/run after the tests; about a minute (most of it
# pip).
#
#   LDP_VENV=.ci-venv bash scripts/check_device_install.sh     # the aggregator's venv (.venv)
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
full="${LDP_VENV:-.venv}"
[ -x "$full/bin/python" ] || { echo "DEVICE CHECK FAILED: no venv at $full (LDP_VENV)" >&2; exit 1; }
full="$(cd "$full" && pwd)"

fail() {
    echo "DEVICE CHECK FAILED: $*" >&2
    exit 1
}

work="$(mktemp -d)"
cleanup() {
    # the aggregator started below (its own pid only), then the scratch folder
    [ -z "${server_pid:-}" ] || { kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid"; } || true
    rm -rf "$work"
}
trap cleanup EXIT

echo "== device wheel (scripts/build_device_wheel.py: built from a copy, the tree gets no build/)"
wheel="$("$full/bin/python" scripts/build_device_wheel.py "$work/wheel")" \
    || fail "could not build the device wheel"
echo "$wheel"

echo "== device venv: python -m venv, pip install <device wheel>"
python3 -m venv "$work/device"
device="$work/device/bin"
"$device/python" -m pip install --quiet --disable-pip-version-check "$wheel" \
    || fail "pip install of the device wheel failed"
"$device/python" -m pip list --disable-pip-version-check --format=freeze | sed 's/^/  /'

echo "== what a device must not have"
cd "$work"  # from here on nothing can be imported from the source tree by accident
"$device/python" - <<'EOF' || fail "the device install is not a device install (see above)"
import importlib.metadata as md, importlib.util, re, sys

def name(requirement: str) -> str:
    return re.split(r"[^A-Za-z0-9._-]", requirement, maxsplit=1)[0].lower().replace("_", "-")

import client
assert "/device/" in client.__file__, f"client imported from {client.__file__}, not the venv"
direct = {name(r) for r in md.requires("ldp-survey-device") or []}
if direct != {"numpy", "grpcio", "protobuf", "cryptography"}:
    sys.exit(f"ldp-survey-device requires {sorted(direct)}")
# what the device pulled: its four requirements and, transitively, theirs (markers that hold here)
pulled, todo = set(), ["ldp-survey-device"]
while todo:
    dist = todo.pop()
    if dist in pulled:
        continue
    pulled.add(dist)
    for requirement in md.requires(dist) or []:
        if ";" not in requirement or "extra" not in requirement.split(";", 1)[1]:
            try:
                md.distribution(name(requirement))
            except md.PackageNotFoundError:
                continue  # a requirement under a marker that does not hold here
            todo.append(name(requirement))
installed = {d.metadata["Name"].lower().replace("_", "-") for d in md.distributions()}
extra = installed - pulled - {"pip", "setuptools"}
if extra:
    sys.exit(f"installed on the device beyond what ldp-survey-device pulls: {sorted(extra)}")
present = [m for m in ("aggregator", "scipy", "tqdm", "grpc_health", "grpc_reflection",
                       "grpc_tools", "pandas", "matplotlib", "apache_beam")
           if importlib.util.find_spec(m) is not None]
if present:
    sys.exit(f"installed on the device: {', '.join(present)}")
print(f"  pulled: {', '.join(sorted(pulled - {'ldp-survey-device'}))}")
print("  absent: aggregator, scipy, tqdm, grpc_health, grpc_reflection (and the other extras)")
EOF
[ ! -e "$device/ldp-aggregator" ] || fail "the device install has an ldp-aggregator script"

echo "== a real aggregator (full environment) on loopback"
(cd "$repo" && exec "$full/bin/python" -m aggregator.entry serve --config scripts/demo_survey.toml \
    --db "$work/reports.sqlite" --port 0 --port-file "$work/port" --insecure) &
server_pid=$!
for _ in $(seq 300); do [ -s "$work/port" ] && break; sleep 0.1; done
[ -s "$work/port" ] || fail "the aggregator did not start"
server="127.0.0.1:$(cat "$work/port")"

echo "== the device answers (queued), then flushes"
"$device/ldp-client" submit --server "$server" --insecure --state "$work/device.sqlite" \
    --budget 12.7566 --pointwise 7 --survey wellbeing-2026 --question mood --answer fine \
    --no-flush --json || fail "ldp-client submit failed"
"$device/ldp-client" submit --server "$server" --insecure --state "$work/device.sqlite" \
    --survey wellbeing-2026 --question transport --answer bike --no-flush \
    || fail "ldp-client submit failed"
flushed="$("$device/ldp-client" flush --server "$server" --insecure --state "$work/device.sqlite" \
    --json)" || fail "ldp-client flush failed: $flushed"
echo "  $flushed"
"$device/python" -c 'import json, sys
r = json.loads(sys.argv[1])
sys.exit(0 if (r["accepted"], r["pending"], r["error"]) == (2, 0, "") else f"flush: {r}")' \
    "$flushed" || fail "the aggregator did not accept both reports"
echo "== the device replays the conformance vectors shipped in the wheel (ldp-client selftest)"
"$device/ldp-client" selftest || fail "ldp-client selftest failed on the device install"
echo "== device install OK"
