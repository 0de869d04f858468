"""The device checks itself against the wire conformance vectors (docs/wire.md §9).

A sampler, an encoding or a digest that is wrong but still yields well-formed bytes (bits in the
wrong order, a flipped sign, another label order) is accepted by the aggregator and only shows as
a biased estimate, long after the fact. This module replays every vector on the device that will
answer, with its own Python and its own build of this package, so such an error is caught before
the first real answer: ``ldp-client selftest`` or :func:`run`.

Checked: every report vector (the mechanism's ``randomize_payload``, the path a real answer
takes, fed the recorded random bytes must produce the payload and consume exactly those bytes),
every definition digest, every upload signature, every split side and every design-key digest.
The vectors ship inside the package (``protos/ldp/v1/testvectors.json``). Replaying recorded
bytes is for this check only: real answers always use the secure source.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from client import mechanisms as m
from client.mechanisms.secure_random import SecureRandom

#: The vectors this package was built with.
VECTORS_PATH = Path(__file__).resolve().parents[2] / "protos" / "ldp" / "v1" / "testvectors.json"


class ReplayRandom(SecureRandom):
    """A SecureRandom that hands out given bytes in order (conformance checks only: never for
    real answers). ``remaining`` tells whether a sampler consumed exactly the bytes given."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self._data = data
        self._offset = 0

    def bytes(self, count: int) -> bytes:
        end = self._offset + count
        if end > len(self._data):
            raise EOFError(f"the sampler wants byte {end}, the stream has {len(self._data)}")
        out = self._data[self._offset : end]
        self._offset = end
        return out

    @property
    def remaining(self) -> int:
        return len(self._data) - self._offset


def build_mechanism(mechanism: str, params: dict) -> m.Mechanism | m.PublicCoinBit:
    """The mechanism a vector's ``mechanism`` and ``params`` (survey-file names) describe."""
    k = params["k"]
    if mechanism == "randomized_response":
        return m.RandomizedResponse(k, params["epsilon"])
    if mechanism == "flip_components":
        return m.FlipComponents(k, params["epsilon"])
    if mechanism == "optimized_unary":
        return m.OptimizedUnaryEncoding(k, params["epsilon"])
    if mechanism == "hadamard_response":
        return m.HadamardResponse(k, params["epsilon"])
    if mechanism == "public_coin_bit":
        seed = int(params["public_seed"])  # a decimal string in the vectors (up to 2^64 - 1)
        return m.PublicCoinBit(k, params["epsilon"], seed, params["groups"])
    if mechanism == "local_hashing":
        return m.LocalHashing(k, params["epsilon"])
    if mechanism == "subset_selection":
        return m.SubsetSelection(k, params["epsilon"])
    if mechanism == "gaussian":
        return m.GaussianNoise(k, params["rho"], granularity_bits=params["granularity_bits"])
    if mechanism == "laplace":
        return m.LaplaceNoise(k, params["epsilon"], granularity_bits=params["granularity_bits"])
    raise ValueError(f"unknown mechanism {mechanism!r}")


@dataclass
class SelfTestResult:
    """What :func:`run` checked and every difference it found (empty: the device conforms)."""

    version: int
    checked: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def total(self) -> int:
        return sum(self.checked.values())


def run(vectors: str | Path | None = None) -> SelfTestResult:
    """Replay every conformance vector on this device; see :class:`SelfTestResult`."""
    document = json.loads(Path(vectors or VECTORS_PATH).read_text())
    result = SelfTestResult(document["version"])
    checks = (
        ("reports", _report),
        ("digests", _digest),
        ("signatures", _signature),
        ("splits", _split),
        ("design_keys", _design_key),
    )
    for kind, check in checks:
        entries = document.get(kind, [])
        result.checked[kind] = len(entries)
        for i, vector in enumerate(entries):
            try:
                problem = check(vector)
            except Exception as exc:  # a crash is a failure of that vector, not of the run
                problem = f"{type(exc).__name__}: {exc}"
            if problem:
                result.failures.append(f"{kind}[{i}]: {problem}")
    return result


def _report(vector: dict) -> str:
    mech = build_mechanism(vector["mechanism"], vector["params"])
    source = ReplayRandom(bytes.fromhex(vector["random_hex"]))
    payload = mech.randomize_payload(vector["answer"], source).hex()  # what the device sends
    label = f"{vector['mechanism']} {json.dumps(vector['params'])} answer {vector['answer']}"
    if payload != vector["payload_hex"]:
        return f"{label}: payload {payload}, expected {vector['payload_hex']}"
    if source.remaining:
        return f"{label}: {source.remaining} recorded random byte(s) left unread"
    return ""


def _digest(vector: dict) -> str:
    from google.protobuf import json_format

    from client.survey import QuestionSpec
    from protos.ldp.v1 import ldp_pb2

    message = json_format.ParseDict(vector["question"], ldp_pb2.Question())
    digest = QuestionSpec.from_proto(message).digest.hex()
    if digest != vector["digest_hex"]:
        return f"question {message.id}: digest {digest}, expected {vector['digest_hex']}"
    return ""


def _signature(vector: dict) -> str:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from client.device import signature
    from client.device.keys import DeviceKey
    from protos.ldp.v1 import ldp_pb2

    seed = bytes.fromhex(vector["private_key_hex"])
    key = DeviceKey(Ed25519PrivateKey.from_private_bytes(seed))
    if key.device_id != vector["device_id"]:
        return f"device id {key.device_id}, expected {vector['device_id']}"
    request = ldp_pb2.UploadRequest.FromString(bytes.fromhex(vector["request_hex"]))
    metadata = dict(key.sign_upload(request.reports, int(vector["timestamp"])))
    signed = metadata[signature.SIGNATURE_KEY]
    if not isinstance(signed, bytes) or signed.hex() != vector["signature_hex"]:
        return f"{vector['device_id']}: the signature differs"
    return ""


def _split(vector: dict) -> str:
    from client.device import split
    from protos.ldp.v1 import ldp_pb2

    secret = bytes.fromhex(vector["secret_hex"])
    point = split.split_point(secret, vector["survey_id"])
    side = split.split_side(secret, vector["survey_id"], vector["exploration_fraction"])
    if str(point) != vector["split_point"] or ldp_pb2.Side.Name(side) != vector["side"]:
        return f"survey {vector['survey_id']}: split point or side differs"
    return ""


def _design_key(vector: dict) -> str:
    from client.survey import design_key_digest

    digest = design_key_digest(vector["key"]).hex()
    if digest != vector["digest_hex"]:
        return f"design key {vector['key']!r}: digest {digest}, expected {vector['digest_hex']}"
    return ""
