"""A preregistered family on a survey with a sampling design (issue 36): the sealed tests are
design-based (Rao-Scott) by default and name the design; ``design = false`` runs one as a simple
random sample and the record says it ignores the design. The sealed p-values equal what
``test`` answers on the confirmation side once it is readable, over --db and --server alike,
and the holdout's query is design-based too."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from cli_runner import run_cli
from conftest import ServerThread
from service.collector.test_design_service import FRAME

from aggregator.analysis.design_answers import design_test
from aggregator.analysis.design_data import side_design_data
from aggregator.confirm.plan import parse_plan
from aggregator.confirm.run import holdout_answer
from aggregator.errors import InvalidInputError
from aggregator.stats.design.options import (
    DEFAULT_CORRECTION,
    DEFAULT_REPLICATES,
    DEFAULT_VARIANCE,
)
from aggregator.store import ingest
from aggregator.store.confirmations import DEFAULT_HOLDOUT
from aggregator.store.sqlite import confirmations
from aggregator.survey_file.analyses import EXPLORATORY
from aggregator.survey_file.config import ConfigError, load_surveys
from aggregator.survey_file.design import IGNORES_DESIGN
from protos.ldp.v1 import ldp_pb2

CONFIG = """
[[survey]]
id = "field"
min_batch_size = 40
exploration_fraction = 0.5
group_label = "region"
group_values = ["north", "south"]
design = { table = "frame.csv" }

[[survey.question]]
id = "rr"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 2.0

[[survey.question]]
id = "pair"
mechanism = "randomized_response"
epsilon = 3.0
attributes = [
    { name = "x", categories = ["x0", "x1"] },
    { name = "y", categories = ["y0", "y1"] },
]
"""
PLAN = """survey = "field"

[[test]]
title = "rr uniform, by design"
question = "rr"
test = "goodness_of_fit"
p0 = "uniform"

[[test]]
title = "rr uniform, ignoring the design"
question = "rr"
test = "goodness_of_fit"
p0 = "uniform"
design = false

[[test]]
title = "x and y independent"
question = "pair"
test = "independence"

