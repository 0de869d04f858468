"""The confirmation side's report and labels (docs/adaptive-analysis.md, docs/reports.md): after
sealing, `report --side confirmation` leads with the sealed family as `confirm` sealed it, and
every other confirmation-side result (the report's estimates and declared tests, `estimate`,
`test`, `two-sample`, `k-sample`, `ordinal`, `conditional`, the Analyst RPCs) is labelled not
preregistered; on real SQLite, over real gRPC."""

from __future__ import annotations

import json
import os
import re
from html import unescape

import grpc
import numpy as np
import pytest
from cli_runner import run_cli
from conftest import ServerThread

from aggregator.confirm.labels import NOT_PREREGISTERED
from aggregator.report.sentences import p_text
from aggregator.service.server.app import open_store
from aggregator.store import ingest
from aggregator.survey_file.config import load_surveys
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

CONFIG = """
[[survey]]
id = "split"
min_batch_size = 20
exploration_fraction = 0.5

[[survey.question]]
id = "mood"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 2.0
ordinal = true

[[survey.question]]
id = "pair"
mechanism = "randomized_response"
epsilon = 2.0
attributes = [
    { name = "x", categories = ["x0", "x1"] },
    { name = "y", categories = ["y0", "y1"] },
]

[[survey.analysis]]
title = "mood is uniform (survey file)"
question = "mood"
test = "goodness_of_fit"
p0 = "uniform"
"""
PLAN = """survey = "split"
alpha = 0.05

[[test]]
title = "mood is not uniform"
question = "mood"
test = "goodness_of_fit"
p0 = [0.25, 0.25, 0.25, 0.25]

[[test]]
title = "x and y are dependent"
question = "pair"
test = "independence"

[[test]]
title = "mood is not the pilot's"
question = "mood"
test = "goodness_of_fit"
p0 = [0.4, 0.3, 0.2, 0.1]
"""
TRUTH = {"mood": [0.4, 0.3, 0.2, 0.1], "pair": [0.4, 0.1, 0.1, 0.4]}
LABEL = "not preregistered"
SEALED_HEADING = "Confirmatory results (sealed)"


def fill(config, db) -> None:
    """800 reports of each question on each side, stored as a server would store them."""
    surveys = load_surveys(config)
    rng = np.random.default_rng(3)
    batch = []
    for side in (ldp_pb2.EXPLORATION, ldp_pb2.CONFIRMATION):
        for question_id, truth in TRUTH.items():
            mech = surveys["split"].question(question_id).mechanism
            values = mech.simulate(rng.choice(len(truth), size=800, p=truth), rng)
            batch += [
                ldp_pb2.Report(
                    report_id=os.urandom(16),
                    survey_id="split",
                    question_id=question_id,
                    payload=mech.encode(v),
                    side=side,
                )
                for v in values
            ]
    store = open_store(surveys, str(db))
    try:
        store.submit_batches(ingest.validate_upload(batch, surveys).batches).result()
    finally:
        store.close()


@pytest.fixture
def sealed(tmp_path):
    """A split survey whose plan is registered and sealed: (common options, sealed record)."""
    config, db, plan = tmp_path / "s.toml", tmp_path / "r.sqlite", tmp_path / "plan.toml"
    config.write_text(CONFIG)
    plan.write_text(PLAN)
    fill(config, db)
    common = ("--config", config, "--db", db, "--survey", "split")
    run_cli("agg", "preregister", *common, "--plan", plan, check=True)
    record = json.loads(run_cli("agg", "confirm", *common, "--json", check=True).stdout)
    return common, record


def expected_rows(record: dict) -> list[list[str]]:
    """The sealed record's tests as the report's table cells: title, question, n, statistic,
    p, adjusted p, decision."""
    return [
        [
            r["title"],
            r["question_id"],
            f"{r['n']:,}",
            f"{r['statistic']:.4f}",
            p_text(r["pvalue"]),
            p_text(r["adjusted"]),
            "reject H0" if r["reject"] else "do not reject H0",
        ]
        for r in record["results"]
    ]


def test_the_markdown_report_leads_with_the_sealed_family(tmp_path, sealed):
    common, record = sealed
    assert record["multiplicity"] == "holm" and len(record["results"]) == 3
    out = tmp_path / "confirmation.md"
    run_cli("agg", "report", *common, "--side", "confirmation", "--out", out, "--format", "md",
            check=True)  # fmt: skip
    text = out.read_text()
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings == [SEALED_HEADING, "mood", "pair"]
    sealed_part = text.split("## mood")[0]
    assert record["plan_sha256"] in sealed_part and record["sealed_at"] in sealed_part
    assert "Holm adjusted" in sealed_part and "family-wise α = 0.05" in sealed_part
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in sealed_part.splitlines()
        if line.startswith("| ") and not line.startswith("| test ")
    ]
    assert rows == expected_rows(record)
    # Holm makes at least one adjusted p differ from its raw p: the table shows both.
    assert any(r["adjusted"] > r["pvalue"] for r in record["results"])

    questions = text.split("## mood", 1)[1]
    assert questions.count(f"*{NOT_PREREGISTERED}*") == 3  # mood, its declared test, pair
    assert "### mood is uniform (survey file)" in questions


