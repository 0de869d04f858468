"""Check before the charge (issue 40 item 2): a survey with a sampling design publishes its
frame's key digests with GetSurvey, and a device refuses a design key the frame lacks before it
charges its ledger or randomizes: ``ldp-client submit`` exits 2 in one line, nothing spent or
queued. Over a real gRPC server on loopback; the digest is a fixed conformance value; a frame of
MAX_DESIGN_KEYS keys fits GetSurvey and the device's cache; the definition digests do not change."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import grpc
import pytest
from cli_runner import run_cli
from conftest import ServerThread

from aggregator.survey_file.config import load_surveys
from client.device.ledger import Budget
from client.device.reporter import Reporter
from client.device.survey_cache import SurveyCache
from client.device.transport import MAX_MESSAGE_BYTES, Transport
from client.survey import (
    MAX_DESIGN_KEYS,
    SurveyError,
    SurveySpec,
    design_key_digest,
    survey_from_json,
    survey_to_json,
)
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

SURVEYS = """
[[survey]]
id = "field"
min_batch_size = 5
group_label = "region"
group_values = ["north", "south"]
design = { table = "frame.csv" }

[[survey.question]]
id = "rr"
categories = ["a", "b", "c"]
mechanism = "randomized_response"
epsilon = 1.0
"""


def write_survey(root: Path, keys: int = 12) -> Path:
    """A survey whose frame lists keys k0000 .. in strata of 1,000 keys, PSUs of 10."""
    rows = [f"k{i:04d},s{i // 1000},p{i // 10},{1 + i % 3}" for i in range(keys)]
    (root / "frame.csv").write_text("key,stratum,psu,weight\n" + "\n".join(rows) + "\n")
    (root / "surveys.toml").write_text(SURVEYS)
    return root / "surveys.toml"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("precheck")
    running = ServerThread(write_survey(root), root / "store.sqlite").start()
    yield running
    running.stop()


def test_the_digest_of_a_key_is_a_fixed_vector():
    """docs/wire.md §3.12, spelled out byte by byte (also the first design_keys vector)."""
    encoded = b"\x00\x00\x00\x10ldp-design-key/1\x00\x00\x00\x04k000"
    assert design_key_digest("k000") == hashlib.sha256(encoded).digest()[:8]
    assert design_key_digest("k000").hex() == "fc61b56f31230631"
    assert design_key_digest("école").hex() != design_key_digest("ecole").hex()


def test_submit_with_a_key_not_in_the_frame_spends_nothing(server, tmp_path):
    state = tmp_path / "device.sqlite"
    base = ["--server", server.target, "--state", state, "--insecure"]
    answer = ["--survey", "field", "--question", "rr", "--answer", "b", "--group", "south"]
    out = run_cli("client", "submit", *base, *answer, "--budget", "5", "--design-key", "nope")
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines == [
        "ldp-client: error: survey 'field': unknown design key 'nope' (not in its sampling frame)"
    ]
    assert out.stdout == ""
    budget = json.loads(run_cli("client", "budget", "--state", state, "--json", check=True).stdout)
    assert (budget["spent_pointwise"], budget["spent_rho"], budget["charges"]) == (0.0, 0.0, 0)
    flushed = json.loads(run_cli("client", "flush", *base, "--json", check=True).stdout)
    assert (flushed["accepted"], flushed["rejected"], flushed["pending"]) == (0, 0, 0)
    good = run_cli("client", "submit", *base, *answer, "--design-key", "k0003", "--json")
    assert good.returncode == 0, good.stderr  # the refusal fixed no key and claimed no answer
    assert json.loads(good.stdout)["flush"]["accepted"] == 1
    budget = json.loads(run_cli("client", "budget", "--state", state, "--json", check=True).stdout)
    assert budget["spent_pointwise"] == 1.0 and budget["charges"] == 1


def test_the_reporter_refuses_before_the_charge(server, tmp_path):
    """A key the frame lacks, an unknown group value and a malformed key are refused before
    the ledger is charged or anything is queued, by answer and answer_index alike."""
    reporter = Reporter(Transport(server.target), tmp_path / "device.sqlite", Budget(5.0))
    try:
        with pytest.raises(SurveyError, match="unknown design key 'nope'"):
            reporter.answer("field", "rr", "a", group="north", design_key="nope")
        with pytest.raises(SurveyError, match="unknown design key 'k9999'"):
            reporter.answer_index("field", "rr", 0, group="north", design_key="k9999")
        with pytest.raises(SurveyError, match="unknown region 'east'"):
            reporter.answer("field", "rr", "a", group="east", design_key="k0001")
        with pytest.raises(SurveyError, match="1-64 printable characters"):
            reporter.answer("field", "rr", "a", group="north", design_key="k\n1")
        assert reporter.ledger.spent() == (0.0, 0.0)
        assert len(reporter.outbox) == 0 and reporter.design_keys.get("field") is None
        reporter.answer("field", "rr", "a", group="north", design_key="k0001")
        assert reporter.ledger.spent() == (1.0, 0.0)
        assert reporter.flush().accepted == 1
    finally:
        reporter.close()


def test_an_older_definition_without_digests_leaves_the_check_to_the_server(tmp_path):
    """Without published digests a device checks only the key's form (the server refuses a key
    the frame lacks, after the charge: test_design_service, refused for good)."""
    survey = load_surveys(write_survey(tmp_path))["field"]
    older = SurveySpec.from_proto(survey.to_proto())
    assert older.design is not None and not older.design.digests
    assert older.check_design_key("nope") == "nope"
    published = SurveySpec.from_proto(survey.to_proto(key_digests=True))
    with pytest.raises(SurveyError, match="unknown design key 'nope'"):
        published.check_design_key("nope")
    assert published.check_design_key("k0011") == "k0011"


def test_the_digests_are_not_part_of_any_definition_digest(tmp_path):
    survey = load_surveys(write_survey(tmp_path))["field"]
    (tmp_path / "fewer").mkdir()
    fewer = load_surveys(write_survey(tmp_path / "fewer", keys=3))["field"]
    assert survey.design is not None and fewer.design is not None
    assert survey.design.digests != fewer.design.digests
    assert survey.question("rr").digest == fewer.question("rr").digest
    assert survey == fewer  # the frame is an input of the analysis, not of the definition
    device = SurveySpec.from_proto(survey.to_proto(key_digests=True))
    assert device.question("rr").digest == survey.question("rr").digest
    assert device.design is not None and device.design.digests == survey.design.digests


@pytest.mark.parametrize(
    ("blob", "required", "message"),
    [
        (b"\x00" * 9, True, "design_key_digests must be at most 100,000 digests of 8 bytes"),
        (b"\x00" * 8 * (MAX_DESIGN_KEYS + 1), True, "got 800,008 bytes"),
        (b"\x00" * 8, False, "design_key_digests without a sampling design"),
    ],
)
def test_a_malformed_digest_list_is_refused(blob, required, message):
    proto = ldp_pb2.Survey(
        id="s",
        questions=[
            ldp_pb2.Question(
                id="q",
                mechanism=ldp_pb2.RANDOMIZED_RESPONSE,
                epsilon=1.0,
                attributes=[ldp_pb2.Attribute(name="q", categories=["a", "b"])],
            )
        ],
        min_batch_size=5,
        design_key_required=required,
        design_key_digests=blob,
    )
    with pytest.raises(SurveyError, match=message):
        SurveySpec.from_proto(proto)


def test_a_frame_of_max_design_keys_fits_get_survey_and_the_device_cache(tmp_path):
    """100,000 keys: 800,000 bytes of digests, under the 4 MiB message limit; the device checks
    against all of them from the server, from its cache and from a survey file; ListSurveys
    leaves them out."""
    config = write_survey(tmp_path, keys=MAX_DESIGN_KEYS)
    running = ServerThread(config, tmp_path / "store.sqlite").start()
    try:
        with Transport(running.target) as transport:
            served = transport.get_survey("field")
        with grpc.insecure_channel(running.target) as channel:
            collector = ldp_pb2_grpc.CollectorStub(channel)
            message = collector.GetSurvey(ldp_pb2.GetSurveyRequest(survey_id="field"), timeout=30)
            listed = collector.ListSurveys(ldp_pb2.ListSurveysRequest(), timeout=30)
    finally:
        running.stop()
    assert len(message.design_key_digests) == 8 * MAX_DESIGN_KEYS
    assert message.ByteSize() < MAX_MESSAGE_BYTES // 4
    assert [s.design_key_digests for s in listed.surveys] == [b""]
    assert served.design is not None and len(served.design.digests) == MAX_DESIGN_KEYS
    with SurveyCache(tmp_path / "device.sqlite") as cache:
        cache.put(served, "server")
        cached = cache.get("field")
    installed = survey_from_json(survey_to_json(served))
    for survey in (served, cached.survey if cached else None, installed):
        assert survey is not None
        assert survey.check_design_key("k99999") == "k99999"
        with pytest.raises(SurveyError, match="unknown design key 'k100000'"):
            survey.check_design_key("k100000")
