"""Generate the wire conformance vectors, protos/ldp/v1/testvectors.json (docs/wire.md §9).

Each report vector runs the Python client's own sampler on a recorded byte stream: the bytes come
from a deterministic stream (SHA-256 of a label and a counter, so generation is reproducible),
optionally preceded by chosen bytes that force a rare branch (a rejection, a lie, a negative
zero), and ``random_hex`` is exactly what the sampler consumed, in order. Another implementation
fed those bytes must produce ``payload_hex``. Signature vectors sign fixed uploads with fixed
Ed25519 keys (Ed25519 signatures are deterministic). Digest vectors give a question definition as
served (``question``, protobuf JSON mapping) and its definition digest (docs/wire.md §2.1);
design-key vectors a design key and its published digest (§3.12).
Every integer that may exceed 2^53 is a decimal string (JSON parsers of other languages round
larger numbers).

    python scripts/gen_test_vectors.py            # rewrite the committed file
    python scripts/gen_test_vectors.py --check    # exit 1 if the committed file is stale

tests/wire/test_wire_vectors.py runs the same comparison, so a change of a sampler, an encoding or
the signed bytes fails the build until the vectors are regenerated (and the change is deliberate).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat  # noqa: E402

from client.device import signature, split  # noqa: E402
from client.device.keys import DeviceKey  # noqa: E402
from client.device.selftest import ReplayRandom, build_mechanism  # noqa: E402, F401 (re-exported)
from client.mechanisms import (  # noqa: E402
    FlipComponents,
    GaussianNoise,
    HadamardResponse,
    LaplaceNoise,
    LocalHashing,
    Mechanism,
    OptimizedUnaryEncoding,
    PublicCoinBit,
    RandomizedResponse,
    SubsetSelection,
)
from client.mechanisms.secure_random import SecureRandom, _isqrt_fraction  # noqa: E402
from client.survey import (  # noqa: E402
    DESIGN_KEY_DIGEST_BYTES,
    DESIGN_KEY_DIGEST_FORMAT,
    Attribute,
    QuestionSpec,
    build_question,
    design_key_digest,
)
from protos.ldp.v1 import ldp_pb2  # noqa: E402

VECTORS_PATH = ROOT / "protos" / "ldp" / "v1" / "testvectors.json"
#: 2: public_seed as a decimal string; digest vectors (wire document 1.1). 3: design-key
#: vectors (wire document 1.2).
VERSION = 3


class RecordingRandom(SecureRandom):
    """A SecureRandom over ``prefix`` then SHA-256(label || counter) blocks; keeps what it gave."""

    def __init__(self, label: str, prefix: bytes = b"") -> None:
        super().__init__()
        self._label = label.encode()
        self._pending = bytearray(prefix)
        self._counter = 0
        self.consumed = bytearray()

    def bytes(self, count: int) -> bytes:
        while len(self._pending) < count:
            block = self._label + self._counter.to_bytes(8, "big")
            self._pending += hashlib.sha256(block).digest()
            self._counter += 1
        out = bytes(self._pending[:count])
        del self._pending[:count]
        self.consumed += out
        return out


def derived_constants(mech: Mechanism | PublicCoinBit) -> dict[str, str]:
    """The integers a sampler compares with or draws below (docs/wire.md §4), as decimal
    strings: implementations check their own derivation against them."""
    if isinstance(mech, RandomizedResponse):
        return {"draw_range": str(mech._draw_range), "keep_threshold": str(mech._keep_threshold)}
    if isinstance(mech, FlipComponents):
        return {"flip_threshold": str(mech._flip_threshold)}
    if isinstance(mech, OptimizedUnaryEncoding):
        return {"set_threshold": str(mech._set_threshold)}
    if isinstance(mech, HadamardResponse):
        return {"columns": str(mech.columns), "keep_threshold": str(mech._keep_threshold)}
    if isinstance(mech, PublicCoinBit):
        derived = {"keep_threshold": str(mech._keep_threshold)}
        if mech.k <= 16:  # the subsets themselves, group by group, for small questions
            subsets = (
                ",".join(str(j) for j, inside in enumerate(m) if inside) for m in mech.subset_masks
            )
            derived["subsets"] = ";".join(subsets)
        return derived
    if isinstance(mech, LocalHashing):
        return {
            "buckets": str(mech.buckets),
            "draw_range": str(mech.inner._draw_range),
            "keep_threshold": str(mech.inner._keep_threshold),
        }
    if isinstance(mech, SubsetSelection):
        return {"subset_size": str(mech.subset_size), "in_threshold": str(mech._in_threshold)}
    if isinstance(mech, GaussianNoise):
        sigma2 = mech._sigma2_grid
        return {
            "sigma2_numerator": str(sigma2.numerator),
            "sigma2_denominator": str(sigma2.denominator),
            "t": str(_isqrt_fraction(sigma2) + 1),
            "bound": str(mech.scale + mech.noise_bound),
        }
    if isinstance(mech, LaplaceNoise):
        scale = mech._scale_grid
        return {
            "scale_numerator": str(scale.numerator),
            "scale_denominator": str(scale.denominator),
            "bound": str(mech.scale + mech.noise_bound),
        }
    raise ValueError(f"no derived constants for {mech.name}")


def _one_draw(upper: int, value: int) -> bytes:
    """The bytes that make ``below(upper)`` return ``value`` at its first draw."""
    nbits = (upper - 1).bit_length()
    nbytes = (nbits + 7) // 8
    return (value << (8 * nbytes - nbits)).to_bytes(nbytes, "little")


@dataclass(frozen=True)
class Case:
    """One report vector to generate: a question, an answer, and bytes forcing a branch."""

    mechanism: str
    params: dict
    answer: int
    note: str = ""
    prefix: bytes = b""
    attributes: list[int] = field(default_factory=list)


def _report_cases() -> list[Case]:
    rr, fc, ga, la = "randomized_response", "flip_components", "gaussian", "laplace"
    cases = [
        Case(rr, {"k": 2, "epsilon": 1.0}, 0),
        Case(rr, {"k": 2, "epsilon": 1.0}, 1, "k = 2: the draw range is 2**65, never rejected"),
        Case(rr, {"k": 4, "epsilon": 1.0}, 2, "the issue's example question"),
        Case(
            rr,
            {"k": 4, "epsilon": 1.0},
            2,
            "a lie: the keep draw is the last grid value",
            prefix=_one_draw(12 * 2**64, 4 * 2**64 - 1),
        ),
        Case(
            rr,
            {"k": 5, "epsilon": 0.5},
            4,
            "rejection: an all-ones first draw exceeds the range",
            prefix=b"\xff" * 9,
        ),
        Case(
            rr,
            {"k": 6, "epsilon": 2.0},
            3,
            "two attributes 2 x 3, answer (1, 0)",
            attributes=[2, 3],
        ),
        Case(
            rr,
            {"k": 24, "epsilon": 1.5},
            17,
            "three attributes 2 x 3 x 4, answer (1, 1, 1)",
            attributes=[2, 3, 4],
        ),
        Case(rr, {"k": 1000, "epsilon": 3.0}, 999),
        Case(rr, {"k": 3, "epsilon": 1e-6}, 1, "smallest epsilon in the vectors"),
        Case(rr, {"k": 3, "epsilon": 64.0}, 0, "largest epsilon in the vectors"),
        Case(fc, {"k": 2, "epsilon": 1.0}, 1),
        Case(fc, {"k": 6, "epsilon": 2.0}, 5, "k not a multiple of 8: two zero padding bits"),
        Case(fc, {"k": 8, "epsilon": 1.0}, 7),
        Case(fc, {"k": 13, "epsilon": 4.0}, 12, "k not a multiple of 8, spans two bytes"),
        Case(
            fc,
            {"k": 12, "epsilon": 2.0},
            7,
            "two attributes 3 x 4, answer (1, 3)",
            attributes=[3, 4],
        ),
        Case(
            fc,
            {"k": 6, "epsilon": 1.0},
            0,
            "every uniform is 0: every bit flips",
            prefix=b"\0" * 48,
        ),
        Case(
            fc, {"k": 5, "epsilon": 1e-6}, 2, "smallest epsilon: the threshold is capped at 2**63"
        ),
        Case(fc, {"k": 5, "epsilon": 64.0}, 2, "largest epsilon in the vectors"),
        Case(ga, {"k": 2, "rho": 0.5, "granularity_bits": 0}, 1, "granularity 0: grid step 1"),
        Case(ga, {"k": 4, "rho": 0.5, "granularity_bits": 10}, 2, "the default granularity"),
        Case(ga, {"k": 3, "rho": 2.0, "granularity_bits": 4}, 0),
        Case(
            ga,
            {"k": 6, "rho": 1.0, "granularity_bits": 2},
            4,
            "two attributes 2 x 3",
            attributes=[2, 3],
        ),
        Case(ga, {"k": 2, "rho": 0.01, "granularity_bits": 1}, 0, "small rho"),
        Case(ga, {"k": 2, "rho": 64.0, "granularity_bits": 3}, 1, "large rho"),
        Case(
            ga,
            {"k": 3, "rho": 1.0, "granularity_bits": 0},
            1,
            "a negative zero is rejected: first geometric 0 with sign bit 1",
            prefix=bytes([0x00, 0x00, 0x80, 0x80]),
        ),
        Case(la, {"k": 2, "epsilon": 1.0, "granularity_bits": 0}, 0, "granularity 0: grid step 1"),
        Case(la, {"k": 4, "epsilon": 2.0, "granularity_bits": 10}, 1, "the default granularity"),
        Case(la, {"k": 3, "epsilon": 0.5, "granularity_bits": 3}, 2),
        Case(
            la,
            {"k": 6, "epsilon": 1.0, "granularity_bits": 1},
            5,
            "two attributes 3 x 2",
            attributes=[3, 2],
        ),
        Case(la, {"k": 2, "epsilon": 0.05, "granularity_bits": 2}, 1, "small epsilon"),
        Case(la, {"k": 2, "epsilon": 16.0, "granularity_bits": 0}, 0, "large epsilon"),
        *_large_domain_cases(),
    ]
    return cases


def _large_domain_cases() -> list[Case]:
    """Optimized unary encoding, Hadamard response and subset selection (docs/wire.md §3.5-§3.7,
    §4.8-§4.10), after every older vector so that their numbers, and bytes, stay as they were."""
    ou, hr, ss, lh = "optimized_unary", "hadamard_response", "subset_selection", "local_hashing"
    return [
        Case(ou, {"k": 2, "epsilon": 1.0}, 1),
        Case(ou, {"k": 6, "epsilon": 2.0}, 5, "k not a multiple of 8: two zero padding bits"),
        Case(ou, {"k": 13, "epsilon": 4.0}, 12, "spans two bytes"),
        Case(
            ou,
            {"k": 6, "epsilon": 1.0},
            3,
            "two attributes 2 x 3, answer (1, 0)",
            attributes=[2, 3],
        ),
        Case(
            ou, {"k": 6, "epsilon": 1.0}, 0, "every uniform is 0: every bit is 1", prefix=b"\0" * 48
        ),
        Case(
            ou, {"k": 5, "epsilon": 1e-6}, 2, "smallest epsilon: the threshold is capped at 2**63"
        ),
        Case(ou, {"k": 5, "epsilon": 64.0}, 2, "largest epsilon in the vectors"),
        Case(hr, {"k": 2, "epsilon": 1.0}, 0, "K = 4: bits(66) reads 9 bytes"),
        Case(hr, {"k": 7, "epsilon": 1.0}, 6, "K = 8"),
        Case(hr, {"k": 8, "epsilon": 2.0}, 3, "k a power of 2: K = 16"),
        Case(
            hr,
            {"k": 12, "epsilon": 1.0},
            7,
            "two attributes 3 x 4, answer (1, 3)",
            attributes=[3, 4],
        ),
        Case(hr, {"k": 1000, "epsilon": 3.0}, 999, "K = 1024"),
        Case(hr, {"k": 4, "epsilon": 1.0}, 2, "all-ones draw: outside the set", prefix=b"\xff" * 9),
        Case(
            hr,
            {"k": 4, "epsilon": 1.0},
            2,
            "all-zero draw: column 0 is in every set",
            prefix=b"\0" * 9,
        ),
        Case(hr, {"k": 3, "epsilon": 1e-6}, 1, "smallest epsilon in the vectors"),
        Case(hr, {"k": 3, "epsilon": 64.0}, 0, "largest epsilon in the vectors"),
        Case(ss, {"k": 2, "epsilon": 1.0}, 1, "d = 1, one other category"),
        Case(ss, {"k": 10, "epsilon": 1.0}, 4, "d = 3"),
        Case(ss, {"k": 13, "epsilon": 0.5}, 12, "d = 5, spans two bytes"),
        Case(
            ss,
            {"k": 6, "epsilon": 1.0},
            2,
            "two attributes 2 x 3, answer (0, 2)",
            attributes=[2, 3],
        ),
        Case(
            ss, {"k": 10, "epsilon": 1.0}, 4, "all-ones draw: outside the set", prefix=b"\xff" * 8
        ),
        Case(ss, {"k": 10, "epsilon": 1.0}, 4, "all-zero draw: in the set", prefix=b"\0" * 8),
        Case(ss, {"k": 300, "epsilon": 3.0}, 299, "d = 15"),
        Case(ss, {"k": 5, "epsilon": 1e-6}, 0, "smallest epsilon: d = 3"),
        Case(ss, {"k": 5, "epsilon": 64.0}, 2, "largest epsilon: d = 1"),
        Case(lh, {"k": 2, "epsilon": 1.0}, 1, "g = 4"),
        Case(lh, {"k": 10, "epsilon": 1.0}, 7),
        Case(lh, {"k": 1000, "epsilon": 2.0}, 999, "g = 9"),
        Case(
            lh,
            {"k": 6, "epsilon": 1.0},
            5,
            "two attributes 3 x 2, answer (2, 1)",
            attributes=[3, 2],
        ),
        Case(lh, {"k": 10, "epsilon": 1.0}, 3, "seed 0", prefix=bytes(8)),
        Case(lh, {"k": 10, "epsilon": 1.0}, 3, "seed 2^64 - 1", prefix=b"\xff" * 8),
        Case(lh, {"k": 3, "epsilon": 1e-6}, 2, "smallest epsilon: g = 3"),
        Case(lh, {"k": 3, "epsilon": 20.0}, 0, "largest epsilon: g = 485165197"),
        *_public_coin_cases(),
    ]


def _public_coin_cases() -> list[Case]:
    """Public-coin one-bit reports (docs/wire.md §3.9, §4.12)."""
    pc = "public_coin_bit"

    def params(k: int, eps: float, seed: int, groups: int) -> dict:
        return {"k": k, "epsilon": eps, "public_seed": str(seed), "groups": groups}

    return [
        Case(pc, params(2, 1.0, 0, 1), 1, "one group: below(1) reads nothing"),
        Case(pc, params(10, 1.0, 12345, 5), 7),
        Case(pc, params(1000, 2.0, 2**64 - 1, 20), 999, "largest seed"),
        Case(pc, params(6, 1.0, 7, 3), 4, "two attributes 2 x 3, answer (1, 1)", attributes=[2, 3]),
        Case(
            pc,
            params(10, 1.0, 12345, 5),
            7,
            "all-ones keep draw: the bit is flipped",
            prefix=b"\x00" + b"\xff" * 8,
        ),
        Case(pc, params(9, 1e-6, 1, 4), 0, "smallest epsilon"),
        Case(pc, params(9, 64.0, 1, 4), 8, "largest epsilon"),
    ]


def _parts(index: int, sizes: list[int]) -> list[int]:
    """Per-attribute category indices of a joint (row-major) index."""
    parts = []
    for size in reversed(sizes):
        index, part = divmod(index, size)
        parts.append(part)
    return parts[::-1]


def report_vector(case: Case, number: int) -> dict:
    mech = build_mechanism(case.mechanism, case.params)
    source = RecordingRandom(f"ldp-survey test vector {number}", case.prefix)
    payload = mech.encode(mech.randomize(case.answer, source))
    vector: dict = {"mechanism": case.mechanism, "params": case.params}
    if case.attributes:
        vector["attributes"] = case.attributes
        vector["answer_parts"] = _parts(case.answer, case.attributes)
    vector |= {
        "answer": case.answer,
        "random_hex": source.consumed.hex(),
        "payload_hex": payload.hex(),
        "derived": derived_constants(mech),
    }
    if case.note:
        vector["note"] = case.note
    return vector


_UPLOADS = [
    (1767225600, [("wellbeing-2026", "mood", bytes(range(16)), bytes([2, 0, 0, 0]))]),
    (
        1767225601,
        [
            ("wellbeing-2026", "mood", bytes(range(16, 32)), bytes([3, 0, 0, 0])),
            ("wellbeing-2026", "transport", bytes(range(32, 48)), bytes([0b00100101])),
            ("other-survey", "q.1", b"\xff" * 16, bytes([1, 0, 0, 0])),
        ],
    ),
]


def signature_vector(number: int, timestamp: int, reports: list[tuple]) -> dict:
    seed = hashlib.sha256(f"ldp-survey test vector key {number}".encode()).digest()
    private_key = Ed25519PrivateKey.from_private_bytes(seed)
    key = DeviceKey(private_key)
    request = ldp_pb2.UploadRequest(
        reports=[
            ldp_pb2.Report(report_id=rid, survey_id=sid, question_id=qid, payload=payload)
            for sid, qid, rid, payload in reports
        ]
    )
    signed = signature.canonical_upload(key.device_id, timestamp, request.reports)
    metadata = dict(key.sign_upload(request.reports, timestamp))
    return {
        "private_key_hex": seed.hex(),
        "public_key_hex": private_key.public_key()
        .public_bytes(Encoding.Raw, PublicFormat.Raw)
        .hex(),
        "device_id": key.device_id,
        "timestamp": str(timestamp),
        "request_hex": request.SerializeToString(deterministic=True).hex(),
        "signed_bytes_hex": signed.hex(),
        "signature_hex": metadata[signature.SIGNATURE_KEY].hex(),
    }


#: (secret label, survey id, exploration fraction) of the split vectors (docs/wire.md §3.10).
_SPLITS = [
    ("device-a", "wellbeing-2026", 0.5),
    ("device-b", "wellbeing-2026", 0.5),
    ("device-c", "wellbeing-2026", 0.5),
    ("device-a", "census.2027", 0.3),
    ("device-d", "census.2027", 0.9),
    ("device-e", "s", 0.01),
    ("device-e", "s", 0.0),
]


def split_vector(label: str, survey_id: str, fraction: float) -> dict:
    """One device secret, survey and fraction, with the split point and the side it gives."""
    secret = hashlib.sha256(f"ldp-survey test vector split secret {label}".encode()).digest()
    return {
        "secret_hex": secret.hex(),
        "survey_id": survey_id,
        "exploration_fraction": fraction,
        "split_point": str(split.split_point(secret, survey_id)),
        "side": ldp_pb2.Side.Name(split.split_side(secret, survey_id, fraction)),
    }


def _attributes(*spec: tuple[str, list[str]]) -> tuple[Attribute, ...]:
    return tuple(Attribute(name, tuple(labels)) for name, labels in spec)


#: (question id, mechanism, parameter, granularity bits, attributes, extra keyword arguments) of
#: the digest vectors: every mechanism, multi-attribute questions, a household-shared question,
#: UTF-8 labels, granularity 0 and the largest public seed.
_DIGESTS = [
    ("q", "randomized_response", 1.5, 10, _attributes(("q", ["1", "2", "3"])), {}),
    (
        "mood",
        "randomized_response",
        1.0,
        10,
        _attributes(("mood", ["great", "fine", "low", "bad"])),
        {},
    ),
    (
        "transport",
        "flip_components",
        2.0,
        10,
        _attributes(("transport", ["walk", "bike", "bus", "car", "home", "train"])),
        {},
    ),
    ("sleep", "gaussian", 0.5, 10, _attributes(("sleep", ["<5", "5-6", "7-8", ">8"])), {}),
    ("stress", "laplace", 1.0, 0, _attributes(("stress", ["none", "some", "a lot"])), {}),
    ("site", "optimized_unary", 0.1, 10, _attributes(("site", [f"s{i}" for i in range(10)])), {}),
    ("item", "hadamard_response", 2.0, 10, _attributes(("item", ["a", "b", "c", "d", "e"])), {}),
    (
        "word",
        "subset_selection",
        1.0,
        10,
        _attributes(("word", ["café", "naïve", "Straße", "日本"])),
        {},
    ),
    ("url", "local_hashing", 3.0, 10, _attributes(("url", [f"u{i}" for i in range(20)])), {}),
    (
        "pc",
        "public_coin_bit",
        1.0,
        10,
        _attributes(("pc", [f"c{i}" for i in range(12)])),
        {"public_seed": 2**64 - 1, "groups": 4},
    ),
    (
        "smoking_by_exercise",
        "randomized_response",
        1.0,
        10,
        _attributes(("smoking", ["yes", "no"]), ("exercise", ["never", "sometimes", "often"])),
        {},
    ),
    (
        "table3",
        "flip_components",
        1.0,
        10,
        _attributes(("a", ["x", "y"]), ("b", ["1", "2", "3"]), ("c", ["lo", "hi"])),
        {},
    ),
    (
        "income",
        "randomized_response",
        2.0,
        10,
        _attributes(("income", ["low", "middle", "high"])),
        {"household_shared": True},
    ),
]


def served_question(question: QuestionSpec) -> dict:
    """The question as GetSurvey serves it, in the protobuf JSON mapping (field names as in the
    .proto, enum names, uint64 as a decimal string); the fields the digest reads, and only those
    (``text`` is not part of the definition)."""
    message = question.to_proto()
    out: dict = {
        "id": message.id,
        "attributes": [
            {"name": a.name, "categories": list(a.categories)} for a in message.attributes
        ],
        "mechanism": ldp_pb2.Mechanism.Name(message.mechanism),
    }
    if message.mechanism == ldp_pb2.GAUSSIAN:
        out["rho"] = message.rho
    else:
        out["epsilon"] = message.epsilon
    if message.mechanism in (ldp_pb2.GAUSSIAN, ldp_pb2.LAPLACE):
        out["granularity_bits"] = message.granularity_bits
    if message.mechanism == ldp_pb2.PUBLIC_COIN_BIT:
        out["public_seed"] = str(message.public_seed)
        out["groups"] = message.groups
    if message.household_shared:
        out["household_shared"] = True
    return out


def digest_fields(question: QuestionSpec) -> list[str]:
    """The digest's fields in order (docs/wire.md §2.1), for a device to compare step by step."""
    mech = question.mechanism
    value = mech.rho if isinstance(mech, GaussianNoise) else mech.parameter
    additive = isinstance(mech, GaussianNoise | LaplaceNoise)
    fields = [
        "ldp-question-definition/1",
        question.id,
        mech.name,
        struct.pack(">d", float(value)).hex(),  # binary64, big-endian
        str(mech.granularity_bits) if additive else "",
        str(len(question.attributes)),
    ]
    for attribute in question.attributes:
        fields += [attribute.name, str(len(attribute.categories)), *attribute.categories]
    if isinstance(mech, PublicCoinBit):
        fields += [f"public_seed={mech.public_seed}", f"groups={mech.groups}"]
    if question.household_shared:
        fields.append("household_shared")
    return fields


