"""``ldp-client simulate`` against a survey that requires signed uploads: keys made with
``simulate-keys``, enrolled as a folder while the server runs, each simulated device signing its
own upload; and ``--truth @FILE`` (JSON or one ``QUESTION=P1,...`` per line). Real server on
loopback, real SQLite store and registry."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_runner import run_cli
from conftest import ServerThread

import aggregator
from aggregator.service.collector.registry import DeviceRegistry
from aggregator.stats import estimate

SURVEYS = """
[[survey]]
id = "clinic"
require_device_auth = true
min_batch_size = 10

[[survey.question]]
id = "insured"
categories = ["yes", "no", "unsure"]
mechanism = "randomized_response"
epsilon = 2.0

[[survey.question]]
id = "mood"
categories = ["low", "mid", "high"]
mechanism = "randomized_response"
epsilon = 2.0

[[survey]]
id = "open"
min_batch_size = 10

[[survey.question]]
id = "insured"
categories = ["yes", "no", "unsure"]
mechanism = "randomized_response"
epsilon = 2.0
"""
TRUTH = [0.7, 0.2, 0.1]


@pytest.fixture
def served(tmp_path):
    """A server whose registry is empty at start; (server, config, registry)."""
    config = tmp_path / "surveys.toml"
    config.write_text(SURVEYS)
    registry = tmp_path / "devices.sqlite"
    DeviceRegistry(registry, create=True).close()
    server = ServerThread(config, tmp_path / "reports.sqlite", devices=registry).start()
    yield server, config, registry
    server.stop()


def simulate(server, *args: str, survey: str = "clinic"):
    base = ("simulate", "--server", server.target, "--insecure", "--survey", survey)
    return run_cli("client", *base, *args)


def one_line(done, fragment: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and fragment in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_simulated_devices_sign_with_keys_enrolled_while_serving(served, tmp_path):
    server, config, registry = served
    keys = tmp_path / "sim-keys"
    refused = simulate(server, "--devices", "40")
    one_line(refused, "requires signed uploads: give the simulated devices enrolled keys")
    missing = simulate(server, "--devices", "40", "--keys", keys)
    one_line(missing, "ldp-client simulate-keys --out")

    made = run_cli("client", "simulate-keys", "--out", keys, "--devices", "40", check=True)
    assert made.stdout.startswith("40 new simulated device keys")
    assert len(list(keys.glob("*.pub"))) == 40 and (keys.stat().st_mode & 0o077) == 0
    unenrolled = simulate(server, "--devices", "40", "--keys", keys)
    one_line(unenrolled, "UNAUTHENTICATED")

    enrolled = run_cli("agg", "enroll", "--devices", registry, "--public-key", keys, check=True)
    assert enrolled.stdout.startswith("enrolled 40 new devices")
    done = simulate(server, "--devices", "40", "--keys", keys, "--json", "--seed", "1")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["accepted"], summary["duplicate"]) == (80, 0)
    data = aggregator.open_survey(config, server.db, "clinic")
    assert data["insured"].n == data["mood"].n == 40
    again = run_cli("client", "simulate-keys", "--out", keys, "--devices", "40", check=True)
    assert again.stdout.startswith("0 new simulated device keys")


def test_enroll_a_folder_is_all_or_nothing(served, tmp_path):
    _, _, registry = served
    keys = tmp_path / "keys"
    run_cli("client", "simulate-keys", "--out", keys, "--devices", "3", check=True)
    (keys / "sim-000002.pub").write_text("not a key\n")
    done = run_cli("agg", "enroll", "--devices", registry, "--public-key", keys)
    assert done.returncode != 0 and "sim-000002.pub: not a PEM public key" in done.stderr
    with DeviceRegistry(registry, read_only=True) as opened:
        assert opened.devices() == []


@pytest.mark.parametrize("form", ["json", "labels", "lines"])
def test_truth_from_a_file(served, tmp_path, form):
    """The file's distribution is the one the simulated devices answer from: the estimate of
    1,500 devices (epsilon 2, k = 3) is within 4 standard errors of it in every category (the
    answers are seeded, the randomization is the device's secure one)."""
    server, config, _ = served
    path = tmp_path / "truth.txt"
    if form == "json":
        path.write_text(json.dumps({"insured": TRUTH}))
    elif form == "labels":
        path.write_text(json.dumps({"insured": {"no": 0.2, "unsure": 0.1, "yes": 0.7}}))
    else:
        path.write_text("# clinic truths\n\ninsured = 0.7, 0.2, 0.1\n")
    done = simulate(
        server, "--devices", "1500", "--truth", f"@{path}", "--seed", "7", survey="open"
    )
    assert done.returncode == 0, done.stderr
    result = estimate(aggregator.open_survey(config, server.db, "open")["insured"].histogram)
    assert np.all(np.abs(result.frequencies - TRUTH) < 4 * result.standard_errors)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "cannot read it"),
        ('{"insured": [0.5, 0.5', "not valid JSON (line 1"),
        ('{"insured": [0.5, 0.5]}', "need 3 non-negative probabilities"),
        ('{"insured": {"yes": 0.5, "maybe": 0.5}}', "unknown label 'maybe'"),
        ('{"smoking": [0.5, 0.25, 0.25]}', "names unknown question 'smoking'"),
        ("insured 0.5,0.25,0.25\n", "line 1: expected QUESTION=P1,P2,..."),
        ("insured=0.5,0.5,0.5\n", "sum to 1.5, not 1"),
        ('{"insured": ["a", "b", "c"]}', "probabilities must be numbers"),
    ],
)
def test_a_bad_truth_file_is_one_line(served, tmp_path, content, fragment):
    server, _, _ = served
    path = tmp_path / "truth.json"
    if content is not None:
        path.write_text(content)
    one_line(simulate(server, "--devices", "2", "--truth", f"@{path}", survey="open"), fragment)
