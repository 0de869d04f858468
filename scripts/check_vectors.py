"""Check a device implementation against the wire conformance vectors (docs/wire.md §9).

A device in any language runs its own sampler, encoder and signer on the vectors of
protos/ldp/v1/testvectors.json and writes what it produced as JSON lines, one object per vector:

    {"index": 0, "payload_hex": "01000000", "consumed": 9}
    {"signature": 0, "device_id": "dev-…", "signed_bytes_hex": "…", "signature_hex": "…"}
    {"digest": 0, "digest_hex": "…"}
    {"design_key": 0, "digest_hex": "…"}

``index`` is the position in ``reports``, ``consumed`` the number of random bytes its sampler
read; ``signature`` is the position in ``signatures``; ``digest`` the position in ``digests``
(vectors version 2); ``design_key`` the position in ``design_keys`` (vectors version 3). This
script compares them with the vectors and prints one line per difference (exit 0: all match; 1:
differences; 2: unusable input).

    python scripts/check_vectors.py device-outputs.jsonl
    python scripts/check_vectors.py --explain          # how to produce the outputs
    python scripts/check_vectors.py --emit-python      # the Python client's outputs (reference)

Checking needs only the standard library; ``--emit-python`` needs this repository's client.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VECTORS_PATH = ROOT / "protos" / "ldp" / "v1" / "testvectors.json"

EXPLAIN = """\
How a device implementation checks itself (docs/wire.md §9):

For report vector i (the list "reports"):
  1. Build the question's mechanism from "mechanism" and "params" (k, epsilon, rho,
     granularity_bits), exactly as from a survey (docs/wire.md §2). Optionally compare your
     derived integers (thresholds, rational parameters, bound) with "derived".
  2. Replace your secure random source with one that returns the bytes of "random_hex" in order
     and fails if asked for more.
  3. Randomize "answer" (the joint index; "answer_parts" gives the per-attribute indices of a
     multi-attribute question: check your joint index too) and encode the report.
  4. Write {"index": i, "payload_hex": <hex of the payload>, "consumed": <bytes read>}.

For signature vector i (the list "signatures"):
  1. Load the Ed25519 private key from the 32-byte seed "private_key_hex"; derive the device id.
  2. Parse "request_hex" as an ldp.v1.UploadRequest and build the signed bytes for it with the
     device id and "timestamp" (docs/wire.md §7); sign them.
  3. Write {"signature": i, "device_id": ..., "signed_bytes_hex": ..., "signature_hex": ...}.

For digest vector i (the list "digests"):
  1. Read "question" as the Question GetSurvey would serve (protobuf JSON mapping: "mechanism" is
     the enum name, "public_seed" a decimal string) into your survey model.
  2. Compute its definition digest (docs/wire.md §2.1); "fields" lists the strings it encodes, in
     order, and "encoded_hex" their encoding, for finding where you differ.
  3. Write {"digest": i, "digest_hex": <hex of the 32-byte digest>}.

For design-key vector i (the list "design_keys"):
  1. Compute the digest of "key" as a survey publishes it (docs/wire.md §3.12); "fields" lists
     the strings it encodes and "encoded_hex" their encoding.
  2. Write {"design_key": i, "digest_hex": <hex of the 8-byte digest>}.