def digest_vector(
    question_id: str, mechanism: str, parameter: float, bits: int, attributes, extra: dict
) -> dict:
    question = build_question(question_id, "", attributes, mechanism, parameter, bits, **extra)
    fields = digest_fields(question)
    encoded = b"".join(len(f.encode()).to_bytes(4, "big") + f.encode() for f in fields)
    assert hashlib.sha256(encoded).digest() == question.digest, "the generator disagrees"
    return {
        "question": served_question(question),
        "fields": fields,
        "encoded_hex": encoded.hex(),
        "digest_hex": question.digest.hex(),
    }


#: The design-key vectors (docs/wire.md §3.12): a plain key, spaces and punctuation, UTF-8, one
#: character and the longest key (64 characters).
_DESIGN_KEYS = ["k000", "stratum 3 / PSU 17 / w2", "école-Ωmega-日本", "x", "K" * 64]


def design_key_vector(key: str) -> dict:
    """One design key, the strings its digest encodes and the digest a survey publishes."""
    fields = [DESIGN_KEY_DIGEST_FORMAT, key]
    encoded = b"".join(len(f.encode()).to_bytes(4, "big") + f.encode() for f in fields)
    digest = hashlib.sha256(encoded).digest()[:DESIGN_KEY_DIGEST_BYTES]
    assert digest == design_key_digest(key), "the generator disagrees"
    return {"key": key, "fields": fields, "encoded_hex": encoded.hex(), "digest_hex": digest.hex()}


def build_vectors() -> dict:
    """The whole vectors document."""
    return {
        "version": VERSION,
        "spec": "docs/wire.md",
        "reports": [report_vector(case, i) for i, case in enumerate(_report_cases())],
        "signatures": [
            signature_vector(i, timestamp, reports)
            for i, (timestamp, reports) in enumerate(_UPLOADS)
        ],
        "splits": [split_vector(*case) for case in _SPLITS],
        "digests": [digest_vector(*case) for case in _DIGESTS],
        "design_keys": [design_key_vector(key) for key in _DESIGN_KEYS],
    }


def render(vectors: dict) -> str:
    return json.dumps(vectors, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with the committed file")
    args = parser.parse_args(argv)
    text = render(build_vectors())
    if args.check:
        if VECTORS_PATH.read_text() != text:
            print(f"{VECTORS_PATH} is stale: run scripts/gen_test_vectors.py", file=sys.stderr)
            return 1
        return 0
    VECTORS_PATH.write_text(text)
    print(f"wrote {VECTORS_PATH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
