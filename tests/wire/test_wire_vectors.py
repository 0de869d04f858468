"""The conformance vectors (protos/ldp/v1/testvectors.json, docs/wire.md §9): the Python client
reproduces every one byte for byte, the aggregator accepts them, and the committed file is exactly
what scripts/gen_test_vectors.py generates (a changed sampler, encoding or signed byte string
fails here until the vectors are deliberately regenerated)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from aggregator.service.collector.device_auth import DeviceAuthenticator
from aggregator.store import ingest
from client.device import signature
from client.device.keys import DeviceKey, device_id_for
from client.survey import Attribute, QuestionSpec, SurveySpec, build_question
from protos.ldp.v1 import ldp_pb2

ROOT = Path(__file__).resolve().parents[2]
VECTORS = json.loads((ROOT / "protos" / "ldp" / "v1" / "testvectors.json").read_text())


def _load_generator():
    spec = importlib.util.spec_from_file_location(
        "gen_test_vectors", ROOT / "scripts" / "gen_test_vectors.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


def _label(vector: dict) -> str:
    return f"{vector['mechanism']}-{vector['params']}-{vector['answer']}"


def test_committed_vectors_equal_a_fresh_generation():
    committed = (ROOT / "protos" / "ldp" / "v1" / "testvectors.json").read_text()
    assert gen.render(gen.build_vectors()) == committed, (
        "testvectors.json drifted from the client: run scripts/gen_test_vectors.py"
    )


def test_vectors_have_the_documented_format():
    assert VECTORS["version"] == 3
    mechanisms = {v["mechanism"] for v in VECTORS["reports"]}
    assert mechanisms == {
        "randomized_response",
        "flip_components",
        "gaussian",
        "laplace",
        "optimized_unary",
        "hadamard_response",
        "subset_selection",
        "local_hashing",
        "public_coin_bit",
    }
    for vector in VECTORS["reports"]:
        assert {"mechanism", "params", "answer", "random_hex", "payload_hex"} <= set(vector)
        bytes.fromhex(vector["random_hex"]), bytes.fromhex(vector["payload_hex"])
    for mechanism in mechanisms:
        of_kind = [v for v in VECTORS["reports"] if v["mechanism"] == mechanism]
        assert len({json.dumps(v["params"], sort_keys=True) for v in of_kind}) >= 4
        assert any("attributes" in v for v in of_kind), f"{mechanism}: no multi-attribute case"
    assert any(
        v["params"]["k"] % 8 for v in VECTORS["reports"] if v["mechanism"] == "flip_components"
    )
    for additive in ("gaussian", "laplace"):
        bits = {
            v["params"]["granularity_bits"]
            for v in VECTORS["reports"]
            if v["mechanism"] == additive
        }
        assert 0 in bits and len(bits) >= 3
    digested = {v["question"]["mechanism"] for v in VECTORS["digests"]}
    assert digested == {ldp_pb2.Mechanism.Name(m) for m in ldp_pb2.Mechanism.values() if m}
    assert any(len(v["question"]["attributes"]) >= 2 for v in VECTORS["digests"])
    assert any(v["question"].get("household_shared") for v in VECTORS["digests"])
    for vector in VECTORS["signatures"]:
        assert set(vector) >= {
            "private_key_hex",
            "device_id",
            "timestamp",
            "request_hex",
            "signed_bytes_hex",
            "signature_hex",
        }


@pytest.mark.parametrize("vector", VECTORS["reports"], ids=_label)
def test_client_reproduces_each_report_from_its_bytes(vector):
    mech = gen.build_mechanism(vector["mechanism"], vector["params"])
    source = gen.ReplayRandom(bytes.fromhex(vector["random_hex"]))
    payload = mech.encode(mech.randomize(vector["answer"], source))
    assert payload.hex() == vector["payload_hex"]
    assert source.remaining == 0, "the sampler consumed fewer bytes than recorded"
    assert len(payload) == mech.payload_size


def test_one_byte_less_is_detected():
    """A stream cut short cannot silently yield a report (the replay is strict)."""
    vector = VECTORS["reports"][0]
    mech = gen.build_mechanism(vector["mechanism"], vector["params"])
    source = gen.ReplayRandom(bytes.fromhex(vector["random_hex"])[:-1])
    with pytest.raises(EOFError):
        mech.randomize(vector["answer"], source)


@pytest.mark.parametrize("vector", VECTORS["reports"], ids=_label)
def test_aggregator_accepts_each_payload(vector):
    """The payload is valid for the question the vector describes, with the joint index of its
    per-attribute answer in row-major order."""
    params = vector["params"]
    coin = {
        key: int(params[key])  # public_seed is a decimal string
        for key in ("public_seed", "groups")
        if vector["mechanism"] == "public_coin_bit"
    }
    sizes = vector.get("attributes", [params["k"]])
    attributes = [
        Attribute(f"a{i}", tuple(f"c{j}" for j in range(size))) for i, size in enumerate(sizes)
    ]
    parameter = params["rho"] if vector["mechanism"] == "gaussian" else params["epsilon"]
    question = build_question(
        "q",
        "",
        attributes,
        vector["mechanism"],
        parameter,
        params.get("granularity_bits", 10),
        **coin,
    )
    assert question.k == params["k"]
    if "answer_parts" in vector:
        labels = [f"c{part}" for part in vector["answer_parts"]]  # answers are labels
        assert question.index(labels) == vector["answer"]
    survey = SurveySpec("s", "", (question,), 1)
    report = ldp_pb2.Report(
        report_id=bytes(16),
        survey_id="s",
        question_id="q",
        payload=bytes.fromhex(vector["payload_hex"]),
    )
    stored = ingest.validate(report, {"s": survey})
    assert stored.contribution.shape == (question.statistic_size,)


def _integers_above_2_53(value, path="") -> list[str]:
    """Where the document holds a JSON number a parser with binary64 numbers would round."""
    if isinstance(value, dict):
        return [
            p for key, item in value.items() for p in _integers_above_2_53(item, f"{path}.{key}")
        ]
    if isinstance(value, list):
        return [
            p for i, item in enumerate(value) for p in _integers_above_2_53(item, f"{path}[{i}]")
        ]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
        return [path]
    return []


def test_every_large_integer_is_a_string():
    """JavaScript's JSON.parse rounds integers above 2^53 (an independent device found
    public_seed = 2^64 - 1 read as another seed): such integers are decimal strings (§9)."""
    assert _integers_above_2_53(VECTORS) == []
    assert any(
        v["params"]["public_seed"] == str(2**64 - 1)
        for v in VECTORS["reports"]
        if v["mechanism"] == "public_coin_bit"
    )


@pytest.mark.parametrize("vector", VECTORS["digests"], ids=lambda v: v["question"]["id"])
def test_client_reproduces_each_digest(vector):
    """The question as served (protobuf JSON mapping) gives the vector's digest, and its fields
    encode as the vector says (docs/wire.md §2.1)."""
    from google.protobuf import json_format

    message = json_format.ParseDict(vector["question"], ldp_pb2.Question())
    question = QuestionSpec.from_proto(message)
    assert question.digest.hex() == vector["digest_hex"]
    encoded = bytes.fromhex(vector["encoded_hex"])
    fields, pos = [], 0
    while pos < len(encoded):
        size = int.from_bytes(encoded[pos : pos + 4], "big")
        fields.append(encoded[pos + 4 : pos + 4 + size].decode())
        pos += 4 + size
    assert fields == vector["fields"]


@pytest.mark.parametrize("vector", VECTORS["signatures"], ids=lambda v: v["device_id"])
def test_client_reproduces_each_signature(vector):
    private_key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(vector["private_key_hex"]))
    assert device_id_for(private_key.public_key()) == vector["device_id"]
    request = ldp_pb2.UploadRequest.FromString(bytes.fromhex(vector["request_hex"]))
    timestamp = int(vector["timestamp"])
    signed = signature.canonical_upload(vector["device_id"], timestamp, request.reports)
    assert signed.hex() == vector["signed_bytes_hex"]
    metadata = DeviceKey(private_key).sign_upload(request.reports, timestamp)
    assert dict(metadata) == {
        signature.DEVICE_ID_KEY: vector["device_id"],
        signature.TIMESTAMP_KEY: vector["timestamp"],
        signature.SIGNATURE_KEY: bytes.fromhex(vector["signature_hex"]),
    }


@pytest.mark.parametrize("vector", VECTORS["signatures"], ids=lambda v: v["device_id"])
def test_aggregator_verifies_each_signature(vector):
    private_key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(vector["private_key_hex"]))
    auth = DeviceAuthenticator(
        {}, {vector["device_id"]: private_key.public_key()}, clock=lambda: int(vector["timestamp"])
    )
    request = ldp_pb2.UploadRequest.FromString(bytes.fromhex(vector["request_hex"]))
    metadata = [
        (signature.DEVICE_ID_KEY, vector["device_id"]),
        (signature.TIMESTAMP_KEY, vector["timestamp"]),
        (signature.SIGNATURE_KEY, bytes.fromhex(vector["signature_hex"])),
    ]
    call = auth.open_upload(metadata, request.reports)
    assert call is not None and call.verify() == vector["device_id"]
