"""``ldp-aggregator test --calibration`` and ``estimate --simultaneous`` on a real SQLite report
store, as a user runs them: the calibration used is printed, a bad choice is one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_cli

from aggregator.store.model import StoredReport
from aggregator.store.sqlite.report_store import ReportStore


def run(*args: str) -> subprocess.CompletedProcess:
    return run_cli("agg", *args)  # in this process (tests/cli_runner.py)


@pytest.fixture
def db_args(tmp_path: Path, survey_file: Path) -> list[str]:
    """Question s1/rr (RR, k = 4): 40 reports, every one in category 0 (sparse against uniform)."""
    db = tmp_path / "store.sqlite"
    store = ReportStore(db)
    store.register_question("s1", "rr", 4)
    reports = [
        StoredReport(i.to_bytes(16, "big"), "s1", "rr", bytes([0]), np.eye(4, dtype=np.int64)[0])
        for i in range(40)
    ]
    store.put(reports)
    store.close()
    return ["--config", str(survey_file), "--db", str(db), "--survey", "s1", "--question", "rr"]


def test_calibration_is_chosen_and_printed(db_args):
    p0 = ["gof", "--p0", "0.25,0.25,0.25,0.25", "--seed", "1"]
    simulated = run("test", *db_args, *p0, "--calibration", "monte-carlo")
    assert simulated.returncode == 0, simulated.stderr
    assert "calibration: monte-carlo" in simulated.stdout
    assert "p <= 0.001 = 1/(m+1), m = 999" in simulated.stdout
    asymptotic = json.loads(
        run("test", *db_args, *p0, "--calibration", "asymptotic", "--json").stdout
    )
    assert asymptotic["calibration"] == "asymptotic" and asymptotic["dof"] == 3
    auto = json.loads(run("test", *db_args, *p0, "--json").stdout)
    assert auto["calibration"] in ("asymptotic", "monte-carlo") and auto["calibration_reason"]
    bad = run("test", *db_args, *p0, "--calibration", "bootstrap")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "calibration" in bad.stderr


def test_estimate_flags_and_simultaneous_intervals(db_args):
    done = run("estimate", *db_args, "--simultaneous", "--estimator", "unbiased")
    assert done.returncode == 0, done.stderr
    assert "estimator: unbiased" in done.stdout.splitlines()[0]
    header = done.stdout.splitlines()[1]
    assert "projected" in header and "simultaneous" in header
    assert "'projected' is the nearest distribution" in done.stdout
    assert "all 4 intervals cover at once with probability at least 95%" in done.stdout
    est = json.loads(
        run("estimate", *db_args, "--simultaneous", "--estimator", "unbiased", "--json").stdout
    )
    assert est["estimator"] == "unbiased" and est["frequencies"] == est["unbiased"]
    assert any(est["outside_unit_interval"]) and len(est["simultaneous_low"]) == 4
    assert all(hi > lo for lo, hi in zip(est["ci_low"], est["ci_high"], strict=True))
    assert all(lo >= 0 and hi <= 1 for lo, hi in zip(est["ci_low"], est["ci_high"], strict=True))


def test_estimate_shows_the_simplex_estimate_by_default(db_args):
    """40 reports all in category 0: unbiased values below 0, shown as shares with the unbiased
    values beside them, every interval inside [0, 1] and holding its estimate."""
    done = run("estimate", *db_args)
    assert done.returncode == 0, done.stderr
    assert "estimator: simplex" in done.stdout.splitlines()[0]
    assert "unbiased" in done.stdout.splitlines()[1]
    assert "simplex: the unbiased estimate shifted by" in done.stdout
    est = json.loads(run("estimate", *db_args, "--simultaneous", "--json").stdout)
    freqs = np.array(est["frequencies"])
    assert est["estimator"] == "simplex" and any(est["outside_unit_interval"])
    assert (freqs >= 0).all() and abs(freqs.sum() - 1) < 1e-12
    np.testing.assert_allclose(freqs, est["projected"])
    for low, high in (("ci_low", "ci_high"), ("simultaneous_low", "simultaneous_high")):
        lo, hi = np.array(est[low]), np.array(est[high])
        assert ((lo >= 0) & (lo <= freqs) & (freqs <= hi) & (hi <= 1) & (lo < hi)).all()
    bad = run("estimate", *db_args, "--estimator", "mle")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--estimator" in bad.stderr
