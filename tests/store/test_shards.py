"""Sharded export and import of a survey's report log."""

from __future__ import annotations

import os

import numpy as np
import pytest
from cli_runner import run_cli

from aggregator.store import ingest, shards
from aggregator.store.sqlite.report_store import ReportStore
from aggregator.survey_file.config import load_surveys
from protos.ldp.v1 import ldp_pb2


def fill(db, surveys, count: int = 3000) -> None:
    rng = np.random.default_rng(0)
    store = ReportStore(db)
    survey = surveys["s1"]
    for question in survey.questions:
        store.register_question("s1", question.id, question.k)
    batch = []
    for _ in range(count):
        question = survey.questions[int(rng.integers(len(survey.questions)))]
        mech = question.mechanism
        payload = mech.encode(mech.simulate(np.array([rng.integers(mech.k)]), rng)[0])
        message = ldp_pb2.Report(
            report_id=os.urandom(16), survey_id="s1", question_id=question.id, payload=payload
        )
        batch.append(ingest.validate(message, surveys))
    store.put(batch)
    store.close()


def statistics(db, surveys) -> dict:
    store = ReportStore(db)
    try:
        out = {}
        for q in surveys["s1"].questions:
            store.register_question("s1", q.id, q.k)
            n, sums = store.statistics("s1", q.id)
            out[q.id] = (n, sums.tolist())
        return out
    finally:
        store.close()


def test_export_import_round_trip(tmp_path, survey_file):
    surveys = load_surveys(survey_file)
    source, target = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    fill(source, surveys)
    store = ReportStore(source)
    manifest = shards.export_survey(store, surveys["s1"], tmp_path / "out", 3)
    store.close()
    assert manifest.reports == 3000 and len(manifest.shards) == 3
    assert min(count for _, count, _ in manifest.shards) > 800  # balanced by random ids
    again = shards.read_manifest(tmp_path / "out")
    assert again.survey == surveys["s1"] and again.shards == manifest.shards
    total = sum(
        1 for name, _, _ in manifest.shards for _ in shards.read_shard(tmp_path / "out" / name)
    )
    assert total == 3000
    cli = ["import", "--config", str(survey_file), "--db", str(target)]
    cli += ["--from", str(tmp_path / "out")]
    first = run_cli("agg", *cli, check=True)
    assert "imported 3000 new reports (0 already present)" in first.stdout
    second = run_cli("agg", *cli, check=True)

    assert "imported 0 new reports (3000 already present)" in second.stdout
    assert statistics(target, surveys) == statistics(source, surveys)


def test_corrupt_shards_are_refused(tmp_path, survey_file):
    surveys = load_surveys(survey_file)
    fill(tmp_path / "a.sqlite", surveys, 200)
    store = ReportStore(tmp_path / "a.sqlite")
    manifest = shards.export_survey(store, surveys["s1"], tmp_path / "out", 2)
    store.close()
    shard = tmp_path / "out" / manifest.shards[0][0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(shards.ShardFormatError, match="checksum"):
        shards.verify(tmp_path / "out", manifest)
    shard.write_bytes(bytes(data[:-3]))
    with pytest.raises(shards.ShardFormatError, match="truncated"):
        list(shards.read_shard(shard))
    shard.write_bytes(b"NOPE" + bytes(data[4:]))
    with pytest.raises(shards.ShardFormatError, match="not a version-1"):
        list(shards.read_shard(shard))
    (tmp_path / "out" / "manifest.json").write_text("{}")
    with pytest.raises(shards.ShardFormatError):
        shards.read_manifest(tmp_path / "out")
