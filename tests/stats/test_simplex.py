"""Estimates on the simplex (issue 25 item 2): the projected estimate is a distribution no farther
from the truth than the unbiased one, every interval lies inside [0, 1] with positive width, even
for a count below what an empty category gives, and the intervals keep their coverage at small n
and at sparse large k (fixed seeds, binomial bands; the larger run is marked slow)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats import estimate
from aggregator.stats.simplex import boundary_limits, inside_unit
from client.mechanisms import (
    FlipComponents,
    GaussianNoise,
    HadamardResponse,
    LaplaceNoise,
    LocalHashing,
    OptimizedUnaryEncoding,
    PublicCoinBit,
    RandomizedResponse,
    SubsetSelection,
)

FLOOR = 0.93  # the coverage each category must keep (issue 25)


def families(k: int, epsilon: float) -> list:
    """One mechanism of every family with per-category estimates."""
    return [
        RandomizedResponse(k=k, epsilon=epsilon),
        FlipComponents(k=k, epsilon=epsilon),
        GaussianNoise(k=k, rho=epsilon**2 / 2),
        LaplaceNoise(k=k, epsilon=epsilon),
        OptimizedUnaryEncoding(k=k, epsilon=epsilon),
        HadamardResponse(k=k, epsilon=epsilon),
        SubsetSelection(k=k, epsilon=epsilon),
        LocalHashing(k=k, epsilon=epsilon),
    ]


def zipf_sparse(k: int) -> np.ndarray:
    """Zipf(1.1) on the first k / 10 categories, zero on the other nine tenths."""
    p = np.zeros(k)
    p[: k // 10] = 1 / np.arange(1, k // 10 + 1) ** 1.1
    return p / p.sum()


def below_expected(mech, n: int) -> Histogram:
    """A histogram whose category 1 lies five standard errors below what p_1 = 0 gives (the
    case of issue 25: an unbiased interval wholly below zero)."""
    p = np.full(mech.k, 1 / mech.k)
    p[1] = 0.0
    p /= p.sum()
    values = n * mech.report_mean(p)
    if mech.statistic_kind in ("counts", "bits", "support"):
        q = mech.offset
        values = np.round(values)
        values[1] = np.floor(n * q - 5 * np.sqrt(n * q * (1 - q)))
        if mech.statistic_kind == "counts":  # one category per report: the counts sum to n
            values[0] += n - values.sum()
    else:
        values[1] = -5 * np.sqrt(n * mech.noise_variance)
    return Histogram(mech, n, values)


@pytest.mark.parametrize("mech", families(8, 1.0), ids=lambda m: m.name)
def test_no_interval_lies_outside_the_unit_interval(mech):
    hist = below_expected(mech, 5_000)
    for estimator in ("unbiased", "simplex"):
        est = estimate(hist, estimator=estimator, simultaneous=True)
        assert est.unbiased_frequencies[1] < 0 and est.outside[1]
        assert est.simultaneous_low is not None and est.simultaneous_high is not None
        for low, high in ((est.ci_low, est.ci_high), (est.simultaneous_low, est.simultaneous_high)):
            assert ((low >= 0) & (low < high) & (high <= 1)).all(), (estimator, low, high)
            assert low[1] == 0 and high[1] > 0
        assert est.estimator == estimator and est.to_dict()["estimator"] == estimator
    simplex = estimate(hist, estimator="simplex")
    assert (simplex.frequencies >= 0).all() and simplex.frequencies.sum() == pytest.approx(1)
    shown = simplex.frequencies
    assert ((simplex.ci_low <= shown) & (shown <= simplex.ci_high)).all()
    np.testing.assert_array_equal(simplex.unbiased_frequencies, estimate(hist).frequencies)


def test_the_boundary_widening_only_widens_and_shrinks_with_the_count():
    """[low, high] & [0, 1] is kept whole; the upper end at zero falls as x falls, stays > 0."""
    rng = np.random.default_rng(3)
    x = rng.normal(0.0, 0.05, 2_000)
    low, high = x - 0.04, x + 0.04
    v = np.full(x.size, 0.02**2)
    new_low, new_high = inside_unit(low, high, x, 1.96, v, v)
    assert ((new_low >= 0) & (new_low < new_high) & (new_high <= 1)).all()
    cut_low, cut_high = np.clip(low, 0, 1), np.clip(high, 0, 1)
    nonempty = cut_low < cut_high
    assert (new_low[nonempty] <= cut_low[nonempty]).all()
    assert (new_high[nonempty] >= cut_high[nonempty]).all()
    falling = np.linspace(0.0, -1.0, 50)
    _, upper = boundary_limits(falling, 1.96, np.full(50, 1e-4), np.full(50, 1e-4))
    assert (np.diff(upper) < 0).all() and (upper > 0).all()
    assert upper[0] == pytest.approx(1.96 * 0.01)


def test_the_projection_is_never_farther_from_the_truth():
    """For every draw, not on average: the truth is in the simplex, a convex set."""
    mech, n = HadamardResponse(k=200, epsilon=1.0), 2_000
    p = zipf_sparse(200)
    for values in mech.simulate_histogram(n, p, np.random.default_rng(5), size=50):
        est = estimate(Histogram(mech, n, values), estimator="simplex")
        assert (est.frequencies >= 0).all() and est.frequencies.sum() == pytest.approx(1)
        error = np.linalg.norm(est.frequencies - p)
        assert error <= np.linalg.norm(est.unbiased_frequencies - p) + 1e-12


def test_the_estimator_is_named_everywhere():
    hist = Histogram(RandomizedResponse(k=4, epsilon=1.0), 200, np.array([90, 30, 30, 50]))
    est = estimate(hist, estimator="simplex").with_labels(["a", "b", "c", "d"])
    assert "estimator: simplex" in est.summary() and "shifted by" in est.summary()
    assert "estimator: simplex" in est._repr_html_() and "<th>unbiased</th>" in est._repr_html_()
    assert est.to_dict()["unbiased"] == estimate(hist).frequencies.tolist()
    assert "estimator: unbiased" in estimate(hist).summary()


def test_bad_estimators_and_public_coin_reports_are_refused():
    hist = Histogram(RandomizedResponse(k=4, epsilon=1.0), 200, np.array([90, 30, 30, 50]))
    with pytest.raises(InvalidInputError, match="estimator must be one of"):
        estimate(hist, estimator="mle")
    coin = PublicCoinBit(8, 1.0, public_seed=3, groups=4)
    rng = np.random.default_rng(0)
    coin_hist = Histogram(coin, 100, coin.simulate_histogram(100, np.full(8, 1 / 8), rng))
    with pytest.raises(InvalidInputError, match="estimate"):
        estimate(coin_hist, estimator="simplex")


def check_coverage(mech, p: np.ndarray, n: int, trials: int, seed: int) -> None:
    """Every category keeps FLOOR coverage within a 0.1% binomial band (at most one category of
    a large k may fall outside it by chance), the mean is at least nominal within its band, and
    no interval lies wholly outside [0, 1]."""
    covered = np.zeros(mech.k)
    for values in mech.simulate_histogram(n, p, np.random.default_rng(seed), size=trials):
        est = estimate(Histogram(mech, n, values), estimator="simplex")
        assert ((est.ci_low >= 0) & (est.ci_low < est.ci_high) & (est.ci_high <= 1)).all()
        covered += (est.ci_low <= p) & (p <= est.ci_high)
    floor = stats.binom.ppf(0.001, trials, FLOOR)
    assert np.sum(covered < floor) <= (0 if mech.k < 50 else 1), (mech.name, covered / trials)
    assert covered.mean() / trials >= FLOOR, (mech.name, covered.mean() / trials)


@pytest.mark.parametrize("mech", families(6, 1.0), ids=lambda m: m.name)
def test_coverage_at_small_n(mech):
    check_coverage(mech, np.array([0.4, 0.3, 0.2, 0.1, 0.0, 0.0]), 200, 300, seed=11)


@pytest.mark.parametrize(
    "mech",
    [HadamardResponse(k=500, epsilon=1.0), RandomizedResponse(k=500, epsilon=1.0)],
    ids=lambda m: m.name,
)
def test_coverage_at_sparse_large_k(mech):
    check_coverage(mech, zipf_sparse(500), 20_000, 200, seed=12)


@pytest.mark.slow
@pytest.mark.parametrize(
    "mech",
    [m for m in families(2_000, 1.0) if m.name != "local_hashing"]  # O(n k) per exact draw
    + [LocalHashing(k=500, epsilon=4.0)],
    ids=lambda m: m.name,
)
def test_coverage_at_sparse_large_k_every_family(mech):
    check_coverage(mech, zipf_sparse(mech.k), 20_000, 300, seed=13)