[[test]]
title = "north and south alike"
question = "rr"
test = "two_sample"
groups = ["north", "south"]
"""


def _reports(survey, question_id: str, n: int, side: int, rng) -> list:
    """n reports on ``side``, answers clustered by PSU, every key of the frame in use."""
    question = survey.question(question_id)
    mech = question.mechanism
    keys = rng.choice(sorted(FRAME), size=n)
    tilt = {psu: rng.dirichlet(np.full(mech.k, 3.0)) for _, psu, _ in FRAME.values()}
    answers = np.array([rng.choice(mech.k, p=tilt[FRAME[key][1]]) for key in keys])
    return [
        ldp_pb2.Report(
            report_id=os.urandom(16),
            survey_id=survey.id,
            question_id=question_id,
            payload=mech.encode(value),
            side=side,
            group=str(rng.choice(["north", "south"])),
            design_key=str(key),
        )
        for value, key in zip(mech.simulate(answers, rng), keys, strict=True)
    ]


@pytest.fixture
def stores(tmp_path):
    """The survey file and two copies of one filled store (one sealed over --db, one served)."""
    lines = ["key,stratum,psu,weight"] + [f"{k},{s},{p},{w}" for k, (s, p, w) in FRAME.items()]
    (tmp_path / "frame.csv").write_text("\n".join(lines) + "\n")
    config = tmp_path / "surveys.toml"
    config.write_text(CONFIG)
    (tmp_path / "plan.toml").write_text(PLAN)
    surveys = load_surveys(config)
    rng = np.random.default_rng(36)
    batch = []
    for side in (ldp_pb2.EXPLORATION, ldp_pb2.CONFIRMATION):
        for question_id in ("rr", "pair"):
            batch += _reports(surveys["field"], question_id, 700, side, rng)
    db = tmp_path / "store.sqlite"
    from aggregator.cli.common import open_store

    store = open_store(surveys, db, config)
    try:
        store.submit_batches(ingest.validate_upload(batch, surveys).batches).result()
    finally:
        store.close()
    shutil.copy(db, tmp_path / "served.sqlite")
    return tmp_path, config, db


def _cli(*args: str) -> str:
    return run_cli("agg", *args, check=True).stdout


def test_the_sealed_family_is_design_based_unless_the_plan_opts_out(stores):
    root, config, db = stores
    where = ["--config", str(config), "--db", str(db), "--survey", "field"]
    _cli("preregister", *where, "--plan", str(root / "plan.toml"))
    record = json.loads(_cli("confirm", *where, "--json"))
    by, ignoring, independence, two = record["results"]
    assert by["design"] == "stratified cluster design: 3 strata, 18 PSUs, weights"
    assert "Rao-Scott" in by["method"] and "Rao-Scott" in independence["method"]
    assert "Rao-Scott" in two["method"] and two["groups"] == ["north", "south"]
    assert ignoring["design"] == IGNORES_DESIGN and "Rao-Scott" not in ignoring["method"]
    # the sealed p-values are those of `test` on the (now readable) confirmation side
    read = [*where, "--question", "rr", "--side", "confirmation", "--json"]
    design_gof = json.loads(_cli("test", *read, "gof", "--p0", "uniform"))
    srs_gof = json.loads(_cli("test", *read, "gof", "--p0", "uniform", "--ignore-design"))
    assert by["pvalue"] == pytest.approx(design_gof["pvalue"], rel=1e-12)
    assert by["statistic"] == pytest.approx(design_gof["statistic"], rel=1e-12)
    assert ignoring["pvalue"] == pytest.approx(srs_gof["pvalue"], rel=1e-12)
    assert by["pvalue"] != pytest.approx(ignoring["pvalue"], rel=1e-3)
    assert design_gof["not_preregistered"] is True  # the design answers carry the side's label
    explored = json.loads(_cli("estimate", *where, "--question", "rr", "--json"))
    assert explored["exploratory"] is True and "design" in explored
    text = _cli("estimate", *where, "--question", "rr").splitlines()
    assert text[0] == EXPLORATORY and text[1].startswith("design-based estimate")
    text = _cli("confirm", *where)
    assert "sealed earlier" in text and "design-based: stratified cluster design" in text
    assert IGNORES_DESIGN in text
    # over --server the same family seals to the same numbers
    served = ServerThread(config, root / "served.sqlite").start()
    try:
        remote = ["--server", served.analyst_target, "--survey", "field"]
        _cli("preregister", *remote, "--plan", str(root / "plan.toml"))
        over_server = json.loads(_cli("confirm", *remote, "--json"))
    finally:
        served.stop()
    for a, b in zip(record["results"], over_server["results"], strict=True):
        assert a == b


def test_a_plan_cannot_ask_for_a_design_the_survey_lacks(stores):
    root, config, db = stores
    plain = root / "plain.toml"
    plain.write_text(CONFIG.replace('design = { table = "frame.csv" }\n', ""))
    with pytest.raises(ConfigError, match="declares no sampling design"):
        parse_plan(PLAN.replace("design = false", "design = true"), load_surveys(plain))
    plan = root / "bad.toml"
    plan.write_text(PLAN.replace("design = false", 'design = "no"'))
    where = ["--config", str(config), "--db", str(db), "--survey", "field", "--plan", str(plan)]
    out = run_cli("agg", "preregister", *where)
    assert out.returncode == 2 and "design must be true or false" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_holdout_query_is_design_based(stores):
    _, config, db = stores
    surveys = load_surveys(config)
    survey = surveys["field"]
    snap = confirmations.snapshot(str(db), survey)
    designs = side_design_data(survey, snap.designs)
    held = {**DEFAULT_HOLDOUT, "answered": 0, "rejections": 0}
    query = (snap.histograms, "rr", "goodness_of_fit", [0.25] * 4, 0)
    with pytest.raises(InvalidInputError, match="design statistics"):
        holdout_answer(held, survey, *query)  # design-based by default: it needs them
    _, reject, level = holdout_answer(held, survey, *query, designs)
    data = designs["rr"]
    options = (DEFAULT_CORRECTION, DEFAULT_VARIANCE, DEFAULT_REPLICATES, 0)
    expected = design_test(data, "gof", np.full(4, 0.25), level, *options)
    assert reject == expected.reject
    holdout_answer(held, survey, *query, None, False)  # opted out: no design data needed
    where = ["--config", str(config), "--db", str(db), "--survey", "field", "--question", "rr"]
    first = _cli("holdout", *where, "gof", "--p0", "uniform")
    assert IGNORES_DESIGN not in first and "holdout query 1" in first
    second = _cli("holdout", *where, "gof", "--p0", "uniform", "--ignore-design")
    assert IGNORES_DESIGN in second and "holdout query 2" in second
