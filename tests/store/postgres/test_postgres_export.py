"""``ldp-aggregator export --store postgresql://...``: a shared PostgreSQL store's reports as
shard files, read in one snapshot, so the Beam job runs on them unchanged, and ``job --store``
reading one snapshot of the store directly; their counts equal
``PostgresStore.statistics`` exactly for every mechanism. Mistakes are one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from jobs.test_beam_job import reports, run_in_process

from aggregator.cli import main as aggregator_main
from aggregator.store import ingest
from aggregator.survey_file.config import load_surveys
from tests.conftest import SURVEYS_TOML

pytest.importorskip(
    "apache_beam", reason="needs the [beam] extra: pip install -e '.[aggregator,dev,beam]'"
)


@pytest.mark.slow  # a PostgreSQL database and a Beam pipeline
def test_the_beam_job_over_an_export_equals_the_shared_store(
    tmp_path: Path, postgres_url: str, capsys
) -> None:
    from aggregator.store.postgres import pins
    from aggregator.store.postgres.engine import PostgresStore

    config = tmp_path / "surveys.toml"
    config.write_text(SURVEYS_TOML)
    surveys = load_surveys(config)
    messages = reports(surveys, 700, np.random.default_rng(3))
    with PostgresStore(postgres_url) as store:
        pins.register(store, surveys)
        half = len(messages) // 2  # two commits, as from two nodes
        store.put(ingest.validate_batch(messages[:half], surveys))
        store.put(ingest.validate_batch(messages[half:], surveys))
        expected = {
            q.id: (int(n), sums.tolist())
            for q in surveys["s1"].questions
            for n, sums in [store.statistics("s1", q.id)]
        }
    out = tmp_path / "shards"
    command = ["export", "--config", str(config), "--store", postgres_url, "--survey", "s1"]
    assert aggregator_main([*command, "--out", str(out), "--shards", "3"]) == 0
    assert f"exported {len(messages)} reports of s1" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert sum(entry["reports"] for entry in manifest["shards"]) == len(messages)

    results = run_in_process(surveys, [str(out)], tmp_path / "results.json")
    assert set(results) == set(expected)
    for question_id, (n, sums) in expected.items():
        assert n == 700
        assert (results[question_id]["n"], results[question_id]["sums"]) == (n, sums)


def test_export_store_mistakes_are_one_line(tmp_path: Path, capsys) -> None:
    config = tmp_path / "surveys.toml"
    config.write_text(SURVEYS_TOML)
    command = ["export", "--config", str(config), "--survey", "s1", "--out", str(tmp_path / "o")]
    assert aggregator_main([*command, "--store", "mysql://x/y"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "ldp-aggregator: error: --store takes a PostgreSQL URL: postgresql://USER@HOST/DATABASE"
    )
    with pytest.raises(SystemExit) as info:
        aggregator_main([*command, "--store", "postgresql://x/y", "--db", "r.sqlite"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "not allowed with argument" in err and "Traceback" not in err


def test_export_of_an_unpinned_or_changed_survey_is_refused(
    tmp_path: Path, postgres_url: str, capsys
) -> None:
    """A store that never served the survey, or a survey file changed since: one line, no
    shards, and nothing written to the store."""
    from aggregator.store.postgres import pins
    from aggregator.store.postgres.engine import PostgresStore

    config = tmp_path / "surveys.toml"
    config.write_text(SURVEYS_TOML)
    surveys = load_surveys(config)
    out = tmp_path / "o"
    command = ["export", "--config", str(config), "--store", postgres_url, "--survey", "s1"]
    assert aggregator_main([*command, "--out", str(out)]) == 2
    assert "unknown question s1/" in capsys.readouterr().err
    with PostgresStore(postgres_url) as store:
        pins.register(store, surveys)
        store.put(ingest.validate_batch(reports(surveys, 5, np.random.default_rng(1)), surveys))
    changed = SURVEYS_TOML.replace("epsilon = 1.0", "epsilon = 1.5", 1)
    assert changed != SURVEYS_TOML
    config.write_text(changed)
    assert aggregator_main([*command, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "the store holds reports randomized with" in err and len(err.strip().splitlines()) == 1
    with PostgresStore(postgres_url) as store:  # the check wrote nothing: the old pin holds
        pins.register(store, surveys)


def store_statistics(store, surveys) -> dict[str, tuple[int, list[int]]]:
    return {
        q.id: (int(n), sums.tolist())
        for q in surveys["s1"].questions
        for n, sums in [store.statistics("s1", q.id)]
    }


@pytest.mark.slow  # a PostgreSQL database and Beam pipelines
def test_the_beam_job_reads_one_snapshot_of_the_store_directly(
    tmp_path: Path, postgres_url: str, capsys
) -> None:
    """``job --store``: ranges read in parallel from one exported snapshot. Reports committed
    while the job holds its snapshot are not in it; the results equal the store's statistics
    at the snapshot, and then (on the command line) the job over an export of the same state."""
    from aggregator.jobs import pipeline
    from aggregator.jobs.postgres_source import held_snapshot, ranges
    from aggregator.jobs.results import Analysis
    from aggregator.store.postgres import pins
    from aggregator.store.postgres.engine import PostgresStore

    config = tmp_path / "surveys.toml"
    config.write_text(SURVEYS_TOML)
    surveys = load_surveys(config)
    rng = np.random.default_rng(5)
    with PostgresStore(postgres_url) as store:
        pins.register(store, surveys)
        store.put(ingest.validate_batch(reports(surveys, 400, rng), surveys))
        at_snapshot = store_statistics(store, surveys)
        with held_snapshot(postgres_url) as snapshot:
            store.put(ingest.validate_batch(reports(surveys, 50, rng), surveys))  # after it
            spec = pipeline.JobSpec(
                surveys,
                (),
                str(tmp_path / "snapshot.json"),
                Analysis(seed=11),
                tables=ranges(postgres_url, snapshot, "s1", None, 7),
            )
            document = pipeline.run(spec, ["--runner=DirectRunner"])
        now = store_statistics(store, surveys)
    results = {r["question"]: r for r in document["results"]}
    assert {q: (r["n"], r["sums"]) for q, r in results.items()} == at_snapshot
    assert all(n == 400 for n, _ in at_snapshot.values())

    out = tmp_path / "store.json"
    job = ["job", "--surveys", str(config), "--seed", "11", "--direct-num-workers", "1"]
    source = ["--store", postgres_url, "--survey", "s1"]
    assert aggregator_main([*job, *source, "--out", str(out)]) == 0
    assert "(16 range(s) of one snapshot of the store)" in capsys.readouterr().out
    direct = {r["question"]: r for r in json.loads(out.read_text())["results"]}
    assert {q: (r["n"], r["sums"]) for q, r in direct.items()} == now
    shards = tmp_path / "shards"
    export = ["export", "--config", str(config), "--store", postgres_url, "--survey", "s1"]
    assert aggregator_main([*export, "--out", str(shards)]) == 0
    exported = tmp_path / "exported.json"
    assert aggregator_main([*job, "--shards", str(shards), "--out", str(exported)]) == 0
    capsys.readouterr()
    assert json.loads(exported.read_text())["results"] == json.loads(out.read_text())["results"]


def test_job_store_mistakes_are_one_line(tmp_path: Path, capsys) -> None:
    config = tmp_path / "surveys.toml"
    config.write_text(SURVEYS_TOML)
    job = ["job", "--surveys", str(config), "--out", str(tmp_path / "r.json")]
    for extra, message in (
        (["--store", "postgresql://x/y"], "--store needs --survey"),
        (["--store", "mysql://x/y", "--survey", "s1"], "--store takes a PostgreSQL URL"),
        (["--shards", str(tmp_path), "--survey", "s1"], "--survey and --side go with --store"),
    ):
        assert aggregator_main([*job, *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
