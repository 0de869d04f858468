"""Study planning (aggregator.planning.study): its figures are exactly those of aggregator.stats,
its
alternatives have the effect size asked for, and its mistakes are typed errors."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.errors import InvalidInputError
from aggregator.planning.study import (
    interaction_alternative,
    plan_study,
    plot_power_curves,
    tilted_alternative,
)
from aggregator.stats import advise, power, sample_size
from client.mechanisms import FlipComponents, GaussianNoise, RandomizedResponse

P0 = np.full(5, 0.2)


def cohen_w(p1: np.ndarray, p0: np.ndarray) -> float:
    return float(np.sqrt(np.sum((p1 - p0) ** 2 / p0)))


@pytest.mark.parametrize("null", [P0, np.array([0.4, 0.3, 0.2, 0.07, 0.03])])
def test_tilted_alternative_has_the_effect_size_asked_for(null):
    alternative = tilted_alternative(null, 0.15)
    assert alternative.sum() == pytest.approx(1.0) and (alternative >= 0).all()
    assert cohen_w(alternative, null) == pytest.approx(0.15)


def test_too_large_an_effect_names_the_largest_possible():
    with pytest.raises(InvalidInputError, match=r"at most 1 keeps"):
        tilted_alternative(np.array([0.5, 0.5]), 2.0)
    largest = tilted_alternative(np.array([0.5, 0.5]), 1.0)
    assert largest.min() >= 0
    with pytest.raises(InvalidInputError, match="positive"):
        tilted_alternative(P0, float("nan"))


def test_interaction_alternative_keeps_uniform_marginals():
    table = interaction_alternative((3, 4), 0.2).reshape(3, 4)
    np.testing.assert_allclose(table.sum(axis=1), np.full(3, 1 / 3))
    np.testing.assert_allclose(table.sum(axis=0), np.full(4, 1 / 4))
    assert cohen_w(table.ravel(), np.full(12, 1 / 12)) == pytest.approx(0.2)


def test_ranked_power_at_n_is_the_advisor_s():
    alternative = tilted_alternative(P0, 0.1)
    plan = plan_study(k=5, epsilon=1.0, alternative=alternative, null=P0, n=3_000)
    advised = advise(5, 1.0, alternative, 3_000, null=P0)
    assert [r.mechanism.describe() for r in plan.rows] == [a.mechanism.describe() for a in advised]
    for row, advice in zip(plan.rows, advised, strict=True):
        assert row.power == pytest.approx(advice.power, rel=1e-12) and row.n == 3_000
        assert row.method == advice.method
    assert "power with n = 3,000 reports" in plan.summary()


def test_sample_sizes_are_those_of_sample_size_best_first():
    alternative = tilted_alternative(P0, 0.1)
    plan = plan_study(k=5, epsilon=2.0, alternative=alternative, null=P0, target_power=0.9)
    assert [row.n for row in plan.rows] == sorted(row.n for row in plan.rows)
    for row in plan.rows:
        expected = sample_size(row.mechanism, alternative, null=P0, power=0.9, method=row.method)
        assert row.n == expected and row.power == 0.9
    json_rows = plan.to_dict()["rows"]
    assert json_rows[0]["n"] == plan.rows[0].n and plan.to_dict()["target_power"] == 0.9


def test_one_given_mechanism_and_independence():
    alternative = interaction_alternative((2, 3), 0.15)
    rr = RandomizedResponse(6, 1.5)
    plan = plan_study(
        k=6, epsilon=1.5, alternative=alternative, shape=(2, 3), mechanisms=[rr], n=5_000
    )
    (row,) = plan.rows
    assert row.power == pytest.approx(power(rr, alternative, 5_000, shape=(2, 3)), rel=1e-12)
    assert row.method == "min-chi-square" and plan.test == "independence"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"null": P0, "n": 10, "target_power": 0.8}, "either n"),
        ({"null": P0}, "either n"),
        ({"n": 100}, "either null"),
        ({"null": P0, "shape": (1, 5), "n": 100}, "either null"),
        ({"null": np.full(4, 0.25), "n": 100}, "each of the 5 categories, got 4"),
    ],
)
def test_planning_mistakes_are_typed_errors(kwargs, message):
    with pytest.raises(InvalidInputError, match=message):
        plan_study(k=5, epsilon=1.0, alternative=tilted_alternative(P0, 0.1), **kwargs)


def test_power_curves_are_drawn(tmp_path):
    from matplotlib.image import imread

    alternative = tilted_alternative(P0, 0.1)
    mechanisms = [RandomizedResponse(5, 1.0), FlipComponents(5, 1.0), GaussianNoise(5, 0.5)]
    plan = plan_study(
        k=5, epsilon=1.0, alternative=alternative, null=P0, mechanisms=mechanisms, target_power=0.8
    )
    path = tmp_path / "power.png"
    plot_power_curves(plan, path)
    pixels = imread(path)
    assert pixels.shape[0] > 200 and (pixels[..., :3] < 0.5).any()
    svg = tmp_path / "power.svg"
    plot_power_curves(plan, svg)
    assert svg.read_text().count("<path") > 10
