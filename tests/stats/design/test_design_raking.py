"""Raking (survey-design spec D.2): IPF reaches the margins, one margin is post-stratification,
per-key statistics give the same cells as the reports, raked intervals cover, and bad input is a
typed error. Agreement with R is tests/stats/design/test_design_raking_r.py."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.stats import post_stratified_estimate
from aggregator.stats.design.cells import Design, contributions, design_cells
from aggregator.stats.design.raking import (
    FrameKeys,
    RakingError,
    joint_domains,
    rake,
    raked_estimate,
    raking_cells,
)
from aggregator.stats.design.simulation import TwoStageSetting
from client.mechanisms import RandomizedResponse

RR = RandomizedResponse(k=3, epsilon=2.0)
SETTING = TwoStageSetting(
    shares=(0.6, 0.4),
    distributions=((0.5, 0.3, 0.2), (0.2, 0.3, 0.5)),
    psus=10,
    psu_size=20,
    concentration=20.0,
    weight_spread=0.3,
)
MARGINS = (np.array([600.0, 400.0]), np.array([300.0, 450.0, 250.0]))


def sample(seed: int):
    rng = np.random.default_rng(seed)
    drawn = SETTING.sample(RR, rng)
    n = len(drawn.answers)
    categories = np.column_stack([rng.integers(0, 2, n), rng.integers(0, 3, n)])
    return drawn, categories


def test_raking_reaches_every_margin():
    drawn, categories = sample(1)
    cells = design_cells(drawn.x_hat, drawn.design, joint_domains(categories, (2, 3)), 6)
    result = raked_estimate(cells, MARGINS)
    raked = (result.adjustment * cells.weight.sum(axis=0)).reshape(2, 3)
    np.testing.assert_allclose(raked.sum(axis=1), MARGINS[0], rtol=1e-9)
    np.testing.assert_allclose(raked.sum(axis=0), MARGINS[1], rtol=1e-9)
    assert result.estimate.sum() == pytest.approx(1.0)
    low, high = result.intervals()
    assert np.all(low < result.estimate) and np.all(result.estimate < high)


@pytest.mark.parametrize("method", ["linearization", "jackknife", "bootstrap"])
def test_one_margin_is_post_stratification(method):
    drawn, categories = sample(2)
    cells = design_cells(drawn.x_hat, drawn.design, categories[:, 1], 3)
    raked = raked_estimate(cells, [MARGINS[1]], method=method, replicates=50)
    post = post_stratified_estimate(cells, MARGINS[1], method=method, replicates=50)
    np.testing.assert_allclose(raked.estimate, post.estimate, rtol=1e-12)
    np.testing.assert_allclose(raked.covariance, post.covariance, rtol=1e-8, atol=1e-15)


def test_per_key_statistics_give_the_cells_of_the_reports():
    """A frame of keys (stratum x PSU x raking categories, one weight each): summing each key's
    contributions, then weighting, equals the cells of the reports themselves."""
    rng = np.random.default_rng(3)
    keys = 40
    fpc = np.full(keys, 20.0)
    frame = FrameKeys(
        strata=np.repeat([0, 1], keys // 2),
        psus=np.arange(keys) // 4,
        weights=rng.uniform(1, 5, keys),
        categories=np.column_stack([rng.integers(0, 2, keys), rng.integers(0, 3, keys)]),
        fpc=fpc,
    )
    key = rng.integers(0, keys - 1, 500)  # the last key has no reports
    x_hat = contributions(RR, RR.simulate(rng.integers(0, 3, 500), rng))
    count = np.bincount(key, minlength=keys).astype(float)
    total = np.zeros((keys, 3))
    square = np.zeros((keys, 3))
    np.add.at(total, key, x_hat)
    np.add.at(square, key, x_hat**2)
    mine = raking_cells(frame, (2, 3), count, total, square)
    design = Design(frame.strata[key], frame.psus[key], frame.weights[key], fpc[key])
    direct = design_cells(x_hat, design, joint_domains(frame.categories[key], (2, 3)), 6)
    for field in ("stratum", "sampling_fraction", "count", "weight", "weight_square"):
        np.testing.assert_allclose(getattr(mine, field), getattr(direct, field), rtol=1e-12)
    np.testing.assert_allclose(mine.total, direct.total, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mine.square, direct.square, rtol=1e-12)


def test_raked_intervals_cover_when_the_sample_is_unbalanced():
    """Raking variable b correlated with the answer and sampled out of proportion: the raked
    95 % intervals cover the population value (binomial 99 % band), the unraked estimate is
    biased."""
    rng = np.random.default_rng(4)
    trials, n = 300, 400
    truth_by_b = np.array([[0.6, 0.3, 0.1], [0.2, 0.3, 0.5]])
    population_b = np.array([0.5, 0.5])
    truth = population_b @ truth_by_b
    covered, unraked = 0, []
    for _ in range(trials):
        b = (rng.random(n) < 0.25).astype(int)  # b = 1 under-sampled
        a = rng.integers(0, 2, n)
        answers = np.array([rng.choice(3, p=truth_by_b[v]) for v in b])
        x_hat = contributions(RR, RR.simulate(answers, rng))
        domains = joint_domains(np.column_stack([a, b]), (2, 2))
        cells = design_cells(x_hat, Design.simple(n), domains, 4)
        result = raked_estimate(cells, [np.array([500.0, 500.0]), 1000 * population_b])
        low, high = result.intervals()
        covered += bool(low[0] <= truth[0] <= high[0])
        unraked.append(x_hat[:, 0].mean())
    band = stats.binom.interval(0.99, trials, 0.95)
    assert band[0] <= covered <= band[1]
    assert np.mean(unraked) - truth[0] > 0.05


@pytest.mark.parametrize(
    ("margins", "error", "text"),
    [
        ((np.array([1.0, 2.0]),), InvalidInputError, "6 domains"),
        ((np.array([1.0, 2.0]), np.array([1.0, 1.0, 2.0])), InvalidInputError, "totals differ"),
        ((np.array([3.0, 0.0]), np.array([1.0, 1.0, 1.0])), InvalidInputError, "positive"),
        ((), InvalidInputError, "at least one margin"),
    ],
)
def test_bad_margins_are_typed_errors(margins, error, text):
    drawn, categories = sample(5)
    cells = design_cells(drawn.x_hat, drawn.design, joint_domains(categories, (2, 3)), 6)
    with pytest.raises(error, match=text):
        raked_estimate(cells, margins)


def test_an_empty_category_or_a_structural_zero_is_a_typed_error():
    with pytest.raises(InsufficientDataError, match="margin 1: category 2 has no reports"):
        rake(np.array([1.0, 1.0, 0.0, 1.0, 1.0, 0.0]), MARGINS)
    # only the diagonal of a 2 x 2 table: its margins must be equal, these are not
    with pytest.raises(RakingError, match="did not reach the margins"):
        rake(np.array([5.0, 0.0, 0.0, 5.0]), [np.array([1.0, 9.0]), np.array([9.0, 1.0])])
    with pytest.raises(InvalidInputError, match=r"categories must lie in 0\.\.1"):
        joint_domains(np.array([[0, 2]]), (3, 2))
    with pytest.raises(InvalidInputError, match="whole category indices"):
        joint_domains(np.array([[0.5, 1.0]]), (3, 2))


def test_bad_per_key_statistics_are_typed_errors():
    frame = FrameKeys(np.zeros(4), np.arange(4), np.ones(4), np.zeros((4, 1), dtype=int))
    good = (np.ones(4), np.zeros((4, 3)), np.zeros((4, 3)))
    with pytest.raises(InvalidInputError, match="one per frame key"):
        raking_cells(frame, (1,), np.ones(3), *good[1:])
    with pytest.raises(InvalidInputError, match="sums of squares"):
        raking_cells(frame, (1,), good[0], good[1], np.zeros((4, 2)))
    with pytest.raises(InvalidInputError, match="non-negative"):
        raking_cells(frame, (1,), -good[0], *good[1:])