def test_the_html_report_leads_with_the_sealed_family(tmp_path, sealed):
    common, record = sealed
    out = tmp_path / "confirmation.html"
    run_cli("agg", "report", *common, "--side", "confirmation", "--out", out, check=True)
    page = out.read_text()
    sections = re.findall(r'<section id="([^"]+)"', page)
    assert sections == ["confirmatory", "q-mood", "q-pair"]
    first = page.split('<section id="confirmatory">')[1].split("</section>")[0]
    assert record["plan_sha256"] in first
    body = first.split("<tbody>")[1]
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in body.split("</tr>") if "<td>" in row]
    assert [[unescape(cell) for cell in row] for row in rows] == expected_rows(record)
    questions = page.split('<section id="q-mood">')[1]
    assert questions.count(f'<p class="unplanned">{NOT_PREREGISTERED}</p>') == 3


def test_the_exploration_report_has_no_sealed_family_and_no_label(tmp_path, sealed):
    common, _ = sealed
    out = tmp_path / "exploration.md"
    run_cli("agg", "report", *common, "--out", out, "--format", "md", check=True)
    text = out.read_text()
    assert SEALED_HEADING not in text and LABEL not in text and "exploratory:" in text


def test_estimate_and_test_on_the_confirmation_side_are_labelled(sealed):
    common, _ = sealed
    mood = (*common, "--question", "mood", "--side", "confirmation")
    for command in (("estimate", *mood), ("test", *mood, "gof", "--p0", "uniform")):
        text = run_cli("agg", *command, check=True).stdout
        assert text.splitlines()[0] == NOT_PREREGISTERED
        data = json.loads(run_cli("agg", *command, "--json", check=True).stdout)
        assert data["not_preregistered"] is True and data["label"] == NOT_PREREGISTERED
        assert "exploratory" not in data
    explored = run_cli("agg", "estimate", *common, "--question", "mood", "--json", check=True)
    assert "not_preregistered" not in json.loads(explored.stdout)


@pytest.mark.parametrize(
    "command",
    [("ordinal", "--question", "mood"), ("conditional", "--question", "pair")],
    ids=["ordinal", "conditional"],
)
def test_summaries_on_the_confirmation_side_are_labelled(sealed, command):
    common, _ = sealed
    read = (command[0], *common, *command[1:], "--side", "confirmation")
    assert run_cli("agg", *read, check=True).stdout.splitlines()[0] == NOT_PREREGISTERED
    data = json.loads(run_cli("agg", *read, "--json", check=True).stdout)
    assert data["not_preregistered"] is True and "exploratory" not in data


def test_analyst_calls_on_the_confirmation_side_carry_the_label(tmp_path, sealed):
    server = ServerThread(tmp_path / "s.toml", tmp_path / "r.sqlite").start()
    try:
        analyst = ldp_pb2_grpc.AnalystStub(grpc.insecure_channel(server.analyst_target))
        for side, label in ((ldp_pb2.CONFIRMATION, LABEL), (ldp_pb2.EXPLORATION, "exploratory")):
            _, call = analyst.Estimate.with_call(
                ldp_pb2.EstimateRequest(survey_id="split", question_id="mood", side=side)
            )
            assert ("ldp-label", label) in tuple(call.trailing_metadata())
            _, call = analyst.GoodnessOfFit.with_call(
                ldp_pb2.GoodnessOfFitRequest(
                    survey_id="split", question_id="mood", p0=[0.25] * 4, side=side
                )
            )
            labels = [v for k, v in call.trailing_metadata() if k == "ldp-label"]
            assert labels == [label]
            _, call = analyst.Independence.with_call(
                ldp_pb2.IndependenceRequest(survey_id="split", question_id="pair", side=side)
            )
            assert ("ldp-label", label) in tuple(call.trailing_metadata())
    finally:
        server.stop()


def test_a_two_sample_test_on_the_confirmation_side_is_labelled(tmp_path):
    import confirm.test_group_confirm as grouped

    config, db, plan = tmp_path / "s.toml", tmp_path / "r.sqlite", tmp_path / "plan.toml"
    config.write_text(grouped.CONFIG)
    plan.write_text(grouped.PLAN)
    grouped.fill(config, db)
    common = ("--config", config, "--db", db, "--survey", "trial")
    run_cli("agg", "preregister", *common, "--plan", plan, check=True)
    run_cli("agg", "confirm", *common, check=True)
    two = ("two-sample", *common, "--question", "mood", "--groups", "control", "treatment")
    text = run_cli("agg", *two, "--side", "confirmation", check=True).stdout
    assert text.splitlines()[0] == NOT_PREREGISTERED
    data = json.loads(run_cli("agg", *two, "--side", "confirmation", "--json", check=True).stdout)
    assert data["not_preregistered"] is True and "exploratory" not in data
    explored = json.loads(run_cli("agg", *two, "--json", check=True).stdout)
    assert explored["exploratory"] is True and "not_preregistered" not in explored
    k = ("k-sample", *common, "--question", "mood", "--groups", "control", "treatment")
    text = run_cli("agg", *k, "--side", "confirmation", check=True).stdout
    assert text.splitlines()[0] == NOT_PREREGISTERED
    data = json.loads(run_cli("agg", *k, "--side", "confirmation", "--json", check=True).stdout)
    assert data["not_preregistered"] is True and "exploratory" not in data
