"""The exploration/confirmation split on the device: the documented mapping (vectors, and a
second implementation from docs/wire.md §3.10), one side per device and survey across restarts,
the declared fractions over many device secrets, and the survey field on the wire and in TOML."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from pathlib import Path

import pytest
from scipy import stats

from aggregator.survey_file.config import load_surveys
from client.device.ledger import Budget
from client.device.reporter import Reporter
from client.device.split import split_point, split_secret, split_side
from client.device.transport import Transport
from client.survey import SurveyError, SurveySpec
from protos.ldp.v1 import ldp_pb2

ROOT = Path(__file__).resolve().parents[2]
VECTORS = json.loads((ROOT / "protos" / "ldp" / "v1" / "testvectors.json").read_text())["splits"]

SPLIT_TOML = """
[[survey]]
id = "split"
min_batch_size = 5
exploration_fraction = {fraction}

[[survey.question]]
id = "rr"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0
"""


def _from_the_document(secret: bytes, survey_id: str, fraction: float) -> str:
    """docs/wire.md §3.10, written from the text alone."""
    if fraction == 0:
        return "SIDE_UNSPECIFIED"
    domain, name = b"ldp-survey split v1", survey_id.encode("utf-8")
    message = len(domain).to_bytes(8, "big") + domain + len(name).to_bytes(8, "big") + name
    v = int.from_bytes(hmac.new(secret, message, hashlib.sha256).digest()[:8], "big")
    return "EXPLORATION" if v < fraction * 2**64 else "CONFIRMATION"


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: f"{v['survey_id']}-{v['side']}")
def test_vectors(vector):
    secret = bytes.fromhex(vector["secret_hex"])
    fraction = vector["exploration_fraction"]
    assert str(split_point(secret, vector["survey_id"])) == vector["split_point"]
    side = split_side(secret, vector["survey_id"], fraction)
    assert ldp_pb2.Side.Name(side) == vector["side"]
    assert _from_the_document(secret, vector["survey_id"], fraction) == vector["side"]


def test_vectors_cover_both_sides_and_no_split():
    assert {v["side"] for v in VECTORS} == {"EXPLORATION", "CONFIRMATION", "SIDE_UNSPECIFIED"}


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.8])
def test_fractions_hold_over_many_device_secrets(fraction):
    """20,000 fresh device secrets: the exploration count is Binomial(n, fraction); it must lie
    in the central 1 - 1e-6 band (a false failure once in a million runs per fraction)."""
    n = 20_000
    explored = sum(
        split_side(os.urandom(32), "survey-x", fraction) == ldp_pb2.EXPLORATION for _ in range(n)
    )
    low, high = stats.binom.ppf([5e-7, 1 - 5e-7], n, fraction)
    assert low <= explored <= high, (explored, low, high)


def test_sides_of_different_surveys_are_independent():
    """The survey id is hashed in: a device's side in one survey says nothing of another's
    (agreement over 20,000 devices at 50/50 is Binomial(n, 1/2))."""
    n = 20_000
    agree = 0
    for _ in range(n):
        secret = os.urandom(32)
        agree += split_side(secret, "a", 0.5) == split_side(secret, "b", 0.5)
    low, high = stats.binom.ppf([5e-7, 1 - 5e-7], n, 0.5)
    assert low <= agree <= high


def test_a_device_keeps_its_side_as_the_fraction_grows():
    """The point is compared with the fraction, so a larger fraction only moves devices from
    confirmation to exploration, never back."""
    for _ in range(200):
        secret = os.urandom(32)
        sides = [split_side(secret, "s", f) for f in (0.2, 0.4, 0.6, 0.8)]
        first = sides.index(ldp_pb2.EXPLORATION) if ldp_pb2.EXPLORATION in sides else 4
        assert all(s == ldp_pb2.EXPLORATION for s in sides[first:])


def test_split_secret_is_created_once_and_private(tmp_path):
    state = tmp_path / "device.sqlite"
    first = split_secret(state)
    assert len(first) == 32 and split_secret(state) == first
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert split_secret(tmp_path / "other.sqlite") != first


def test_a_reporter_keeps_one_side_across_restarts(tmp_path, server_factory):
    """Every report of a device in a split survey carries the same side, also after the device
    restarts; over devices both sides occur."""
    server = server_factory(0.5)
    transport = Transport(server.target)
    seen = set()
    for device in range(12):
        state = tmp_path / f"device{device}.sqlite"
        sides = set()
        for run in range(3):  # three runs of the app; the device answers in the first
            reporter = Reporter(transport, state, Budget(10.0))
            if run == 0:
                reporter.answer("split", "rr", "a")
            sides.add(reporter.side("split"))
            assert reporter.flush().accepted == (run == 0)
            reporter.close()
        assert len(sides) == 1
        seen |= sides
    assert seen == {ldp_pb2.EXPLORATION, ldp_pb2.CONFIRMATION}


@pytest.fixture
def server_factory(tmp_path):
    from conftest import ServerThread

    started = []

    def start(fraction: float) -> ServerThread:
        config = tmp_path / "split.toml"
        config.write_text(SPLIT_TOML.format(fraction=fraction))
        running = ServerThread(config, tmp_path / "reports.sqlite").start()
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


def test_the_fraction_on_the_wire_and_in_the_survey_file(tmp_path):
    config = tmp_path / "s.toml"
    config.write_text(SPLIT_TOML.format(fraction=0.25))
    survey = load_surveys(config)["split"]
    assert survey.split and survey.exploration_fraction == 0.25
    assert SurveySpec.from_proto(survey.to_proto()) == survey
    config.write_text(SPLIT_TOML.format(fraction=0))
    assert not load_surveys(config)["split"].split


@pytest.mark.parametrize("fraction", [1, 1.0, -0.1, 1.5, True, "0.5"])
def test_a_bad_fraction_is_refused(tmp_path, fraction):
    config = tmp_path / "s.toml"
    config.write_text(SPLIT_TOML.format(fraction=json.dumps(fraction)).replace("True", "true"))
    with pytest.raises((SurveyError, ValueError), match="exploration_fraction"):
        load_surveys(config)
