#!/usr/bin/env bash
# Demo: start an aggregator on loopback, let 20,000 simulated devices randomize their answers
# locally and upload them over gRPC, then print estimates and tests and stop the server.
# Creates a virtual environment (.venv, or $LDP_VENV) if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${LDP_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet -e ".[aggregator,dev,plot]"
bin="$venv/bin"

work="$(mktemp -d)"
config=scripts/demo_survey.toml
db="$work/reports.sqlite"
devices="${DEMO_DEVICES:-20000}"
cleanup() {
    if [ -n "${server_pid:-}" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid"
        wait "$server_pid" || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

echo "== starting the aggregator (SQLite store $db)"
"$bin/ldp-aggregator" serve --config "$config" --db "$db" --port 0 --port-file "$work/port" \
    --insecure &
server_pid=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
[ -s "$work/port" ] || { echo "aggregator did not start" >&2; exit 1; }
server="127.0.0.1:$(cat "$work/port")"

declare -A truth=(
    [mood]=0.4,0.3,0.2,0.1
    [transport]=0.3,0.2,0.2,0.1,0.15,0.05
    [sleep]=0.1,0.3,0.5,0.1
    [stress]=0.25,0.4,0.25,0.1
    [smoking_by_exercise]=0.18,0.3,0.32,0.12,0.05,0.03
)
questions=(mood transport sleep stress smoking_by_exercise)
truths=()
for question in "${questions[@]}"; do truths+=(--truth "$question=${truth[$question]}"); done

echo "== what one device spends on the survey (and the ldp-client budget flags that cover it)"
"$bin/ldp-aggregator" cost --config "$config" --survey wellbeing-2026
echo
echo "== $devices devices randomize locally and upload over gRPC to $server"
"$bin/ldp-client" simulate --server "$server" --insecure --survey wellbeing-2026 --devices "$devices" \
    --seed 7 "${truths[@]}"

run() { "$bin/ldp-aggregator" "$1" --config "$config" --db "$db" --survey wellbeing-2026 "${@:2}"; }
for question in "${questions[@]}"; do
    echo
    echo "== estimate: $question (true distribution: ${truth[$question]//,/, })"
    run estimate --question "$question"
done
echo
echo "== goodness of fit: is mood uniform? (it is not)"
run test gof --question mood --p0 0.25,0.25,0.25,0.25
echo
echo "== goodness of fit: sleep against its true distribution (H0 true)"
run test gof --question sleep --p0 0.1,0.3,0.5,0.1
echo
echo "== goodness of fit: stress (Laplace, exact Monte Carlo null) against uniform"
run test gof --question stress --p0 0.25,0.25,0.25,0.25 --seed 1
echo
echo "== independence: smoking and exercise (dependent in truth)"
run test independence --question smoking_by_exercise
echo
echo "== the survey report (every question, plots, the tests declared in the survey file)"
"$bin/ldp-aggregator" report --config "$config" --db "$db" --survey wellbeing-2026 \
    --out demo-report.html
echo "   open demo-report.html in a browser"
echo
echo "== stopping the aggregator"
