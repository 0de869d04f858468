"""``ldp-aggregator k-sample`` on a real SQLite store of a survey with three public groups: the
result equals the library's on the same histograms (text and JSON), and every user mistake is
one line with a non-zero exit."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from cli_runner import run_cli

from aggregator.cli.common import open_store
from aggregator.histogram import Histogram
from aggregator.stats import k_sample
from aggregator.store import ingest
from aggregator.survey_file.config import load_surveys
from protos.ldp.v1 import ldp_pb2

SURVEYS = """
[[survey]]
id = "clinics"
min_batch_size = 20
group_label = "clinic"
group_values = ["north", "south", "east", "west"]

[[survey.question]]
id = "smoker"
categories = ["never", "former", "current"]
mechanism = "randomized_response"
epsilon = 2.0

[[survey]]
id = "plain"
min_batch_size = 5

[[survey.question]]
id = "q"
categories = ["a", "b"]
mechanism = "randomized_response"
epsilon = 1.0
"""
TRUTH = {  # clinic -> (distribution, devices); west stays below min_batch_size
    "north": ([0.6, 0.25, 0.15], 700),
    "south": ([0.6, 0.25, 0.15], 600),
    "east": ([0.3, 0.3, 0.4], 650),
    "west": ([0.6, 0.25, 0.15], 5),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("k_sample")
    config = root / "surveys.toml"
    config.write_text(SURVEYS)
    db = root / "store.sqlite"
    surveys = load_surveys(config)
    survey = surveys["clinics"]
    question = survey.question("smoker")
    mech = question.mechanism
    rng = np.random.default_rng(41)
    local = {}
    writer = open_store(surveys, db, config)
    try:
        for clinic, (p, n) in TRUTH.items():
            randomized = mech.simulate(rng.choice(mech.k, size=n, p=p), rng)
            messages = [
                ldp_pb2.Report(
                    report_id=os.urandom(16),
                    survey_id="clinics",
                    question_id="smoker",
                    payload=mech.encode(r),
                    definition_digest=question.digest,
                    group=clinic,
                )
                for r in randomized
            ]
            writer.put(ingest.validate_batch(messages, surveys))
            local[clinic] = Histogram.from_reports(mech, randomized)
    finally:
        writer.close()
    return config, db, local


def k_sample_cli(store, *args: str):
    config, db, _ = store
    return run_cli("agg", "k-sample", "--config", str(config), "--db", str(db), *args)


def test_three_clinics_match_the_library_in_text_and_json(store):
    _, _, local = store
    groups = ["north", "south", "east"]
    library = k_sample([local[g] for g in groups], calibration="asymptotic")
    base = ["--survey", "clinics", "--question", "smoker", "--groups", *groups]
    done = k_sample_cli(store, *base, "--calibration", "asymptotic", "--json")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["statistic"] == pytest.approx(library.statistic)
    assert payload["pvalue"] == pytest.approx(library.pvalue)
    assert payload["dof"] == 4 and payload["reject"] is True
    assert payload["groups"] == [{"group": g, "n": TRUTH[g][1]} for g in groups]
    text = k_sample_cli(store, *base, "--calibration", "asymptotic")
    assert text.returncode == 0
    assert "across 3 groups: north (n = 700), south (n = 600), east (n = 650)" in text.stdout
    alike = k_sample_cli(
        store,
        "--survey",
        "clinics",
        "--question",
        "smoker",
        "--groups",
        "north",
        "south",
        "--json",
        "--seed",
        "1",
    )
    assert json.loads(alike.stdout)["n"] == 1300


@pytest.mark.parametrize(
    ("args", "status", "fragment"),
    [
        (["--survey", "clinics", "--question", "smoker"], 3, "clinic 'west'"),  # every group
        (["--survey", "plain", "--question", "q"], 2, "declares no group label"),
        (["--survey", "clinics", "--question", "smoker", "--groups", "north"], 2, "two or more"),
        (["--survey", "clinics", "--question", "smoker", "--groups", "north", "mars"], 2, "'mars'"),
        (["--survey", "clinics", "--question", "smoker", "--groups", "north", "north"], 2, "twice"),
        (["--survey", "nope", "--question", "smoker"], 2, "unknown survey"),
        (["--survey", "clinics", "--question", "nope", "--groups", "north", "south"], 2, "nope"),
    ],
)
def test_mistakes_are_one_line(store, args, status, fragment):
    done = k_sample_cli(store, *args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == status and len(lines) == 1 and fragment in lines[0], done.stderr
