#!/usr/bin/env bash
# The device install, checked for real: build a wheel of this tree, install it WITHOUT extras into
# a fresh venv (what `pip install ldp-survey` gives a phone, kiosk or tablet), check that scipy,
# tqdm and the gRPC plug-ins are absent and that ldp-aggregator names its extra, then let that
# device answer and flush against a real aggregator started from the full environment on
# loopback. Fails loudly. Run by .ci/run after the tests; about a minute (most of it pip).
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

echo "== wheel (built from a copy of the tracked files: the tree gets no build/ or egg-info)"
mkdir -p "$work/src" "$work/wheel"
git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' file; do [ -e "$file" ] && printf '%s\0' "$file"; done \
    | xargs -0 cp --parents -t "$work/src"
"$full/bin/python" -m pip wheel --quiet --no-deps --wheel-dir "$work/wheel" "$work/src" \
    || fail "could not build the wheel"
wheel="$(ls "$work"/wheel/ldp_survey-*.whl)"
echo "$wheel"

echo "== device venv: pip install <wheel>, no extras"
python3 -m venv "$work/device"
device="$work/device/bin"
"$device/python" -m pip install --quiet --disable-pip-version-check "$wheel" \
    || fail "pip install of the wheel failed"
"$device/python" -m pip list --disable-pip-version-check --format=freeze | sed 's/^/  /'

echo "== what a device must not have"
cd "$work"  # from here on nothing can be imported from the source tree by accident
"$device/python" - <<'EOF' || fail "the device install is not a device install (see above)"
import importlib.util, sys
import client
assert "/device/" in client.__file__, f"client imported from {client.__file__}, not the venv"
present = [m for m in ("scipy", "tqdm", "grpc_health", "grpc_reflection", "grpc_tools", "pandas",
                       "matplotlib", "apache_beam") if importlib.util.find_spec(m) is not None]
if present:
    sys.exit(f"installed on the device: {', '.join(present)}")
print("  absent: scipy, tqdm, grpc_health, grpc_reflection (and the other extras)")
EOF
set +e
message="$("$device/ldp-aggregator" serve 2>&1)"
status=$?
set -e
echo "  ldp-aggregator without the extra (exit $status): $message"
[ "$status" -eq 2 ] || fail "ldp-aggregator without the extra exited $status, expected 2"
[ "$(printf '%s\n' "$message" | wc -l)" -eq 1 ] || fail "ldp-aggregator printed more than one line"
case "$message" in
*"ldp-survey[aggregator]"*) ;;
*) fail "ldp-aggregator's message does not name the aggregator extra" ;;
esac

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
