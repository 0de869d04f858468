"""The atheris target (scripts/fuzz_ingest.py): the committed corpus (seeds and past crashers)
replays without a finding, the seeds are valid inputs that reach validation, and a short
coverage-guided run works when the [fuzz] extra is installed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aggregator.store import ingest
from protos.ldp.v1 import ldp_pb2

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "fuzz_ingest.py"
CORPUS = ROOT / "tests" / "fuzz_corpus"


def load_target():
    spec = importlib.util.spec_from_file_location("fuzz_ingest", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


target = load_target()


@pytest.mark.parametrize("name", sorted(p.name for p in CORPUS.iterdir()))
def test_corpus_replays_without_a_finding(name: str, tmp_path: Path) -> None:
    target.check_input((CORPUS / name).read_bytes(), tmp_path)


def test_seeds_are_committed_and_valid() -> None:
    seeds = target.seeds()
    for name, data in seeds.items():
        assert (CORPUS / name).read_bytes() == data, f"regenerate the seeds: {SCRIPT.name}"
        if data[0] == target.UPLOAD:
            reports = ldp_pb2.UploadRequest.FromString(data[1:]).reports
            assert len(ingest.validate_batch(reports, target.SURVEYS)) == len(reports) > 0


@pytest.mark.parametrize("question", [q.id for q in target.SURVEYS["s1"].questions])
def test_range_check_has_teeth(question: str) -> None:
    """The target's range check passes a contribution on the edge of the valid range and fails
    one a step beyond it."""
    mech = target.SURVEYS["s1"].question(question).mechanism
    counts = mech.name in ("randomized_response", "flip_components")
    top = 1 if counts else mech.accepted_bound
    edge = np.zeros(mech.k, dtype=np.int64)
    edge[0] = top
    if not counts:
        edge[-1] = -top
    target.check_contribution(mech, edge)
    beyond = edge.copy()
    beyond[0] = top + 1
    with pytest.raises(AssertionError):
        target.check_contribution(mech, beyond)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("atheris") is None, reason="needs the [fuzz] extra")
def test_short_fuzz_run(tmp_path: Path) -> None:
    scratch = tmp_path / "corpus"
    scratch.mkdir()
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "-runs=2000", "-seed=1", str(scratch), str(CORPUS)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Done 2000 runs" in run.stderr
    assert not list(tmp_path.glob("crash-*"))
