"""The see-and-plan commands as a user runs them, on a store filled over real gRPC: report (HTML
and Markdown), plan (figures equal aggregator.stats), backup and restore while serving."""

from __future__ import annotations

import json
import signal
import subprocess

import numpy as np
import pytest
from aggregator_process import spawn_serve
from cli_runner import run_cli

from aggregator.stats import sample_size
from client.mechanisms import RandomizedResponse

SURVEY = """
[[survey]]
id = "panel"
title = "Panel study"
min_batch_size = 300

[[survey.question]]
id = "mood"
categories = ["great", "fine", "low", "bad"]
mechanism = "randomized_response"
epsilon = 2.0

[[survey.question]]
id = "table"
mechanism = "randomized_response"
epsilon = 3.0
attributes = [
    { name = "smoker", categories = ["no", "yes"] },
    { name = "sport", categories = ["never", "weekly", "daily"] },
]

[[survey.analysis]]
title = "Is mood uniform?"
question = "mood"
test = "goodness_of_fit"
p0 = [0.25, 0.25, 0.25, 0.25]

[[survey.analysis]]
question = "table"
test = "independence"
"""


def run(tool: str, *args: str) -> subprocess.CompletedProcess:
    return run_cli(tool, *args)  # in this process (tests/cli_runner.py)


def one_line_error(done: subprocess.CompletedProcess, fragment: str) -> None:
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], done.stderr


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A store with 600 simulated devices' reports, uploaded to a real server, still serving."""
    folder = tmp_path_factory.mktemp("study")
    config = folder / "survey.toml"
    config.write_text(SURVEY)
    db = folder / "reports.sqlite"
    process, port = spawn_serve(
        folder / "port", "--config", str(config), "--db", str(db), "--insecure"
    )
    target = f"127.0.0.1:{port}"
    done = run(
        "client", "simulate", "--server", target, "--insecure", "--survey", "panel",
        "--devices", "600", "--seed", "1", "--truth", "mood=0.4,0.3,0.2,0.1", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    yield config, db, target
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)


def test_report_html_and_markdown(filled, tmp_path):
    config, db, _ = filled
    page = tmp_path / "report.html"
    done = run("agg", "report", "--config", str(config), "--db", str(db), "--out", str(page))
    assert done.returncode == 0, done.stderr
    html = page.read_text()
    assert html.count("<svg") == 1 + 1 + 2 and "Is mood uniform?" in html
    assert "n = 600" in html and "<script" not in html
    assert "The data are not consistent with the hypothesized distribution" in html
    markdown = tmp_path / "report.md"
    done = run(
        "agg", "report", "--config", str(config), "--db", str(db), "--out", str(markdown),
        "--format", "md",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = markdown.read_text()
    assert "## mood" in text and "## table" in text and "Marginal of smoker" in text


def test_report_mistakes_are_one_line(filled, tmp_path):
    config, db, _ = filled
    one_line_error(
        run("agg", "report", "--config", str(config), "--db", str(tmp_path / "none.sqlite"),
            "--out", str(tmp_path / "r.html")),
        "none.sqlite",
    )  # fmt: skip
    one_line_error(
        run("agg", "report", "--config", str(config), "--db", str(db), "--survey", "nope",
            "--out", str(tmp_path / "r.html")),
        "no survey 'nope'",
    )  # fmt: skip


def test_plan_figures_are_those_of_the_library():
    done = run(
        "agg", "plan", "--k", "5", "--epsilon", "1.5", "--mechanism", "randomized_response",
        "--alternative", "0.3,0.2,0.2,0.15,0.15", "--power", "0.9", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["rows"]
    expected = sample_size(
        RandomizedResponse(5, 1.5),
        np.array([0.3, 0.2, 0.2, 0.15, 0.15]),
        null=np.full(5, 0.2),
        power=0.9,
    )
    assert row["n"] == expected and row["method"] == "pearson"


@pytest.mark.slow
def test_plan_ranks_every_mechanism_and_draws_the_curves(tmp_path):
    plot = tmp_path / "power.png"
    done = run(
        "agg", "plan", "--shape", "2,3", "--epsilon", "2", "--effect", "0.1", "--n", "4000",
        "--plot", str(plot),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "independence at alpha = 0.05: power with n = 4,000 reports"
    powers = [float(line.split("power = ")[1].split()[0]) for line in lines[1:]]
    assert len(powers) == 8 and powers == sorted(powers, reverse=True)  # every mechanism
    assert plot.stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--k", "4", "--effect", "0.1", "--n", "100"], "needs --epsilon"),
        (["--k", "4", "--epsilon", "1", "--effect", "5", "--n", "100"], "effect size too large"),
        (["--k", "4", "--epsilon", "1", "--alternative", "0.5,0.5", "--n", "9"], "has 2"),
        (["--shape", "2", "--epsilon", "1", "--effect", "0.1", "--n", "9"], "--shape '2'"),
        (["--k", "4", "--mechanism", "gaussian", "--effect", "0.1", "--n", "9"], "--rho"),
        (["--k", "4", "--epsilon", "1", "--effect", "0.1", "--power", "1.5"], "power must be"),
        (["--k", "4", "--epsilon", "1", "--effect", "0.1"], "--n --power is required"),
    ],
)
def test_plan_mistakes_are_one_line(args, fragment):
    one_line_error(run("agg", "plan", *args), fragment)


def test_backup_while_serving_then_restore(filled, tmp_path):
    config, db, _ = filled
    before = run("agg", "estimate", "--config", str(config), "--db", str(db), "--survey",
                 "panel", "--question", "mood", "--json")  # fmt: skip
    assert before.returncode == 0, before.stderr
    backup = tmp_path / "backup"
    done = run("agg", "backup", "--db", str(db), "--out", str(backup), "--json")
    assert done.returncode == 0, done.stderr
    manifest = json.loads(done.stdout)
    assert manifest["reports"] == 1_200 and "reports.sqlite" in manifest["files"]

    restored = tmp_path / "restored" / "reports.sqlite"
    one_line_error(  # another place: the key that authenticated the backup is not beside it
        run("agg", "restore", "--from", str(backup), "--db", str(restored)), "pass --key FILE"
    )
    key = f"{db}.backup-key"
    done = run("agg", "restore", "--from", str(backup), "--db", str(restored), "--key", key)
    assert done.returncode == 0 and "restored 1,200 reports" in done.stdout, done.stderr
    after = run("agg", "estimate", "--config", str(config), "--db", str(restored), "--survey",
                "panel", "--question", "mood", "--json")  # fmt: skip
    assert json.loads(after.stdout)["frequencies"] == json.loads(before.stdout)["frequencies"]
    covariance = np.array(json.loads(before.stdout)["covariance"])  # for marginals, differences
    assert covariance.shape == (4, 4) and np.allclose(covariance, covariance.T)
    one_line_error(
        run("agg", "restore", "--from", str(backup), "--db", str(restored), "--key", key),
        "pass --force",
    )
    one_line_error(run("agg", "backup", "--db", str(db), "--out", str(backup)), "new or empty")


def test_check_config_checks_the_analysis_section(tmp_path):
    config = tmp_path / "typo.toml"
    config.write_text(SURVEY.replace("p0 = [0.25, 0.25, 0.25, 0.25]", "p00 = [0.25, 0.25]"))
    one_line_error(run("agg", "check-config", str(config)), "unknown key(s) p00")


def test_plan_names_a_bad_null_not_the_alternative_built_from_it():
    done = run("agg", "plan", "--p0", "0.5,0.6", "--epsilon", "1", "--effect", "0.1", "--n", "9")
    one_line_error(done, "--p0 must sum to 1")
