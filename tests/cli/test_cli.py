"""The command-line tools as a user runs them: real processes, a real server on loopback.
User mistakes give one line on stderr and a non-zero exit, never a traceback. (The release
threshold and test-input checks run the commands in this process: tests/cli_runner.py.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from aggregator_process import spawn_serve
from cli_runner import run_cli


def run(tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    module = {"agg": "aggregator.cli", "client": "client.cli"}[tool]
    done = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


def run_here(tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """The same in this process (tests/cli_runner.py): for the checks of what a command says,
    where the process adds nothing that the other tests here do not already cover."""
    done = run_cli(tool, *args)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def assert_user_error(done: subprocess.CompletedProcess, status: int, fragment: str) -> None:
    assert done.returncode == status, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], done.stderr


@pytest.fixture
def live_server(tmp_path: Path, survey_file: Path):
    db = tmp_path / "store.sqlite"
    process, port = spawn_serve(
        tmp_path / "port", "--config", str(survey_file), "--db", str(db), "--insecure"
    )
    yield f"127.0.0.1:{port}", db, process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)


def test_full_flow_through_the_cli(live_server, tmp_path, survey_file):
    server, db, process = live_server
    state = tmp_path / "device.sqlite"
    common = ["--server", server, "--insecure", "--state", str(state)]
    first = run(
        "client",
        "submit",
        *common,
        "--survey",
        "s1",
        "--question",
        "rr",
        "--answer",
        "b",
        "--budget",
        "3",
        "--json",
    )
    assert json.loads(first.stdout)["flush"]["accepted"] == 1
    run(
        "client",
        "submit",
        *common,
        "--survey",
        "s1",
        "--question",
        "joint",
        "--answer",
        "x1|y2",
        "--no-flush",
    )
    flushed = json.loads(run("client", "flush", *common, "--json").stdout)
    assert (flushed["accepted"], flushed["pending"]) == (1, 0)
    budget = json.loads(run("client", "budget", "--state", str(state), "--json").stdout)
    assert budget["spent_pointwise"] == pytest.approx(3.0) and budget["charges"] == 2
    refused = run(
        "client",
        "submit",
        *common,
        "--survey",
        "s1",
        "--question",
        "fc",
        "--answer",
        "a",
        check=False,
    )
    assert_user_error(refused, 2, "refused")  # the budget of 3 is spent

    sim = json.loads(
        run(
            "client",
            "simulate",
            "--server",
            server,
            "--insecure",
            "--survey",
            "s1",
            "--devices",
            "300",
            "--seed",
            "1",
            "--json",
        ).stdout
    )
    assert sim["accepted"] == 1500 and sim["duplicate"] == 0

    db_args = ["--config", str(survey_file), "--db", str(db), "--survey", "s1"]
    est = json.loads(run("agg", "estimate", *db_args, "--question", "gauss", "--json").stdout)
    assert est["n"] == 300 and est["labels"] == ["a", "b", "c", "d"]
    gof = json.loads(
        run(
            "agg",
            "test",
            *db_args,
            "--question",
            "lap",
            "gof",
            "--p0",
            "0.25,0.25,0.25,0.25",
            "--seed",
            "3",
            "--json",
        ).stdout
    )
    assert gof["dof"] is None and 0 < gof["pvalue"] <= 1
    ind = run("agg", "test", *db_args, "--question", "joint", "independence")
    assert "independence" in ind.stdout and "p-value" in ind.stdout
    rebuilt = json.loads(
        run("agg", "rebuild", "--config", str(survey_file), "--db", str(db), "--json").stdout
    )
    assert all(row["matched"] for row in rebuilt)

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0


def test_aggregator_user_errors(tmp_path, survey_file):
    db = tmp_path / "none.sqlite"
    assert_user_error(
        run("agg", "serve", "--config", str(survey_file), "--db", str(db), check=False),
        2,
        "--insecure",
    )
    assert_user_error(
        run(
            "agg",
            "serve",
            "--config",
            str(tmp_path / "missing.toml"),
            "--db",
            str(db),
            "--insecure",
            check=False,
        ),
        2,
        "not found",
    )
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[[survey]]\nid = "s"\n[[survey.question]]\nid = "q"\n'
        'categories = ["a", "b"]\nmechanism = "coin"\nepsilon = 1.0\n'
    )
    assert_user_error(
        run("agg", "serve", "--config", str(bad), "--db", str(db), "--insecure", check=False),
        2,
        "unknown mechanism",
    )
    bad.write_text("[[survey]\n")
    assert_user_error(
        run(
            "agg",
            "estimate",
            "--config",
            str(bad),
            "--db",
            str(db),
            "--survey",
            "s",
            "--question",
            "q",
            check=False,
        ),
        2,
        "cannot read",
    )
    args = ["--config", str(survey_file), "--db", str(db), "--survey", "s1", "--question", "rr"]
    assert_user_error(run("agg", "estimate", *args, check=False), 2, "not found")


def test_release_threshold_and_bad_test_input(live_server, survey_file):
    server, db, _ = live_server
    args = ["--config", str(survey_file), "--db", str(db), "--survey", "s1"]
    assert_user_error(
        run_here("agg", "estimate", *args, "--question", "rr", check=False), 3, "released from 5"
    )
    run_here(
        "client", "simulate", "--server", server, "--insecure", "--survey", "s1", "--devices", "20"
    )
    assert_user_error(
        run_here("agg", "test", *args, "--question", "rr", "gof", "--p0", "0.5,0.5", check=False),
        2,
        "has 4 categories",
    )
    assert_user_error(
        run_here("agg", "test", *args, "--question", "rr", "gof", check=False), 2, "--p0"
    )
    test = ["test", *args, "--question", "rr", "gof", "--seed", "5", "--json"]
    by_numbers = json.loads(run_here("agg", *test, "--p0", "0.25,0.25,0.25,0.25").stdout)
    assert json.loads(run_here("agg", *test, "--p0", "uniform").stdout) == by_numbers
    null_file = db.parent / "p0.csv"
    null_file.write_text("category,p0\nd,0.25\nb,0.25\n# comment\na,0.25\nc,0.25\n")
    assert json.loads(run_here("agg", *test, "--p0", f"@{null_file}").stdout) == by_numbers
    null_file.write_text("a,0.5\nb,0.5\n")
    assert_user_error(
        run_here("agg", *test[:-1], "--p0", f"@{null_file}", check=False), 2, "no probability for 2"
    )
    assert_user_error(
        run_here("agg", "test", *args, "--question", "nope", "gof", "--p0", "1", check=False),
        2,
        "no question",
    )


def test_a_closed_output_pipe_ends_quietly(survey_file):
    """`ldp-aggregator ... | head -1`: the reader goes away; no complaint, the shell's status."""
    for module, args in (
        ("aggregator.cli", ["check-config", str(survey_file)]),
        ("client.cli", ["--help"]),
    ):
        process = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        process.stdout.close()  # the reader is gone before the first line is written
        assert process.wait(timeout=60) in (141, 0) and process.stderr.read() == b""


