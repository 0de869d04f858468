"""Export and import of a survey with a sampling design: the export carries the per design key
statistics beside the shards; importing it into a fresh store gives the same ``estimate
--design`` (1e-12); several exports of disjoint stores add up to the store holding every report;
importing again changes nothing; an export that overlaps the store in part, a damaged or edited
design file, and an export without design statistics are refused in one line. Reports arrive
over real gRPC on loopback into real SQLite stores."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import grpc
import numpy as np
import pytest
from cli_runner import run_cli
from conftest import ServerThread
from service.collector.test_design_service import SURVEYS, messages, write_survey

from aggregator.store.sqlite import design_statistics
from aggregator.store.sqlite.reader import StoreReader
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

QUESTIONS = ("rr", "noise", "pair")


def _upload(server: ServerThread, reports: list) -> None:
    with grpc.insecure_channel(server.target) as channel:
        collector = ldp_pb2_grpc.CollectorStub(channel)
        for start in range(0, len(reports), 500):
            request = ldp_pb2.UploadRequest(reports=reports[start : start + 500])
            collector.Upload(request, timeout=30)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Three stores: ``whole`` holds every report, ``east`` and ``west`` one half each."""
    root = tmp_path_factory.mktemp("design-export")
    config = write_survey(root)
    servers = {
        name: ServerThread(config, root / f"{name}.sqlite") for name in ("whole", "east", "west")
    }
    for server in servers.values():
        server.start()
    rng = np.random.default_rng(2929)
    try:
        survey = servers["whole"].surveys["field"]
        for question_id in QUESTIONS:
            sent, _ = messages(survey, question_id, 800, rng)
            _upload(servers["whole"], sent)
            _upload(servers["east"], sent[:500])
            _upload(servers["west"], sent[500:])
    finally:
        for server in servers.values():
            server.stop()
    yield root, config, {name: server.db for name, server in servers.items()}


def _export(config: Path, db: Path, out: Path) -> Path:
    run_cli(
        "agg", "export", "--config", config, "--db", db, "--survey", "field", "--out", out,
        "--shards", "3", check=True,
    )  # fmt: skip
    return out


def _import(config: Path, db: Path, source: Path):
    return run_cli("agg", "import", "--config", config, "--db", db, "--from", source)


