"""The committed stubs are exactly what scripts/gen_protos.py generates from the .proto sources."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_stubs_match_proto_sources(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(
        p.relative_to(ROOT)
        for p in (ROOT / "protos").rglob("*")
        if p.name.endswith(("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"))
    )
    assert generated == committed, "stub files differ: run scripts/gen_protos.py"
    for relative in generated:
        assert (tmp_path / relative).read_bytes() == (ROOT / relative).read_bytes(), (
            f"{relative} drifted from its .proto: run scripts/gen_protos.py"
        )


def test_wire_names():
    from protos.ldp.v1 import ldp_pb2

    services = ldp_pb2.DESCRIPTOR.services_by_name
    assert set(services) == {"Collector", "Analyst"}
    assert services["Collector"].full_name == "ldp.v1.Collector"
