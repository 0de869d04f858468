"""Labels are labels (a Likert "2" is the category named 2, a position needs --index), and a
budget a newcomer can set (`ldp-aggregator cost` prints flags that pay for the survey exactly,
a refusal says which bucket is short and which flags would fit); --version and --help."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from aggregator_process import spawn_serve
from cli_runner import run_cli

from aggregator.store.sqlite.reader import StoreReader
from aggregator.survey_file.config import load_surveys
from client import __version__
from client.budgeting import survey_cost
from client.device.ledger import Budget, BudgetExceeded, Ledger
from client.survey import Attribute, SurveyError, build_question

LIKERT = """
[[survey]]
id = "panel"
min_batch_size = 1

[[survey.question]]
id = "agree"
categories = ["1", "2", "3", "4", "5"]
mechanism = "randomized_response"
epsilon = 40.0

[[survey.question]]
id = "hours"
categories = ["0", "1", "2", "3"]
mechanism = "gaussian"
rho = 0.5

[[survey.question]]
id = "mood"
categories = ["good", "bad"]
mechanism = "laplace"
epsilon = 1.5
"""


def run(tool: str, *args: str) -> subprocess.CompletedProcess:
    return run_cli(tool, *args)  # in this process (tests/cli_runner.py)


def test_a_label_is_a_label_and_an_index_is_explicit():
    likert = build_question(
        "q", "", [Attribute("q", ("1", "2", "3", "4", "5"))], "randomized_response", 1.0
    )
    assert likert.index("2") == 1  # the category named "2", not position 2
    assert likert.check_index(2) == 2
    with pytest.raises(SurveyError, match="category label"):
        likert.index(2)  # type: ignore[arg-type]
    with pytest.raises(SurveyError, match="valid labels: '1', '2', '3', '4', '5'"):
        likert.index("6")
    with pytest.raises(SurveyError, match="0 to 4"):
        likert.check_index(5)
    joint = build_question(
        "j",
        "",
        [Attribute("x", ("a", "b")), Attribute("y", ("1", "2", "3"))],
        "randomized_response",
        1.0,
    )
    assert joint.index("b|1") == 3 and joint.index(["b", "3"]) == 5
    with pytest.raises(SurveyError, match="one label per attribute"):
        joint.index("b")


def test_likert_answers_are_recorded_as_labels(tmp_path):
    config = tmp_path / "panel.toml"
    config.write_text(LIKERT)
    db, state = tmp_path / "reports.sqlite", tmp_path / "device.sqlite"
    process, port = spawn_serve(
        tmp_path / "port", "--config", str(config), "--db", str(db), "--insecure"
    )
    try:
        common = ["--server", f"127.0.0.1:{port}", "--insecure", "--state", str(state)]
        answer = ["--survey", "panel", "--question", "agree"]
        assert (
            run("client", "submit", *common, *answer, "--answer", "2", "--budget", "200").returncode
            == 0
        )
        other = [*common[:-1], str(tmp_path / "device2.sqlite"), "--budget", "200"]
        assert run("client", "submit", *other, *answer, "--index", "2").returncode == 0
        bad = run("client", "submit", *common, *answer, "--answer", "7")
        assert bad.returncode == 2 and "valid labels: '1', '2', '3', '4', '5'" in bad.stderr
        both = run("client", "submit", *common, *answer, "--answer", "2", "--index", "1")
        assert both.returncode == 2 and "not allowed with" in both.stderr
    finally:
        process.terminate()
        process.wait(timeout=20)
    with StoreReader(db) as reader:
        n, sums = reader.statistics("panel", "agree", 5)
    assert (n, sums.tolist()) == (2, [0, 1, 1, 0, 0])  # epsilon 40: "2" and index 2 ("3")
    question = [
        "--config",
        str(config),
        "--db",
        str(db),
        "--survey",
        "panel",
        "--question",
        "agree",
    ]
    nearly = "0.2,0.2,0.2,0.2,0.1999999995"  # sums to 1 - 5e-10: within the stated tolerance
    done = run("agg", "test", *question, "gof", "--p0", nearly)
    assert done.returncode == 0 and "-0.0000" not in done.stdout, done.stderr


def test_cost_prints_the_budget_that_pays_exactly(tmp_path):
    config = tmp_path / "panel.toml"
    config.write_text(LIKERT)
    done = run("agg", "cost", "--config", str(config), "--json")
    assert done.returncode == 0, done.stderr
    cost = json.loads(done.stdout)["panel"]
    assert cost["epsilon"] == pytest.approx(41.5) and cost["rho"] == pytest.approx(0.5)
    assert cost["flags"] == f"--budget {cost['budget']:g} --pointwise 41.5 --delta 1e-06"
    text = run("agg", "cost", "--config", str(config), "--survey", "panel").stdout
    assert "ldp-client submit ... --budget" in text and "rho 0.5" in text
    questions = list(load_surveys(config)["panel"].questions)
    fits = Budget(cost["budget"], 1e-6, cost["pointwise"])
    with Ledger(tmp_path / "fits.sqlite", fits) as ledger:
        for question in questions:
            ledger.charge(
                question.mechanism.cost,
                request_id="r",
                survey_id="panel",
                question_id=question.id,
                mechanism="m",
            )
    short = Budget(cost["budget"] - 0.01, 1e-6, cost["pointwise"])
    with (
        Ledger(tmp_path / "short.sqlite", short) as ledger,
        pytest.raises(BudgetExceeded, match="zCDP bucket"),
    ):
        for question in questions:
            ledger.charge(
                question.mechanism.cost,
                request_id="r",
                survey_id="panel",
                question_id=question.id,
                mechanism="m",
            )
    assert survey_cost(questions[:1]).flags == "--budget 40"  # pure only: no split needed


def test_a_refused_charge_says_which_bucket_and_which_flags_fit(tmp_path):
    config = tmp_path / "panel.toml"
    config.write_text(LIKERT)
    db, state = tmp_path / "reports.sqlite", tmp_path / "device.sqlite"
    process, port = spawn_serve(
        tmp_path / "port", "--config", str(config), "--db", str(db), "--insecure"
    )
    try:
        common = ["--server", f"127.0.0.1:{port}", "--insecure", "--state", str(state)]
        answer = ["--survey", "panel", "--question", "hours", "--answer", "1"]
        done = run("client", "submit", *common, *answer, "--budget", "50")  # pure: no zCDP share
    finally:
        process.terminate()
        process.wait(timeout=20)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    line = done.stderr.strip()
    assert "\n" not in line
    assert "zCDP bucket" in line and "--pointwise = --budget" in line
    assert "--budget 47.2566 --pointwise 41.5" in line, line


def test_version_and_help_show_defaults():
    for tool, prog in (("agg", "ldp-aggregator"), ("client", "ldp-client")):
        done = run(tool, "--version")
        assert done.returncode == 0 and done.stdout.strip() == f"{prog} {__version__}"
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'version = "{__version__}"' in pyproject
    serve = run("agg", "serve", "--help").stdout
    assert "(default: 50051)" in serve and "(default: 127.0.0.1)" in serve
    test = run("agg", "test", "--help").stdout
    assert "{gof,independence,homogeneity}" in test and "(default: 0.05)" in test
    submit = run("client", "submit", "--help").stdout
    assert "(default: 1e-06)" in submit and "--index" in submit


def test_check_config_and_its_one_line_errors(tmp_path):
    config = tmp_path / "panel.toml"
    config.write_text(LIKERT)
    done = run("agg", "check-config", str(config))
    assert done.returncode == 0 and "OK, 1 survey(s)" in done.stdout
    assert "agree: randomized_response, epsilon = 40, k = 5" in done.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text(LIKERT.replace("rho = 0.5", "epsilon = 0.5"))
    done = run("agg", "check-config", str(bad), "--json")
    assert done.returncode == 2 and "needs 'rho'" in json.loads(done.stderr)["error"]
    missing = run("agg", "check-config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_independence_refuses_p0_and_gof_speaks_of_categories(tmp_path):
    config = tmp_path / "panel.toml"
    config.write_text(LIKERT)
    db = tmp_path / "reports.sqlite"
    question = [
        "--config",
        str(config),
        "--db",
        str(db),
        "--survey",
        "panel",
        "--question",
        "agree",
    ]
    done = run("agg", "test", *question, "independence", "--p0", "0.5,0.5")
    assert done.returncode == 2 and "--p0 is for gof" in done.stderr


def test_method_help_lists_every_method_of_every_mechanism():
    from aggregator.cli.analysis import METHOD_HELP
    from aggregator.stats.composite import COMPOSITE_METHODS
    from aggregator.stats.gof import GOF_METHODS

    gof, independence = METHOD_HELP.split("independence:")
    for text, table in ((gof, GOF_METHODS), (independence, COMPOSITE_METHODS)):
        for mechanism, methods in table.items():
            listed = text.split(mechanism.name)[1].split(":")[1].split(";")[0].rstrip(". ")
            assert [m.strip() for m in listed.split(",")] == list(methods), mechanism.name


def test_estimate_table_shows_the_projection_beside_out_of_range_values():
    from aggregator.cli.analysis import estimate_table
    from aggregator.histogram import Histogram
    from aggregator.stats import estimate
    from client.mechanisms import RandomizedResponse

    mech = RandomizedResponse(k=4, epsilon=1.0)
    labels = ["great", "fine", "low", "bad"]
    odd = estimate_table(estimate(Histogram(mech, 3, [0, 2, 1, 0])), labels)
    assert "projected" in odd and "outside [0, 1]" in odd and "-0.0000" not in odd
    row = next(line for line in odd.splitlines() if line.strip().startswith("fine"))
    assert row.split()[-1] == "1.0000"  # the projection puts all mass on "fine"
    plain = estimate_table(estimate(Histogram(mech, 4000, [1000, 1000, 1000, 1000])), labels)
    assert "projected" not in plain and "-0.0000" not in plain