Then run: python scripts/check_vectors.py <your-outputs.jsonl>
"""


class InputError(Exception):
    """The outputs file cannot be read as the documented JSON lines."""


KINDS = ("index", "signature", "digest", "design_key")
#: The vector lists of the output kinds checked by their digest alone, and their labels.
_DIGEST_KINDS = (("digest", "digests"), ("design_key", "design_keys"))


def read_outputs(path: Path) -> dict[str, dict[int, dict]]:
    """Outputs by kind (``KINDS``), each by vector position."""
    found: dict[str, dict[int, dict]] = {kind: {} for kind in KINDS}
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(entry, dict):
            raise InputError(f"{path}:{number}: expected a JSON object")
        kind = next((k for k in KINDS if k in entry), "index")
        target = found[kind]
        position = entry.get(kind)
        if isinstance(position, bool) or not isinstance(position, int):
            raise InputError(
                f"{path}:{number}: needs an integer 'index', 'signature', 'digest' or 'design_key'"
            )
        if position in target:
            raise InputError(f"{path}:{number}: {kind} {position} appears twice")
        target[position] = entry
    return found


def compare(vectors: dict, outputs: dict[str, dict[int, dict]]) -> list[str]:
    """One line per difference between the outputs (by kind, as :func:`read_outputs`) and the
    vectors."""
    reports, signatures = outputs.get("index", {}), outputs.get("signature", {})
    problems = []
    expected_reports = vectors["reports"]
    for i, vector in enumerate(expected_reports):
        label = f"report {i} ({vector['mechanism']} {json.dumps(vector['params'])})"
        output = reports.get(i)
        if output is None:
            problems.append(f"{label}: missing")
            continue
        payload = str(output.get("payload_hex", "")).lower()
        if payload != vector["payload_hex"]:
            problems.append(f"{label}: payload {payload!r}, expected {vector['payload_hex']!r}")
        consumed = len(vector["random_hex"]) // 2
        if "consumed" in output and output["consumed"] != consumed:
            problems.append(f"{label}: read {output['consumed']} random bytes, expected {consumed}")
    for i, vector in enumerate(vectors["signatures"]):
        label = f"signature {i} ({vector['device_id']})"
        output = signatures.get(i)
        if output is None:
            problems.append(f"{label}: missing")
            continue
        for field in ("device_id", "signed_bytes_hex", "signature_hex"):
            got = str(output.get(field, ""))
            got = got if field == "device_id" else got.lower()
            if got != vector[field]:
                problems.append(f"{label}: {field} differs")
    for kind, name in _DIGEST_KINDS:
        given = outputs.get(kind, {})
        for i, vector in enumerate(vectors.get(name, [])):
            label = f"{kind.replace('_', ' ')} {i} ({_subject(vector)})"
            output = given.get(i)
            if output is None:
                problems.append(f"{label}: missing")
            elif str(output.get("digest_hex", "")).lower() != vector["digest_hex"]:
                problems.append(f"{label}: digest_hex differs")
        extra = sorted(set(given) - set(range(len(vectors.get(name, [])))))
        problems += [f"{kind.replace('_', ' ')} {i}: no such vector" for i in extra]
    extra = sorted(set(reports) - set(range(len(expected_reports))))
    extra_signatures = sorted(set(signatures) - set(range(len(vectors["signatures"]))))
    problems += [f"report {i}: no such vector" for i in extra]
    problems += [f"signature {i}: no such vector" for i in extra_signatures]
    return problems


def _subject(vector: dict) -> str:
    """What a digest vector is of: a question's mechanism and id, or a design key."""
    if "question" in vector:
        return f"{vector['question']['mechanism']} {vector['question']['id']}"
    return repr(vector["key"])


def python_outputs(vectors: dict) -> list[dict]:
    """What the Python client produces for every vector (the reference implementation)."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "scripts"))
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from gen_test_vectors import ReplayRandom, build_mechanism
    from google.protobuf import json_format

    from client.device import signature
    from client.device.keys import DeviceKey
    from client.survey import QuestionSpec, design_key_digest
    from protos.ldp.v1 import ldp_pb2

    out: list[dict] = []
    for i, vector in enumerate(vectors["reports"]):
        mech = build_mechanism(vector["mechanism"], vector["params"])
        data = bytes.fromhex(vector["random_hex"])
        source = ReplayRandom(data)
        payload = mech.encode(mech.randomize(vector["answer"], source))
        out.append(
            {"index": i, "payload_hex": payload.hex(), "consumed": len(data) - source.remaining}
        )
    for i, vector in enumerate(vectors["signatures"]):
        seed = bytes.fromhex(vector["private_key_hex"])
        key = DeviceKey(Ed25519PrivateKey.from_private_bytes(seed))
        request = ldp_pb2.UploadRequest.FromString(bytes.fromhex(vector["request_hex"]))
        timestamp = int(vector["timestamp"])
        metadata = dict(key.sign_upload(request.reports, timestamp))
        signed = signature.canonical_upload(key.device_id, timestamp, request.reports)
        out.append(
            {
                "signature": i,
                "device_id": key.device_id,
                "signed_bytes_hex": signed.hex(),
                "signature_hex": metadata[signature.SIGNATURE_KEY].hex(),
            }
        )
    for i, vector in enumerate(vectors.get("digests", [])):
        message = json_format.ParseDict(vector["question"], ldp_pb2.Question())
        digest = QuestionSpec.from_proto(message).digest
        out.append({"digest": i, "digest_hex": digest.hex()})
    for i, vector in enumerate(vectors.get("design_keys", [])):
        out.append({"design_key": i, "digest_hex": design_key_digest(vector["key"]).hex()})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outputs", nargs="?", type=Path, help="the device's JSON lines")
    parser.add_argument("--vectors", type=Path, default=VECTORS_PATH)
    parser.add_argument("--explain", action="store_true", help="print how to produce the outputs")
    parser.add_argument(
        "--emit-python", action="store_true", help="print the Python client's outputs"
    )
    args = parser.parse_args(argv)
    if args.explain:
        print(EXPLAIN, end="")
        return 0
    try:
        vectors = json.loads(args.vectors.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"error: cannot read the vectors {args.vectors}: {exc}", file=sys.stderr)
        return 2
    if args.emit_python:
        for entry in python_outputs(vectors):
            print(json.dumps(entry))
        return 0
    if args.outputs is None:
        parser.error("give the outputs file, --explain or --emit-python")
    try:
        outputs = read_outputs(args.outputs)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    problems = compare(vectors, outputs)
    for problem in problems:
        print(problem)
    lists = ("reports", "signatures", *(name for _, name in _DIGEST_KINDS))
    total = sum(len(vectors.get(name, [])) for name in lists)
    if problems:
        print(f"{len(problems)} difference(s) against {total} vectors", file=sys.stderr)
        return 1
    print(f"all {total} vectors match (vectors version {vectors['version']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
