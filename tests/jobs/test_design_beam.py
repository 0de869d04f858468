"""The Beam job's design-based estimates (DirectRunner, the real pipeline): ``job --design`` over
one export, and over the exports of two disjoint stores merged by key, equals ``estimate
--design --json`` on the store holding the same reports (1e-12), pooled and per group; exports
that overlap get an error in place of a design estimate, never a wrong one."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip(
    "apache_beam", reason="needs the [beam] extra: pip install -e '.[aggregator,dev,beam]'"
)

from cli_runner import run_cli
from store.test_design_export import _estimate, _export, stores  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow  # Beam pipelines on the DirectRunner (docs/testing.md)
FIELDS = ("estimate", "standard_error", "ci_low", "ci_high", "deff", "weighting_effect")


def _job(config, out, *sources: str, extra: tuple[str, ...] = ()) -> dict:
    """The job's results by (survey, question, group): design-based by default."""
    done = run_cli("agg", "job", "--surveys", config, "--shards", *sources, "--out", out, *extra)
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    return {(r["survey"], r["question"], r.get("group", "")): r for r in document["results"]}


def _same(job: dict, cli: dict) -> None:
    for name in ("n", "design", "variance", "degrees_of_freedom"):
        assert job[name] == cli[name], name
    for name in (*FIELDS, "clustering_effect"):
        np.testing.assert_allclose(job[name], cli[name], rtol=1e-12, atol=0)


def test_job_design_equals_estimate_design_on_the_store(stores, tmp_path):  # noqa: F811
    _, config, dbs = stores
    export = _export(config, dbs["whole"], tmp_path / "export")
    results = _job(config, tmp_path / "one.json", str(export))
    for question_id in ("rr", "noise", "pair"):
        _same(
            results["field", question_id, ""]["design"],
            _estimate(config, dbs["whole"], question_id),
        )
        assert results["field", question_id, ""]["estimate"]["ignores_design"] is True
    assert results["field", "pair", ""]["tests"]["independence"]["ignores_design"] is True
    for group in ("north", "south"):
        got = results["field", "rr", group]["design"]
        _same(got, _estimate(config, dbs["whole"], "rr", "--group", group))
    jackknife = _job(
        config, tmp_path / "jk.json", str(export), extra=("--design", "--variance", "jackknife")
    )
    expected = _estimate(config, dbs["whole"], "noise", "--variance", "jackknife")
    _same(jackknife["field", "noise", ""]["design"], expected)


def test_job_merges_the_keys_of_disjoint_exports(stores, tmp_path):  # noqa: F811
    _, config, dbs = stores
    east = _export(config, dbs["east"], tmp_path / "east")
    west = _export(config, dbs["west"], tmp_path / "west")
    results = _job(config, tmp_path / "merged.json", str(east), str(west))
    for question_id in ("rr", "noise"):
        _same(
            results["field", question_id, ""]["design"],
            _estimate(config, dbs["whole"], question_id),
        )
    overlapping = _job(
        config,
        tmp_path / "overlap.json",
        str(east),
        str(_export(config, dbs["whole"], tmp_path / "whole")),
    )
    result = overlapping["field", "rr", ""]
    assert result["duplicates_dropped"] == 500
    assert "repeat report ids" in result["design"]["error"]


def test_ignore_design_says_so_in_every_result_of_the_survey(stores, tmp_path):  # noqa: F811
    _, config, dbs = stores
    export = _export(config, dbs["whole"], tmp_path / "export")
    results = _job(config, tmp_path / "srs.json", str(export), extra=("--ignore-design",))
    for (survey, _, _), result in results.items():
        assert survey != "field" or (result["ignores_design"] and "design" not in result)
    both = run_cli("agg", "job", "--surveys", config, "--shards", str(export), "--out",
                   tmp_path / "x.json", "--design", "--ignore-design")  # fmt: skip
    assert both.returncode == 2 and "contradict" in both.stderr
    store = ["--store", "postgresql://nobody@127.0.0.1:9/none", "--survey", "field"]
    direct = run_cli("agg", "job", "--config", config, *store, "--out", tmp_path / "y.json")
    assert direct.returncode == 2 and "export --store" in direct.stderr
    assert len(direct.stderr.strip().splitlines()) == 1
