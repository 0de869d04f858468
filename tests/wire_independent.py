"""A second implementation of the device side, written from docs/wire.md alone (standard library
and an Ed25519 signer; nothing from client/ or protos/): if the document left anything out, this
would disagree with the vectors. It writes the JSON lines scripts/check_vectors.py reads.

    python tests/wire_independent.py > outputs.jsonl
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from decimal import MAX_EMAX, MIN_EMIN, ROUND_CEILING, ROUND_FLOOR, Decimal, localcontext
from fractions import Fraction
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

VECTORS = Path(__file__).resolve().parents[1] / "protos" / "ldp" / "v1" / "testvectors.json"


class Stream:
    """§4.1: the random byte stream and the primitives over it."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise EOFError("stream exhausted")
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def bits(self, m: int) -> int:
        nb = (m + 7) // 8
        return int.from_bytes(self.take(nb), "little") >> (8 * nb - m)

    def below(self, u: int) -> int:
        if u == 1:
            return 0
        m = (u - 1).bit_length()
        while (v := self.bits(m)) >= u:
            pass
        return v

    def unit(self, num: int, den: int) -> bool:
        i = 1
        while self.below(den * i) < num:
            i += 1
        return i % 2 == 1

    def bern_exp(self, num: int, den: int) -> bool:
        while num > den:
            if not self.unit(1, 1):
                return False
            num -= den
        return self.unit(num, den)

    def geometric(self, t: int, s: int) -> int:
        while True:
            u = self.below(t)
            if self.bern_exp(u, t):
                break
        v = 0
        while self.bern_exp(1, 1):
            v += 1
        return (u + t * v) // s


def _decimal(fn):
    with localcontext() as ctx:
        ctx.prec, ctx.Emax, ctx.Emin = 80, MAX_EMAX, MIN_EMIN
        return fn()


def randomized_response(k: int, eps: float, x: int, r: Stream) -> bytes:
    """§4.2 and §3.2."""
    big = k * 2**64
    threshold = _decimal(
        lambda: int((big / (1 + (k - 1) * (-Decimal(eps)).exp())).to_integral_value(ROUND_FLOOR))
    )
    threshold = max(threshold - 1, 2**64)
    other, keep = divmod(r.below((k - 1) * big), big)
    index = x if keep < threshold else other + (1 if other >= x else 0)
    return struct.pack("<I", index)


