"""Conditional distributions and ordinal summaries (aggregator/stats/summaries.py), tested
statistically: coverage of the Fieller intervals of P(row | column) and of the mean-score
interval inside the 99% binomial band around the nominal level (or above it), the trend test's
Type I inside the band and its power beyond the omnibus homogeneity test's on an ordered shift,
agreement with the plain ratio where privacy is effectively off, and typed errors."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats import estimate, k_sample
from aggregator.stats.studies import RejectionRate, draw_histogram
from aggregator.stats.summaries import conditional, mean_score, score_trend
from client.mechanisms import FlipComponents, HadamardResponse, RandomizedResponse

JOINT = np.array([[0.30, 0.10, 0.05], [0.10, 0.15, 0.30]])  # smoker (rows) x age band (columns)


def coverage_band(hits: int, trials: int, nominal: float) -> bool:
    """At least the lower edge of the 99% binomial band around ``nominal``."""
    return hits >= stats.binom.ppf(0.005, trials, nominal)


@pytest.mark.parametrize(
    ("mech", "n"),
    [
        (RandomizedResponse(6, 2.0), 3000),
        (FlipComponents(6, 2.0), 3000),
        (HadamardResponse(6, 2.0), 6000),
    ],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_conditional_intervals_cover(mech, n):
    rng = np.random.default_rng(7)
    truth = JOINT / JOINT.sum(axis=0)  # P(smoker | age band)
    trials, hits = 300, np.zeros(truth.shape, dtype=int)
    for _ in range(trials):
        cond = conditional(estimate(draw_histogram(mech, JOINT.ravel(), n, rng)), (2, 3))
        hits += (cond.low <= truth) & (truth <= cond.high)
        assert np.all((cond.low >= 0) & (cond.low <= cond.high) & (cond.high <= 1))
    assert all(coverage_band(int(h), trials, 0.95) for h in hits.ravel()), hits / trials


def test_conditioning_on_rows_is_the_transpose_and_privacy_off_gives_the_plain_ratio():
    mech = RandomizedResponse(6, 30.0)  # keeps the answer with probability 1 - 5e-13
    counts = (JOINT.ravel() * 10_000).round()
    hist = draw_histogram(mech, JOINT.ravel(), 10_000, np.random.default_rng(1))
    est = estimate(hist)
    by_row = conditional(est, (2, 3), given=0)
    joint = est.frequencies.reshape(2, 3)
    assert by_row.shares.shape == (3, 2)
    assert np.allclose(by_row.shares, (joint / joint.sum(axis=1, keepdims=True)).T)
    by_column = conditional(est, (2, 3))
    assert np.allclose(by_column.shares, joint / joint.sum(axis=0), atol=1e-12)
    assert counts.sum() == 10_000 and by_column.bounded.all()


def test_a_condition_with_no_reports_has_the_whole_unit_interval():
    mech = RandomizedResponse(6, 0.5)
    p = np.array([[0.5, 0.0, 0.2], [0.3, 0.0, 0.0]]).ravel()
    cond = conditional(estimate(draw_histogram(mech, p, 300, np.random.default_rng(3))), (2, 3))
    assert not cond.bounded[1]
    assert np.all(cond.low[:, 1] == 0) and np.all(cond.high[:, 1] == 1)


def test_mean_score_interval_covers():
    mech = RandomizedResponse(5, 1.0)
    p = np.array([0.1, 0.2, 0.3, 0.25, 0.15])
    truth = float(np.arange(1, 6) @ p)
    rng = np.random.default_rng(11)
    trials = 400
    hits = sum(
        (m := mean_score(estimate(draw_histogram(mech, p, 400, rng)))).low <= truth <= m.high
        for _ in range(trials)
    )
    assert coverage_band(hits, trials, 0.95), hits / trials
    scored = mean_score(estimate(draw_histogram(mech, p, 400, rng)), scores=[0, 25, 50, 75, 100])
    assert 0 <= scored.low <= scored.mean <= scored.high <= 100


def test_trend_type1_inside_band_and_power_beyond_homogeneity():
    mech = RandomizedResponse(5, 1.0)
    p = np.array([0.1, 0.2, 0.3, 0.25, 0.15])
    shifted = np.array([0.07, 0.17, 0.3, 0.28, 0.18])  # a shift along the order
    rng = np.random.default_rng(19)
    null, trend_hits, omnibus_hits, trials = 0, 0, 0, 300
    for _ in range(trials):
        same = [draw_histogram(mech, p, 600, rng) for _ in range(3)]
        null += score_trend([estimate(h) for h in same]).reject
        moved = [draw_histogram(mech, q, 600, rng) for q in (p, p, shifted)]
        trend_hits += score_trend([estimate(h) for h in moved]).reject
        omnibus_hits += k_sample(moved, calibration="asymptotic").reject
    assert RejectionRate(null, trials).within_band(0.05), null / trials
    assert trend_hits > omnibus_hits, (trend_hits, omnibus_hits)


def test_a_single_report_gives_no_false_precision():
    """n = 1: the plug-in variance is 0, so no interval would be honest: the condition is not
    estimable ([0, 1]) and the mean score is refused."""
    one = estimate(Histogram(RandomizedResponse(6, 1.0), 1, [1, 0, 0, 0, 0, 0]))
    cond = conditional(one, (2, 3))
    assert not cond.bounded.any() and np.all(cond.low == 0) and np.all(cond.high == 1)
    with pytest.raises(InvalidInputError, match="plug-in variance of 0"):
        mean_score(estimate(Histogram(RandomizedResponse(5, 1.0), 1, [0, 0, 1, 0, 0])))


def test_typed_errors():
    est = estimate(
        draw_histogram(RandomizedResponse(6, 1.0), JOINT.ravel(), 500, np.random.default_rng(0))
    )
    with pytest.raises(InvalidInputError, match="does not match"):
        conditional(est, (2, 2))
    with pytest.raises(InvalidInputError, match="given"):
        conditional(est, (2, 3), given=2)
    with pytest.raises(InvalidInputError, match="6 finite numbers"):
        mean_score(est, scores=[1, 2, 3])
    with pytest.raises(InvalidInputError, match="all be equal"):
        mean_score(est, scores=[1] * 6)
    with pytest.raises(InvalidInputError, match="two or more"):
        score_trend([est])
    with pytest.raises(InvalidInputError, match="confidence"):
        mean_score(est, confidence=1.5)