def _estimate(config: Path, db: Path, question_id: str, *extra: str) -> dict:
    out = run_cli(
        "agg", "estimate", "--config", config, "--db", db, "--survey", "field",
        "--question", question_id, "--design", "--json", *extra, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def _same_estimates(a: dict, b: dict) -> None:
    assert a["n"] == b["n"] and a["design"] == b["design"]
    for name in ("estimate", "standard_error", "ci_low", "ci_high", "deff", "clustering_effect"):
        np.testing.assert_allclose(a[name], b[name], rtol=1e-12, atol=0)


def _design_rows(db: Path) -> dict:
    with StoreReader(db) as reader:
        return {
            (q, s.group, s.key): (s.n, s.sums.tolist(), s.squares.tolist())
            for q in QUESTIONS
            for s in design_statistics.read(reader.connection, "field", q)
        }


def test_export_then_import_gives_the_same_design_estimates(stores, tmp_path):
    _, config, dbs = stores
    out = _export(config, dbs["whole"], tmp_path / "export")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["design"]["file"] == "field.design.json"
    fresh = tmp_path / "fresh.sqlite"
    done = _import(config, fresh, out)
    assert done.returncode == 0, done.stderr
    assert "imported 2400 new reports" in done.stdout and "design statistics" in done.stdout
    assert _design_rows(fresh) == _design_rows(dbs["whole"])
    for question_id in ("rr", "noise"):
        _same_estimates(
            _estimate(config, fresh, question_id), _estimate(config, dbs["whole"], question_id)
        )
    north = ("--group", "north", "--variance", "jackknife")
    _same_estimates(
        _estimate(config, fresh, "rr", *north), _estimate(config, dbs["whole"], "rr", *north)
    )
    again = _import(config, fresh, out)  # idempotent: every report a duplicate, nothing added
    assert again.returncode == 0 and "imported 0 new reports (2400 already present)" in again.stdout
    assert _design_rows(fresh) == _design_rows(dbs["whole"])


def test_exports_of_disjoint_stores_add_up(stores, tmp_path):
    _, config, dbs = stores
    merged = tmp_path / "merged.sqlite"
    for name in ("east", "west"):
        done = _import(config, merged, _export(config, dbs[name], tmp_path / name))
        assert done.returncode == 0, done.stderr
    whole, got = _design_rows(dbs["whole"]), _design_rows(merged)
    assert got.keys() == whole.keys()
    for cell, (n, sums, squares) in whole.items():
        assert got[cell][:2] == (n, sums)
        np.testing.assert_allclose(got[cell][2], squares, rtol=1e-12)
    for question_id in QUESTIONS[:2]:
        _same_estimates(
            _estimate(config, merged, question_id), _estimate(config, dbs["whole"], question_id)
        )


def _one_line(out, status: int, message: str) -> None:
    assert out.returncode == status and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr


def test_an_export_overlapping_the_store_in_part_is_refused_and_rolled_back(stores, tmp_path):
    _, config, dbs = stores
    store = tmp_path / "partial.sqlite"
    assert _import(config, store, _export(config, dbs["east"], tmp_path / "east")).returncode == 0
    before = _design_rows(store)
    refused = _import(config, store, _export(config, dbs["whole"], tmp_path / "whole"))
    _one_line(refused, 2, "holds some of the exported reports but not all")
    assert _design_rows(store) == before
    with StoreReader(store) as reader:  # the refused question's reports were rolled back too
        assert reader.statistics("field", "rr", 4)[0] == 500


def test_damaged_edited_or_missing_design_statistics_are_one_line(stores, tmp_path):
    _, config, dbs = stores
    out = _export(config, dbs["east"], tmp_path / "export")
    damaged = tmp_path / "damaged"
    shutil.copytree(out, damaged)
    with open(damaged / "field.design.json", "a") as file:
        file.write(" ")
    _one_line(_import(config, tmp_path / "a.sqlite", damaged), 2, "checksum does not match")

    edited = tmp_path / "edited"  # one key's count changed, the checksum made to fit
    shutil.copytree(out, edited)
    document = json.loads((edited / "field.design.json").read_text())
    document["rows"][0]["n"] += 1
    (edited / "field.design.json").write_text(json.dumps(document))
    _fix_checksum(edited)
    _one_line(_import(config, tmp_path / "b.sqlite", edited), 2, "not one export")

    unknown = tmp_path / "unknown"  # a key the frame does not list
    shutil.copytree(out, unknown)
    document = json.loads((unknown / "field.design.json").read_text())
    document["rows"][0]["key"] = "nowhere"
    (unknown / "field.design.json").write_text(json.dumps(document))
    _fix_checksum(unknown)
    _one_line(_import(config, tmp_path / "c.sqlite", unknown), 2, "nowhere")

    missing = tmp_path / "missing"  # as exported before design statistics were
    shutil.copytree(out, missing)
    manifest = json.loads((missing / "manifest.json").read_text())
    del manifest["design"]
    (missing / "manifest.json").write_text(json.dumps(manifest))
    _one_line(_import(config, tmp_path / "d.sqlite", missing), 2, "carries no design statistics")
    assert not any((tmp_path / f"{name}.sqlite").exists() for name in "acd")  # checked first
    with StoreReader(tmp_path / "b.sqlite") as reader:  # checked before its transaction
        assert reader.statistics("field", "rr", 4)[0] == 0


def _fix_checksum(directory: Path) -> None:
    import hashlib

    manifest = json.loads((directory / "manifest.json").read_text())
    digest = hashlib.sha256((directory / "field.design.json").read_bytes()).hexdigest()
    manifest["design"]["sha256"] = digest
    (directory / "manifest.json").write_text(json.dumps(manifest))


def test_a_split_survey_exports_and_imports_one_side(tmp_path):
    """A split survey's export holds one side: its keys' statistics of that side only, restored
    on that side (the other side of the fresh store stays empty)."""
    config = write_survey(tmp_path)
    config.write_text(
        SURVEYS.replace("min_batch_size = 50", "min_batch_size = 20\nexploration_fraction = 0.5")
    )
    server = ServerThread(config, tmp_path / "store.sqlite").start()
    try:
        batch, _ = messages(server.surveys["field"], "rr", 600, np.random.default_rng(12))
        sides = np.random.default_rng(13).choice([ldp_pb2.EXPLORATION, ldp_pb2.CONFIRMATION], 600)
        for report, side in zip(batch, sides, strict=True):
            report.side = int(side)
        _upload(server, batch)
    finally:
        server.stop()
    out = tmp_path / "export"
    run_cli(
        "agg", "export", "--config", config, "--db", server.db, "--survey", "field",
        "--side", "exploration", "--out", out, check=True,
    )  # fmt: skip
    assert json.loads((out / "field.design.json").read_text())["side"] == "exploration"
    fresh = tmp_path / "fresh.sqlite"
    assert _import(config, fresh, out).returncode == 0
    side = ("--side", "exploration")
    _same_estimates(
        _estimate(config, fresh, "rr", *side), _estimate(config, server.db, "rr", *side)
    )
    with StoreReader(fresh) as reader:
        assert design_statistics.read(reader.connection, "field", "rr", ldp_pb2.CONFIRMATION) == []
