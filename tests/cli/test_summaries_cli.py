"""``ldp-aggregator conditional`` and ``ordinal`` on a real SQLite store: the numbers equal the
library's on the same histograms, text and JSON, and each user mistake (a one-attribute
question, an unknown attribute, a question not declared ordinal, bad scores) is one line with a
non-zero exit."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from cli_runner import run_cli

from aggregator.cli.common import open_store
from aggregator.histogram import Histogram
from aggregator.stats import estimate
from aggregator.stats.summaries import conditional, mean_score, score_trend
from aggregator.store import ingest
from aggregator.survey_file.config import load_surveys
from protos.ldp.v1 import ldp_pb2

SURVEYS = """
[[survey]]
id = "health"
min_batch_size = 20
group_label = "clinic"
group_values = ["north", "south", "east"]

[[survey.question]]
id = "smoking"
mechanism = "randomized_response"
epsilon = 3.0
attributes = [
    { name = "smoker", categories = ["no", "yes"] },
    { name = "age", categories = ["18-39", "40-64", "65+"] },
]

[[survey.question]]
id = "mood"
categories = ["1", "2", "3", "4", "5"]
mechanism = "randomized_response"
epsilon = 2.0
scores = [0, 25, 50, 75, 100]

[[survey.question]]
id = "insured"
categories = ["no", "yes"]
mechanism = "randomized_response"
epsilon = 1.0
"""
SMOKING = np.array([0.30, 0.20, 0.15, 0.15, 0.10, 0.10])
MOOD = {
    "north": [0.1, 0.2, 0.4, 0.2, 0.1],
    "south": [0.1, 0.2, 0.4, 0.2, 0.1],
    "east": [0.05, 0.1, 0.3, 0.3, 0.25],
}


def upload(surveys, writer, question_id, p, n, group, rng) -> Histogram:
    survey = surveys["health"]
    question = survey.question(question_id)
    mech = question.mechanism
    randomized = mech.simulate(rng.choice(mech.k, size=n, p=p), rng)
    messages = [
        ldp_pb2.Report(
            report_id=os.urandom(16),
            survey_id="health",
            question_id=question_id,
            payload=mech.encode(r),
            definition_digest=question.digest,
            group=group,
        )
        for r in randomized
    ]
    writer.put(ingest.validate_batch(messages, surveys))
    return Histogram.from_reports(mech, randomized)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("summaries")
    config = root / "surveys.toml"
    config.write_text(SURVEYS)
    db = root / "store.sqlite"
    surveys = load_surveys(config)
    rng = np.random.default_rng(5)
    local = {}
    writer = open_store(surveys, db, config)
    try:
        for clinic, p in MOOD.items():
            local[("mood", clinic)] = upload(surveys, writer, "mood", p, 800, clinic, rng)
            local[("smoking", clinic)] = upload(
                surveys, writer, "smoking", SMOKING, 1000, clinic, rng
            )
            upload(surveys, writer, "insured", [0.3, 0.7], 100, clinic, rng)
    finally:
        writer.close()
    return config, db, local


def cli(store, command: str, *args: str):
    config, db, _ = store
    return run_cli(
        "agg", command, "--config", str(config), "--db", str(db), "--survey", "health", *args
    )


def test_conditional_matches_the_library(store):
    _, _, local = store
    done = cli(store, "conditional", "--question", "smoking", "--group", "north", "--json")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    library = conditional(estimate(local[("smoking", "north")]), (2, 3), given=1)
    assert payload["outcome"] == "smoker" and payload["given"] == "age"
    young = payload["conditional"][0]
    assert young["age"] == "18-39"
    assert young["shares"]["yes"]["share"] == pytest.approx(library.shares[1, 0])
    assert young["shares"]["yes"]["ci_low"] == pytest.approx(library.low[1, 0])
    by_smoker = cli(store, "conditional", "--question", "smoking", "--given", "smoker")
    assert by_smoker.returncode == 0
    assert "P(age | smoker) of smoking, n = 3000" in by_smoker.stdout
    assert "smoker = yes" in by_smoker.stdout and "Fieller" in by_smoker.stdout


def test_ordinal_mean_scores_and_trend_match_the_library(store):
    _, _, local = store
    groups = ["north", "south", "east"]
    done = cli(store, "ordinal", "--question", "mood", "--groups", *groups, "--json")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    scores = [0, 25, 50, 75, 100]
    estimates = [estimate(local[("mood", g)]) for g in groups]
    library = score_trend(estimates, scores)
    assert payload["scores"] == scores
    assert payload["trend"]["statistic"] == pytest.approx(library.statistic)
    assert payload["trend"]["reject"] is True and payload["trend"]["dof"] == 2
    north = mean_score(estimates[0], scores)
    assert payload["mean_scores"][0]["mean"] == pytest.approx(north.mean)
    text = cli(store, "ordinal", "--question", "mood")
    assert text.returncode == 0
    assert "mean score of health:mood (scores 0, 25, 50, 75, 100)" in text.stdout
    assert "all reports:" in text.stdout and "n = 2400" in text.stdout


@pytest.mark.parametrize(
    ("command", "args", "fragment"),
    [
        ("conditional", ["--question", "insured"], "two attributes"),
        ("conditional", ["--question", "smoking", "--given", "height"], "'height'"),
        ("ordinal", ["--question", "insured"], "not declared ordinal"),
        ("ordinal", ["--question", "mood", "--groups", "north", "mars"], "mars"),
    ],
)
def test_mistakes_are_one_line(store, command, args, fragment):
    done = cli(store, command, *args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and fragment in lines[0], done.stderr


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("scores = [1, 2, 3]", "5 finite numbers"),
        ("scores = [1, 1, 1, 1, 1]", "not all be equal"),
        ("ordinal = 'yes'", "true or false"),
    ],
)
def test_bad_scores_are_refused_by_the_survey_file(tmp_path, line, fragment):
    config = tmp_path / "s.toml"
    config.write_text(SURVEYS.replace("scores = [0, 25, 50, 75, 100]", line))
    done = run_cli("agg", "check-config", str(config))
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and fragment in lines[0], done.stderr
