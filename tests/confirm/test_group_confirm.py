"""A preregistered A/B comparison: a confirmatory plan (and a survey report) may declare a
two-sample test between two groups of the survey's public group label; it runs once on the
confirmation side, on real SQLite through ldp-aggregator's commands (docs/adaptive-analysis.md,
docs/two-sample.md)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from aggregator.analysis.survey_data import open_survey
from aggregator.cli import main
from aggregator.service.server.app import open_store
from aggregator.stats import two_sample
from aggregator.store import ingest
from aggregator.survey_file.analyses import parse_analysis
from aggregator.survey_file.config import ConfigError, load_surveys
from protos.ldp.v1 import ldp_pb2

CONFIG = """
[[survey]]
id = "trial"
min_batch_size = 50
exploration_fraction = 0.5
group_label = "arm"
group_values = ["control", "treatment", "pilot"]

[[survey.question]]
id = "mood"
categories = ["great", "fine", "low", "bad"]
mechanism = "randomized_response"
epsilon = 2.0

[[survey.analysis]]
question = "mood"
test = "two_sample"
groups = ["control", "treatment"]

[[survey.analysis]]
question = "mood"
test = "two_sample"
groups = ["control", "pilot"]
"""
PLAN = """survey = "trial"
alpha = 0.05

[[test]]
question = "mood"
test = "two_sample"
groups = ["control", "treatment"]

[[test]]
title = "Mood is not uniform"
question = "mood"
test = "goodness_of_fit"
p0 = "uniform"
"""
TRUTH = {"control": [0.25] * 4, "treatment": [0.45, 0.25, 0.2, 0.1], "pilot": [0.25] * 4}
SIZES = {"control": 900, "treatment": 900, "pilot": 20}  # the pilot is below min_batch_size


def fill(config, db) -> None:
    surveys = load_surveys(config)
    question = surveys["trial"].question("mood")
    mech, rng = question.mechanism, np.random.default_rng(8)
    batch = []
    for side in (ldp_pb2.EXPLORATION, ldp_pb2.CONFIRMATION):
        for group, p in TRUTH.items():
            values = mech.simulate(rng.choice(4, size=SIZES[group], p=p), rng)
            batch += [
                ldp_pb2.Report(
                    report_id=os.urandom(16),
                    survey_id="trial",
                    question_id="mood",
                    payload=mech.encode(v),
                    side=side,
                    group=group,
                )
                for v in values
            ]
    store = open_store(surveys, str(db))
    try:
        store.submit_batches(ingest.validate_upload(batch, surveys).batches).result()
    finally:
        store.close()


def cli(capsys, *args):
    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_a_preregistered_two_sample_by_group_runs_once_on_the_confirmation_side(tmp_path, capsys):
    config, db, plan = tmp_path / "s.toml", tmp_path / "r.sqlite", tmp_path / "plan.toml"
    config.write_text(CONFIG)
    plan.write_text(PLAN)
    fill(config, db)
    common = ("--config", str(config), "--db", str(db), "--survey", "trial")
    assert cli(capsys, "preregister", *common, "--plan", str(plan))[0] == 0
    status, out, _ = cli(capsys, "confirm", *common, "--json")
    assert status == 0, out
    record = json.loads(out)["results"]
    assert record[0]["groups"] == ["control", "treatment"] and "groups" not in record[1]
    assert record[0]["title"] == "two sample: mood, control vs treatment"
    sides = {g: open_survey(config, db, "trial", "confirmation", g)["mood"] for g in TRUTH}
    expected = two_sample(sides["control"].histogram, sides["treatment"].histogram, rng=0)
    assert record[0]["pvalue"] == pytest.approx(expected.pvalue)
    assert record[0]["n"] == 1800 and record[0]["reject"]
    # the pooled test sums the groups released (the pilot, below min_batch_size, is left out:
    # pooled minus control and treatment would be its counts)
    assert record[1]["n"] == 1800
    status, text, _ = cli(capsys, "confirm", *common)
    assert "two sample: mood, control vs treatment" in text and text.count("reject H0") >= 1


def test_the_survey_report_runs_declared_two_sample_tests(tmp_path, capsys):
    config, db, out = tmp_path / "s.toml", tmp_path / "r.sqlite", tmp_path / "report.md"
    config.write_text(CONFIG)
    fill(config, db)
    common = ("--config", str(config), "--db", str(db), "--survey", "trial")
    status, _, err = cli(capsys, "report", *common, "--out", str(out), "--format", "md")
    assert status == 0, err
    text = out.read_text()
    assert "The data show that control and treatment answered differently" in text
    assert "not run: pilot has 20 reports, results are released from 50" in text


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ({"groups": ["control"]}, "needs groups = [A, B]"),
        ({"groups": ["control", "placebo"]}, "unknown arm 'placebo'"),
        ({"groups": ["control", "control"]}, "twice"),
        ({"groups": ["control", "treatment"], "p0": "uniform"}, "only goodness_of_fit takes p0"),
        ({}, "needs groups"),
    ],
)
def test_declared_two_sample_mistakes_name_their_place(tmp_path, entry, fragment):
    config = tmp_path / "s.toml"
    config.write_text(CONFIG)
    survey = load_surveys(config)["trial"]
    with pytest.raises(ConfigError) as caught:
        parse_analysis({"question": "mood", "test": "two_sample", **entry}, survey, "plan test 1")
    assert str(caught.value).startswith("plan test 1:") and fragment in str(caught.value)


def test_groups_need_a_two_sample_test_and_a_labelled_survey(tmp_path):
    config = tmp_path / "s.toml"
    config.write_text(CONFIG)
    survey = load_surveys(config)["trial"]
    entry = {"question": "mood", "test": "goodness_of_fit", "p0": "uniform", "groups": ["a"]}
    with pytest.raises(ConfigError, match="only two_sample compares groups"):
        parse_analysis(entry, survey, "t")
    plain = tmp_path / "plain.toml"
    plain.write_text(CONFIG.split("[[survey.analysis]]")[0].replace('group_label = "arm"\n', ""))
    plain.write_text(
        plain.read_text().replace('group_values = ["control", "treatment", "pilot"]\n', "")
    )
    unlabelled = load_surveys(plain)["trial"]
    with pytest.raises(ConfigError, match="declares none"):
        parse_analysis(
            {"question": "mood", "test": "two_sample", "groups": ["a", "b"]}, unlabelled, "t"
        )