def flip_components(k: int, eps: float, x: int, r: Stream) -> bytes:
    """§4.3 and §3.3."""
    threshold = _decimal(
        lambda: int((2**64 / ((Decimal(eps) / 2).exp() + 1)).to_integral_value(ROUND_CEILING))
    )
    threshold = min(threshold + 1, 2**63)
    block = r.take(8 * k)
    bits = [int(int.from_bytes(block[8 * j : 8 * j + 8], "little") < threshold) for j in range(k)]
    bits[x] ^= 1
    out = bytearray((k + 7) // 8)
    for j, bit in enumerate(bits):
        out[j // 8] |= bit << (j % 8)
    return bytes(out)


def optimized_unary(k: int, eps: float, x: int, r: Stream) -> bytes:
    """§4.8 and §3.5."""
    threshold = _decimal(
        lambda: int((2**64 / (Decimal(eps).exp() + 1)).to_integral_value(ROUND_CEILING))
    )
    threshold = min(threshold + 1, 2**63)
    block = r.take(8 * k)
    uniforms = [int.from_bytes(block[8 * j : 8 * j + 8], "little") for j in range(k)]
    bits = [int(u < (2**63 if j == x else threshold)) for j, u in enumerate(uniforms)]
    out = bytearray((k + 7) // 8)
    for j, bit in enumerate(bits):
        out[j // 8] |= bit << (j % 8)
    return bytes(out)


def hadamard_response(k: int, eps: float, x: int, r: Stream) -> bytes:
    """§4.9 and §3.6."""
    m = k.bit_length()  # K = 2^m, the smallest power of 2 above k
    threshold = _decimal(
        lambda: int((2**64 / (1 + (-Decimal(eps)).exp())).to_integral_value(ROUND_FLOOR))
    )
    threshold = max(threshold - 1, 2**63)
    row = x + 1
    d = r.bits(64 + m)
    column, u = d >> 64, d % 2**64
    want = 0 if u < threshold else 1
    if bin(row & column).count("1") % 2 != want:
        column ^= row & -row
    return struct.pack("<I", column)


def subset_selection(k: int, eps: float, x: int, r: Stream) -> bytes:
    """§4.10 and §3.7."""
    d = _decimal(lambda: int((k / (Decimal(eps).exp() + 1)).to_integral_value(ROUND_CEILING)))
    d = min(max(d, 1), k - 1)
    threshold = _decimal(
        lambda: int(
            (2**64 * d / (d + (k - d) * (-Decimal(eps)).exp())).to_integral_value(ROUND_FLOOR)
        )
    )
    inside = r.bits(64) < max(threshold - 1, 0)
    positions = list(range(k - 1))
    chosen = []
    for i in range(d):
        j = i + r.below(k - 1 - i)
        positions[i], positions[j] = positions[j], positions[i]
        chosen.append(positions[i] + (1 if positions[i] >= x else 0))
    if inside:
        chosen[-1] = x
    out = bytearray((k + 7) // 8)
    for j in chosen:
        out[j // 8] |= 1 << (j % 8)
    return bytes(out)


def local_hashing(k: int, eps: float, x: int, r: Stream) -> bytes:
    """§4.11 and §3.8."""
    prime = 2**31 - 1
    g = _decimal(lambda: int(Decimal(eps).exp().to_integral_value(ROUND_CEILING))) + 1
    seed = int.from_bytes(r.take(8), "little")
    digest = hashlib.sha256(b"ldp-survey/olh/v1" + seed.to_bytes(8, "little")).digest()
    c2, c1, c0 = (int.from_bytes(digest[8 * i : 8 * i + 8], "little") % prime for i in range(3))
    hashed = ((c2 * (x * x % prime) + c1 * x + c0) % prime) % g
    value = struct.unpack("<I", randomized_response(g, eps, hashed, r))[0]
    return struct.pack("<QI", seed, value)


def public_coin_bit(k: int, eps: float, seed: int, groups: int, x: int, r: Stream) -> bytes:
    """§4.12 and §3.9."""
    group = r.below(groups)
    threshold = _decimal(
        lambda: int((2**64 / (1 + (-Decimal(eps)).exp())).to_integral_value(ROUND_FLOOR))
    )
    keep = r.bits(64) < max(threshold - 1, 2**63)
    keys = []
    for j in range(k):
        data = b"ldp-survey/raptor/v1" + struct.pack("<QII", seed, group, j)
        keys.append((int.from_bytes(hashlib.sha256(data).digest()[:8], "little"), j))
    inside = x in {j for _, j in sorted(keys)[: k // 2]}
    bit = int(inside) if keep else 1 - int(inside)
    return struct.pack("<I", 2 * group + bit)


def additive(mechanism: str, k: int, parameter: float, bits: int, x: int, r: Stream) -> bytes:
    """§4.4-§4.7 and §3.4."""
    g = 2**bits
    values = []
    for _ in range(k):
        if mechanism == "laplace":
            scale = Fraction(2 * g) / Fraction(parameter)
            t, s = scale.numerator, scale.denominator
            values.append(r.geometric(t, s) - r.geometric(t, s))
            continue
        sigma2 = Fraction(g * g) / Fraction(parameter)
        a, b = sigma2.numerator, sigma2.denominator
        t = math.isqrt(a // b) + 1  # the largest r with r*r*b <= a, plus 1
        while True:
            y = r.geometric(t, 1)
            negative = r.bits(1) == 1
            if negative and y == 0:
                continue
            if r.bern_exp((y * b * t - a) ** 2, 2 * a * b * t * t):
                values.append(-y if negative else y)
                break
    values[x] += g
    return b"".join(struct.pack("<q", v) for v in values)


def report(vector: dict) -> tuple[bytes, int]:
    r = Stream(bytes.fromhex(vector["random_hex"]))
    p, x, mechanism = vector["params"], vector["answer"], vector["mechanism"]
    if "answer_parts" in vector:  # §3.1
        index = 0
        for part, size in zip(vector["answer_parts"], vector["attributes"], strict=True):
            index = index * size + part
        assert index == x
    if mechanism == "randomized_response":
        payload = randomized_response(p["k"], p["epsilon"], x, r)
    elif mechanism == "flip_components":
        payload = flip_components(p["k"], p["epsilon"], x, r)
    elif mechanism == "optimized_unary":
        payload = optimized_unary(p["k"], p["epsilon"], x, r)
    elif mechanism == "hadamard_response":
        payload = hadamard_response(p["k"], p["epsilon"], x, r)
    elif mechanism == "public_coin_bit":
        seed = int(p["public_seed"])  # a decimal string (§9: integers above 2^53 are strings)
        payload = public_coin_bit(p["k"], p["epsilon"], seed, p["groups"], x, r)
    elif mechanism == "local_hashing":
        payload = local_hashing(p["k"], p["epsilon"], x, r)
    elif mechanism == "subset_selection":
        payload = subset_selection(p["k"], p["epsilon"], x, r)
    else:
        parameter = p["rho"] if mechanism == "gaussian" else p["epsilon"]
        payload = additive(mechanism, p["k"], parameter, p["granularity_bits"], x, r)
    return payload, r.pos


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if byte < 0x80:
            return value, pos


def _fields(data: bytes) -> list[tuple[int, bytes]]:
    """The length-delimited fields of a protobuf message (all the request uses)."""
    out, pos = [], 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        length, pos = _varint(data, pos)
        out.append((key >> 3, data[pos : pos + length]))
        pos += length
    return out


def signature(vector: dict) -> dict:
    """§7, parsing the UploadRequest by hand (field 1: reports; Report fields 1-4)."""
    key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(vector["private_key_hex"]))
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    device_id = "dev-" + hashlib.sha256(raw).hexdigest()[:24]

    def field(value: bytes) -> bytes:
        return struct.pack(">I", len(value)) + value

    signed = b"ldp-survey/upload-signature/v1\x00" + field(device_id.encode())
    signed += struct.pack(">Q", int(vector["timestamp"]))
    for number, message in _fields(bytes.fromhex(vector["request_hex"])):
        assert number == 1
        parts = {n: v for n, v in _fields(message)}
        for n in (2, 3, 1, 4):  # survey_id, question_id, report_id, payload
            signed += field(parts.get(n, b""))
    return {
        "device_id": device_id,
        "signed_bytes_hex": signed.hex(),
        "signature_hex": key.sign(signed).hex(),
    }


#: §2.2: the Mechanism enum's names and the names the digest (and survey files) use.
SURVEY_NAMES = {
    "RANDOMIZED_RESPONSE": "randomized_response",
    "FLIP_COMPONENTS": "flip_components",
    "GAUSSIAN": "gaussian",
    "LAPLACE": "laplace",
    "OPTIMIZED_UNARY": "optimized_unary",
    "HADAMARD_RESPONSE": "hadamard_response",
    "SUBSET_SELECTION": "subset_selection",
    "LOCAL_HASHING": "local_hashing",
    "PUBLIC_COIN_BIT": "public_coin_bit",
}


def digest(question: dict) -> str:
    """§2.1, from the question as served (protobuf JSON mapping)."""
    name = SURVEY_NAMES[question["mechanism"]]
    value = question["rho"] if name == "gaussian" else question["epsilon"]
    additive = name in ("gaussian", "laplace")
    fields = [
        "ldp-question-definition/1",
        question["id"],
        name,
        struct.pack(">d", value).hex(),
        str(question.get("granularity_bits", 0)) if additive else "",
        str(len(question["attributes"])),
    ]
    for attribute in question["attributes"]:
        labels = attribute["categories"]
        fields += [attribute["name"], str(len(labels)), *labels]
    if name == "public_coin_bit":
        fields += [f"public_seed={int(question['public_seed'])}", f"groups={question['groups']}"]
    if question.get("household_shared"):
        fields.append("household_shared")
    encoded = b"".join(struct.pack(">I", len(f.encode())) + f.encode() for f in fields)
    return hashlib.sha256(encoded).hexdigest()


def design_key(key: str) -> str:
    """§3.12: the first 8 bytes of SHA-256 over the length-prefixed format string and key."""
    fields = ["ldp-design-key/1", key]
    encoded = b"".join(struct.pack(">I", len(f.encode())) + f.encode() for f in fields)
    return hashlib.sha256(encoded).hexdigest()[:16]


def main() -> None:
    vectors = json.loads(VECTORS.read_text())
    for i, vector in enumerate(vectors["reports"]):
        payload, consumed = report(vector)
        print(json.dumps({"index": i, "payload_hex": payload.hex(), "consumed": consumed}))
    for i, vector in enumerate(vectors["signatures"]):
        print(json.dumps({"signature": i, **signature(vector)}))
    for i, vector in enumerate(vectors["digests"]):
        print(json.dumps({"digest": i, "digest_hex": digest(vector["question"])}))
    for i, vector in enumerate(vectors["design_keys"]):
        print(json.dumps({"design_key": i, "digest_hex": design_key(vector["key"])}))


if __name__ == "__main__":
    main()