def test_client_user_errors(live_server, tmp_path):
    server, _, _ = live_server
    state = ["--server", server, "--insecure", "--state", str(tmp_path / "d.sqlite")]
    assert_user_error(
        run(
            "client",
            "submit",
            *state,
            "--survey",
            "nope",
            "--question",
            "rr",
            "--answer",
            "a",
            "--budget",
            "5",
            check=False,
        ),
        2,
        "NOT_FOUND",
    )
    assert_user_error(
        run(
            "client",
            "submit",
            *state,
            "--survey",
            "s1",
            "--question",
            "rr",
            "--answer",
            "zebra",
            "--budget",
            "5",
            check=False,
        ),
        2,
        "zebra",
    )
    assert_user_error(
        run("client", "budget", "--state", str(tmp_path / "x.sqlite"), check=False),
        2,
        "does not exist",
    )
    assert_user_error(
        run(
            "client",
            "submit",
            "--server",
            server,
            "--insecure",
            "--state",
            str(tmp_path / "n.sqlite"),
            "--survey",
            "s1",
            "--question",
            "rr",
            "--answer",
            "a",
            "--budget",
            "-1",
            check=False,
        ),
        2,
        "epsilon",
    )
    assert_user_error(
        run(
            "client",
            "simulate",
            "--server",
            server,
            "--insecure",
            "--survey",
            "s1",
            "--devices",
            "5",
            "--truth",
            "rr=0.5,0.5",
            check=False,
        ),
        2,
        "rr",
    )
