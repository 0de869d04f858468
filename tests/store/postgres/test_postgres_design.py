"""Design statistics on the shared PostgreSQL store: devices with design keys upload through two
ingest nodes (real gRPC on loopback, a real PostgreSQL server), and ``estimate --design
--store`` and ``test --design --store`` equal a SQLite store holding the same reports (1e-12);
``export --store`` carries the keys' statistics, and its import into SQLite equals them too.
Skipped without PostgreSQL, failed with LDP_REQUIRE_POSTGRES=1 (tests/postgres_server.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_runner import run_cli
from conftest import ServerThread
from service.collector.test_design_service import messages, write_survey
from store.test_design_export import QUESTIONS, _design_rows, _estimate, _same_estimates, _upload


@pytest.mark.slow  # a PostgreSQL database and three servers
def test_design_through_two_nodes_equals_sqlite(tmp_path, postgres_url):
    config = write_survey(tmp_path)
    nodes = [
        ServerThread(config, tmp_path / f"node-{name}", store_url=postgres_url).start()
        for name in ("a", "b")
    ]
    single = ServerThread(config, tmp_path / "single.sqlite").start()
    rng = np.random.default_rng(28)
    try:
        survey = single.surveys["field"]
        for question_id in QUESTIONS:
            sent, _ = messages(survey, question_id, 600, rng)
            _upload(nodes[0], sent[:300])
            _upload(nodes[1], sent[200:])  # 100 resent through the other node: stored once
            _upload(single, sent)
    finally:
        for server in (*nodes, single):
            server.stop()
    db = single.db
    shared = ("--store", postgres_url)
    for question_id in ("rr", "noise"):
        expected = _estimate(config, db, question_id)
        assert expected["n"] == 600
        _same_estimates(_estimate_store(config, postgres_url, question_id), expected)
    north = ("--group", "north", "--variance", "jackknife")
    _same_estimates(
        _estimate_store(config, postgres_url, "rr", *north), _estimate(config, db, "rr", *north)
    )
    test = [
        "test",
        "--config",
        config,
        "--survey",
        "field",
        "--question",
        "rr",
        "gof",
        "--p0",
        "uniform",
        "--design",
        "--json",
    ]
    got = json.loads(run_cli("agg", *test, *shared, check=True).stdout)
    want = json.loads(run_cli("agg", *test, "--db", db, check=True).stdout)
    np.testing.assert_allclose(
        [got["statistic"], got["pvalue"]], [want["statistic"], want["pvalue"]], rtol=1e-12
    )

    out = tmp_path / "export"
    run_cli(
        "agg", "export", "--config", config, *shared, "--survey", "field", "--out", out, check=True
    )  # fmt: skip
    imported = tmp_path / "imported.sqlite"
    run_cli("agg", "import", "--config", config, "--db", imported, "--from", out, check=True)
    got_rows, want_rows = _design_rows(imported), _design_rows(db)
    assert got_rows.keys() == want_rows.keys()
    for cell, (n, sums, squares) in want_rows.items():
        assert got_rows[cell][:2] == (n, sums)
        np.testing.assert_allclose(got_rows[cell][2], squares, rtol=1e-12)


def _estimate_store(config, url: str, question_id: str, *extra: str) -> dict:
    out = run_cli(
        "agg", "estimate", "--config", config, "--store", url, "--survey", "field",
        "--question", question_id, "--design", "--json", *extra, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)
