"""Explore, then confirm: SparseValidate's levels and stopping rule (privacy-accounting spec C.6,
with its numeric examples), preregistered plans and the confirmatory family run once with Holm or
Bonferroni."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

from aggregator.confirm.family import run_family
from aggregator.confirm.plan import parse_plan
from aggregator.confirm.sparse_validate import (
    HoldoutClosedError,
    SparseValidate,
    histories,
    level,
)
from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats import goodness_of_fit, holm
from aggregator.survey_file.config import ConfigError, load_surveys

SURVEY = """
[[survey]]
id = "panel"
min_batch_size = 100

[[survey.question]]
id = "mood"
categories = ["great", "fine", "low", "bad"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.question]]
id = "table"
mechanism = "randomized_response"
epsilon = 2.0
attributes = [
    { name = "a", categories = ["x", "y"] },
    { name = "b", categories = ["u", "v", "w"] },
]
"""

PLAN = """survey = "panel"
alpha = 0.05
multiplicity = "holm"

[[test]]
title = "mood uniform"
question = "mood"
test = "goodness_of_fit"
p0 = [0.25, 0.25, 0.25, 0.25]

[[test]]
title = "mood skewed"
question = "mood"
test = "goodness_of_fit"
p0 = [0.4, 0.3, 0.2, 0.1]

[[test]]
question = "table"
test = "independence"
"""


@pytest.fixture
def surveys(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SURVEY)
    return load_surveys(path)


@pytest.mark.parametrize(
    ("m", "budget", "last_level"), [(20, 1, 1.2e-4), (20, 3, 1.9e-6), (50, 2, 7.8e-7)]
)
def test_levels_match_the_spec_examples(m, budget, last_level):
    assert level(m, m, budget, 0.05) == pytest.approx(last_level, rel=0.03)


@pytest.mark.parametrize(("m", "budget"), [(1, 1), (10, 1), (20, 3), (50, 2), (30, 30)])
def test_the_family_wise_bound_sums_to_alpha(m, budget):
    total = math.fsum(histories(i, budget) * level(i, m, budget, 0.05) for i in range(1, m + 1))
    assert total == pytest.approx(0.05, rel=1e-12)
    assert histories(1, budget) == 1 and histories(m, budget) <= m**budget + 1


def test_holdout_stops_after_its_budget_of_rejections():
    holdout = SparseValidate(alpha=0.05, m=10, budget=2)
    first = holdout.record(reject=False)
    assert first == pytest.approx(0.005)  # l_1 = 1: alpha / m
    holdout.record(reject=True)
    assert not holdout.closed and "query 2 of at most 10" in holdout.guarantee()
    holdout.record(reject=True)
    assert holdout.closed
    with pytest.raises(HoldoutClosedError, match="budget of 2 rejections"):
        holdout.next_level()


def test_holdout_stops_after_m_queries():
    holdout = SparseValidate(alpha=0.05, m=3, budget=5)
    levels = [holdout.record(reject=False) for _ in range(3)]
    assert levels[0] > levels[1] > levels[2]
    with pytest.raises(HoldoutClosedError, match="answered its 3 queries"):
        holdout.record(reject=False)
    assert SparseValidate(**holdout.to_dict()).closed  # the state round-trips


@pytest.mark.parametrize(
    "kwargs",
    [{"alpha": 0.0}, {"alpha": float("nan")}, {"m": 0}, {"budget": 1.5}, {"answered": -1}],
)
def test_impossible_holdouts_are_typed_errors(kwargs):
    with pytest.raises(InvalidInputError):
        SparseValidate(**{"alpha": 0.05, "m": 5, "budget": 1, **kwargs})


def test_a_plan_is_identified_by_the_hash_of_its_bytes(surveys):
    plan = parse_plan(PLAN, surveys)
    assert plan.sha256 == hashlib.sha256(PLAN.encode()).hexdigest()
    assert [t.title for t in plan.tests] == ["mood uniform", "mood skewed", "independence: table"]
    assert parse_plan(PLAN + "\n", surveys).sha256 != plan.sha256


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (('test = "independence"\n', 'test = "independence"\nalpha = 0.01\n'), "unknown key"),
        (('survey = "panel"', 'survey = "other"'), "must name a survey"),
        (('multiplicity = "holm"', 'multiplicity = "fdr"'), "multiplicity must be one of"),
        (("alpha = 0.05", "alpha = 5"), "alpha must be"),
        (("alpha = 0.05", "level = 0.05"), "unknown key"),
    ],
)
def test_a_wrong_plan_is_refused_with_its_place(surveys, edit, message):
    with pytest.raises(ConfigError, match=message):
        parse_plan(PLAN.replace(*edit), surveys)
    with pytest.raises(ConfigError, match="at least one"):
        parse_plan('survey = "panel"\n', surveys)


def simulate(question, p, n, seed):
    rng = np.random.default_rng(seed)
    answers = rng.choice(question.k, size=n, p=p)
    return Histogram.from_reports(question.mechanism, question.mechanism.simulate(answers, rng))


@pytest.mark.parametrize("multiplicity", ["holm", "bonferroni"])
def test_the_family_runs_once_with_adjusted_decisions(surveys, multiplicity):
    survey = surveys["panel"]
    plan = parse_plan(PLAN.replace('"holm"', f'"{multiplicity}"'), surveys)
    hists = {
        ("mood", ""): simulate(survey.question("mood"), np.array([0.4, 0.3, 0.2, 0.1]), 3_000, 1),
        ("table", ""): simulate(survey.question("table"), np.full(6, 1 / 6), 3_000, 2),
    }
    sealed = run_family(plan, survey, hists)
    assert sealed["plan_sha256"] == plan.sha256 and sealed["plan"] == PLAN.replace(
        '"holm"', f'"{multiplicity}"'
    )
    raw = np.array([r["pvalue"] for r in sealed["results"]])
    expected = goodness_of_fit(hists["mood", ""], np.full(4, 0.25), rng=0).pvalue
    assert raw[0] == pytest.approx(expected)
    adjusted = holm(raw, 0.05).adjusted if multiplicity == "holm" else np.minimum(3 * raw, 1.0)
    np.testing.assert_allclose([r["adjusted"] for r in sealed["results"]], adjusted)
    assert [r["reject"] for r in sealed["results"]] == list(adjusted <= 0.05)
    assert sealed["results"][0]["reject"]  # mood is far from uniform


def test_a_family_with_a_test_that_cannot_run_is_not_run(surveys):
    survey = surveys["panel"]
    plan = parse_plan(PLAN, surveys)
    hists = {("mood", ""): simulate(survey.question("mood"), np.full(4, 0.25), 500, 3)}
    with pytest.raises(InsufficientDataError, match="no confirmation reports for 'table'"):
        run_family(plan, survey, hists)
