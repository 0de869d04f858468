"""scripts/check_vectors.py, the conformance helper for other implementations: the Python
client's own outputs pass, and a wrong payload, a wrong byte count, a wrong signature, a missing
vector or an unreadable file are each reported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_vectors.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
    )


@pytest.fixture(scope="module")
def reference() -> list[dict]:
    emitted = run("--emit-python")
    assert emitted.returncode == 0, emitted.stderr
    return [json.loads(line) for line in emitted.stdout.splitlines()]


def write(path: Path, entries: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return path


def test_the_python_client_passes(reference, tmp_path):
    done = run(str(write(tmp_path / "out.jsonl", reference)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "vectors match" in done.stdout


def test_each_kind_of_difference_is_reported(reference, tmp_path):
    entries = [dict(e) for e in reference]
    entries[3]["payload_hex"] = "02000000"
    entries[5]["consumed"] += 1
    signature = next(e for e in entries if "signature" in e)
    signature["signature_hex"] = "00" * 64
    del entries[7]
    done = run(str(write(tmp_path / "out.jsonl", entries)))
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert any(line.startswith("report 3 ") and "payload" in line for line in lines)
    assert any(line.startswith("report 5 ") and "random bytes" in line for line in lines)
    assert any(line.startswith("report 7 ") and line.endswith("missing") for line in lines)
    assert any(line.startswith("signature 0 ") and "signature_hex" in line for line in lines)
    assert len(lines) == 4


def test_unusable_input_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"index": 0, "payload_hex": "00"}\nnot json\n')
    done = run(str(bad))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "bad.jsonl:2: not JSON" in done.stderr
    assert run(str(tmp_path / "absent.jsonl")).returncode == 2


def test_explain_describes_the_procedure():
    done = run("--explain")
    assert done.returncode == 0 and "random_hex" in done.stdout and "request_hex" in done.stdout


def test_an_implementation_written_from_the_document_passes(tmp_path):
    """tests/wire_independent.py follows docs/wire.md only (no client code): the document is
    complete enough to reproduce every vector."""
    independent = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "wire_independent.py")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert independent.returncode == 0, independent.stderr
    outputs = tmp_path / "independent.jsonl"
    outputs.write_text(independent.stdout)
    done = run(str(outputs))
    assert done.returncode == 0, done.stdout + done.stderr
