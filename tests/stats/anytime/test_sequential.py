"""Anytime-valid monitoring (issue 30): confidence sequences and e-process tests, from the
sufficient statistics at each look. The exact pieces are checked exactly (moment generating
functions, the likelihood-ratio martingale, the closed-form normal mixture); the guarantees
statistically at fixed seeds against the 99% binomial band (fewer paths and looks than
scripts/validate_sequential.py; tests/stats/anytime/test_sequential_validity.py is the larger, slow
one)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats import goodness_of_fit
from aggregator.stats.anytime import (
    EProcess,
    difference_sequence,
    expected_stopping_time,
    frequency_path,
    frequency_sequence,
    laws,
    looks_from_sums,
    mean_score_sequence,
    nulls,
    sequential_goodness_of_fit,
    sequential_homogeneity,
    sequential_independence,
)
from aggregator.stats.anytime.eprocess import PRIOR_REPORTS
from aggregator.stats.anytime.mixture import c_alpha
from aggregator.stats.anytime.sequences import frequency_excluded
from aggregator.stats.channel import project_simplex
from client.mechanisms import (
    FlipComponents,
    GaussianNoise,
    LaplaceNoise,
    PublicCoinBit,
    RandomizedResponse,
)

ALPHA = 0.05
P0 = np.full(4, 0.25)
P1 = np.array([0.3, 0.3, 0.2, 0.2])


def cumulative(mech, p, looks, paths, seed, batch=100):
    """(looks, paths, s) cumulative statistics after every batch."""
    rng = np.random.default_rng(seed)
    draws = mech.simulate_histogram(batch, p, rng, size=looks * paths)
    return np.cumsum(draws.reshape(looks, paths, -1), axis=0)


def band(paths, alpha=ALPHA):
    """The 99% binomial upper quantile of a count of events of probability alpha."""
    return int(stats.binom.ppf(0.99, paths, alpha))


# --- exact pieces -----------------------------------------------------------------------------


@pytest.mark.parametrize("mech", [RandomizedResponse(k=3, epsilon=1.0), FlipComponents(3, 1.0)])
def test_conditional_mgf_is_exact_for_counts_and_bits(mech):
    lam = np.array([0.3, -1.2, 0.7])
    got = laws.log_conditional_mgf(mech, lam)
    for x in range(3):
        if mech.statistic_kind == "counts":
            probs = mech.offset + mech.slope * (np.arange(3) == x)
            want = np.sum(probs * np.exp(lam))
        else:
            on = mech.offset + mech.slope * (np.arange(3) == x)
            want = sum(
                np.prod(np.where(bits, on, 1 - on)) * np.exp(lam @ np.array(bits))
                for bits in itertools.product([0, 1], repeat=3)
            )
        assert got[x] == pytest.approx(math.log(want), rel=1e-12)


def test_laplace_mgf_is_the_discrete_laplace_sum():
    mech = LaplaceNoise(k=2, epsilon=1.0, granularity_bits=2)
    g, lam = mech.scale, 0.3
    r = math.exp(-1.0 / (2 * g))
    z = np.arange(-4000, 4001)
    pmf = (1 - r) / (1 + r) * r ** np.abs(z)
    want = math.log(np.sum(pmf * np.exp(lam * z / g)))
    assert laws.noise_log_mgf(mech, np.array(lam)) == pytest.approx(want, rel=1e-9)
    assert laws.noise_log_mgf(mech, np.array(0.6)) == math.inf  # outside |lam| < eps / 2


def test_mixture_matches_the_closed_form_normal_mixture():
    """Hoeffding's bound is quadratic, so the mean-score sequence is the closed-form normal
    mixture sqrt((V + rho) log((V + rho) / (rho alpha^2))) up to the mixing grid."""
    mech = RandomizedResponse(k=3, epsilon=2.0)
    hist = Histogram(mech, 5000, np.array([1500, 1700, 1800]))
    cs = mean_score_sequence(hist, alpha=ALPHA, tuned_n=5000)
    spread = 2 / mech.slope
    v = 5000 * spread**2 / 4
    rho = v / c_alpha(ALPHA)
    half = math.sqrt((v + rho) * math.log((v + rho) / (rho * ALPHA**2))) / 5000
    assert (cs.high - cs.low) / 2 == pytest.approx(half, rel=0.01)
    assert cs.low < cs.mean < cs.high


def test_goodness_of_fit_eprocess_is_the_plug_in_likelihood_ratio():
    mech = RandomizedResponse(k=3, epsilon=1.0)
    p0 = np.array([0.2, 0.3, 0.5])
    looks = [Histogram(mech, 10, np.array([3, 3, 4])), Histogram(mech, 30, np.array([12, 8, 10]))]
    result = sequential_goodness_of_fit(looks, p0)
    q0 = mech.report_mean(p0)
    raw = (np.array([0.3, 0.3, 0.4]) - mech.offset) / mech.slope  # the first look's estimate
    alt = (10 * project_simplex(raw) + PRIOR_REPORTS * 3 * p0) / (10 + PRIOR_REPORTS * 3)
    batch = np.array([9, 5, 6])
    want = float(batch @ np.log(mech.report_mean(alt) / q0))
    assert math.log(result.evalue) == pytest.approx(want, rel=1e-9)
    assert result.path[0] == (10, 1.0)  # no reports before the first look: nothing bet


# --- confidence sequences ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "mech",
    [RandomizedResponse(k=4, epsilon=1.0), GaussianNoise(k=4, rho=0.5), LaplaceNoise(4, 1.0)],
    ids=lambda m: m.name,
)
def test_sequence_covers_over_the_whole_path(mech):
    """Looked at after every 100 reports up to 5,000, the simultaneous sequence misses some
    frequency at some look on at most the binomial band of 200 paths; the fixed-n simultaneous
    intervals' analogue is not checked here (the validation table)."""
    p = np.array([0.1, 0.2, 0.3, 0.4])
    paths = 200
    missed = np.zeros(paths, dtype=bool)
    for look, values in enumerate(cumulative(mech, p, 50, paths, seed=7), start=1):
        missed |= frequency_excluded(look * 100, values, mech, p, ALPHA).any(axis=1)
    assert missed.sum() <= band(paths)


def test_sequence_agrees_with_its_exclusion_test_and_stays_in_range():
    mech = FlipComponents(k=4, epsilon=2.0)
    hist = Histogram(mech, 2000, mech.simulate_histogram(2000, P1, np.random.default_rng(3)))
    cs = frequency_sequence(hist, ALPHA)
    assert np.all((cs.low >= 0) & (cs.low <= cs.estimate) & (cs.estimate <= cs.high))
    assert np.all(cs.high <= 1)
    for j in range(4):
        inside, outside = P1.copy(), P1.copy()
        inside[j] = (cs.low[j] + cs.high[j]) / 2
        outside[j] = cs.high[j] + 0.01
        assert not frequency_excluded(2000, hist.values, mech, inside, ALPHA)[0, j]
        assert frequency_excluded(2000, hist.values, mech, outside, ALPHA)[0, j]
    assert "time-uniform" in cs.guarantee and "together" in cs.guarantee


def test_no_reports_give_the_whole_range_and_widths_shrink():
    mech = RandomizedResponse(k=4, epsilon=1.0)
    empty = frequency_sequence(Histogram.empty(mech), ALPHA)
    assert np.all(empty.low == 0) and np.all(empty.high == 1)
    path = frequency_path(
        [
            Histogram(mech, n, mech.simulate_histogram(n, P0, np.random.default_rng(n)))
            for n in (1000, 10_000, 100_000)
        ]
    )
    widths = [float(np.mean(cs.high - cs.low)) for cs in path]
    assert widths[0] > widths[1] > widths[2]


def test_difference_sequence_covers_zero_for_equal_groups():
    mech = GaussianNoise(k=4, rho=1.0)
    rng = np.random.default_rng(5)
    a = Histogram(mech, 3000, mech.simulate_histogram(3000, P0, rng))
    b = Histogram(mech, 1000, mech.simulate_histogram(1000, P0, rng))
    diff = difference_sequence(a, b, ALPHA)
    assert np.all((diff.low <= 0) & (diff.high >= 0))
    assert np.all((diff.low <= diff.difference) & (diff.difference <= diff.high))
    assert diff.n == (3000, 1000)


def test_public_coin_reports_are_refused():
    mech = PublicCoinBit(8, 1.0, 7, 4)
    with pytest.raises(InvalidInputError, match="public"):
        frequency_sequence(Histogram.empty(mech), ALPHA)


@pytest.mark.parametrize("bad", [0, -3, 1.5, True])
def test_bad_tuned_n_is_refused(bad):
    mech = RandomizedResponse(k=4, epsilon=1.0)
    with pytest.raises(InvalidInputError, match="tuned_n"):
        frequency_sequence(Histogram.empty(mech), ALPHA, tuned_n=bad)


# --- sequential tests -------------------------------------------------------------------------


def test_type_one_under_looks_beats_the_repeated_fixed_n_test():
    """Under the null, looked at after every 100 reports up to 5,000: the e-process ever
    rejects on at most the binomial band of 100 paths, the repeated chi-square test far more."""
    mech = RandomizedResponse(k=4, epsilon=1.0)
    paths = 100
    sequential = naive = 0
    stats_path = cumulative(mech, P0, 50, paths, seed=11)
    for i in range(paths):
        process = EProcess(nulls.simple(P0, 4), [mech], ALPHA)
        ever = False
        for look, values in enumerate(stats_path[:, i], start=1):
            hist = Histogram(mech, look * 100, values)
            result = process.update([hist])
            ever = ever or goodness_of_fit(hist, P0, calibration="asymptotic").pvalue < ALPHA
        sequential += result.reject
        naive += ever
    assert sequential <= band(paths)
    assert naive > sequential + 10


@pytest.mark.parametrize(
    "mech",
    [RandomizedResponse(k=4, epsilon=1.0), GaussianNoise(k=4, rho=0.5)],
    ids=lambda m: m.name,
)
def test_eprocess_stops_on_evidence_under_the_alternative(mech):
    looks = [
        Histogram(mech, (t + 1) * 100, v[0]) for t, v in enumerate(cumulative(mech, P1, 200, 1, 3))
    ]
    result = sequential_goodness_of_fit(looks, P0, ALPHA)
    assert result.reject and result.stop == "evidence"
    assert result.rejected_at is not None and result.rejected_at <= 20_000
    assert result.pvalue == pytest.approx(1 / result.max_evalue)
    pvalues = [
        min(1.0, 1 / max(e for _, e in result.path[: i + 1])) for i in range(len(result.path))
    ]
    assert all(a >= b for a, b in itertools.pairwise(pvalues))


def test_maximum_n_stops_without_evidence():
    mech = RandomizedResponse(k=4, epsilon=1.0)
    looks = [
        Histogram(mech, (t + 1) * 100, v[0]) for t, v in enumerate(cumulative(mech, P0, 30, 1, 4))
    ]
    result = sequential_goodness_of_fit(looks, P0, ALPHA, max_n=1000)
    assert result.stop == "maximum n" and result.n == 1000 and not result.reject


def test_composite_tests_reject_a_clear_effect_and_not_the_null():
    mech = RandomizedResponse(k=6, epsilon=2.0)
    p = np.outer([0.5, 0.5], [0.2, 0.3, 0.5]).ravel()
    dependent = p + 0.1 * np.array([1, 0, -1, -1, 0, 1]) / 2
    for q, effect in ((p, False), (dependent, True)):
        looks = [
            Histogram(mech, (t + 1) * 1000, v[0])
            for t, v in enumerate(cumulative(mech, q, 8, 1, 21, 1000))
        ]
        assert sequential_independence(looks, (2, 3)).reject == effect
    a = cumulative(mech, p, 6, 1, 22, 1000)
    b = cumulative(mech, p[::-1].copy(), 6, 1, 23, 1000)
    looks2 = [
        [Histogram(mech, (t + 1) * 1000, a[t, 0]), Histogram(mech, (t + 1) * 1000, b[t, 0])]
        for t in range(6)
    ]
    assert sequential_homogeneity(looks2).reject


def test_composite_tests_on_gaussian_reports():
    mech = GaussianNoise(k=4, rho=2.0)
    p = np.outer([0.5, 0.5], [0.4, 0.6]).ravel()
    dependent = p + np.array([0.1, -0.1, -0.1, 0.1])
    looks = [
        Histogram(mech, (t + 1) * 2000, v[0])
        for t, v in enumerate(cumulative(mech, dependent, 4, 1, 31, 2000))
    ]
    assert sequential_independence(looks, (2, 2)).reject
    a, b = cumulative(mech, p, 4, 1, 32, 2000), cumulative(mech, p, 4, 1, 33, 2000)
    same = [
        [Histogram(mech, (t + 1) * 2000, a[t, 0]), Histogram(mech, (t + 1) * 2000, b[t, 0])]
        for t in range(4)
    ]
    assert not sequential_homogeneity(same).reject


@pytest.mark.parametrize("bad", [0, 2.5, "10", True])
def test_bad_max_n_is_refused(bad):
    with pytest.raises(InvalidInputError, match="max_n"):
        EProcess(nulls.simple(P0, 4), [RandomizedResponse(k=4, epsilon=1.0)], max_n=bad)


def test_looks_from_store_sums_and_their_errors():
    mech = GaussianNoise(k=3, rho=1.0)
    looks = looks_from_sums(mech, [(1, [mech.scale, 0, 0]), (2, [mech.scale, mech.scale, 0])])
    assert looks[1].values.tolist() == [1.0, 1.0, 0.0]
    with pytest.raises(InvalidInputError, match="go back"):
        looks_from_sums(mech, [(2, [0, 0, 0]), (1, [0, 0, 0])])
    process = EProcess(nulls.simple(np.full(3, 1 / 3), 3), [mech])
    process.update([looks[1]])
    with pytest.raises(InvalidInputError, match="went down"):
        process.update([looks[0]])
    with pytest.raises(InvalidInputError, match="expected 1 histograms"):
        process.update(looks)
    with pytest.raises(InvalidInputError, match="shape"):
        sequential_independence([Histogram.empty(RandomizedResponse(k=6, epsilon=1.0))], (2, 2))
    with pytest.raises(InvalidInputError, match="alpha"):
        sequential_goodness_of_fit(looks, np.full(3, 1 / 3), alpha=1.5)


def test_expected_stopping_time_grows_as_the_effect_shrinks():
    mech = RandomizedResponse(k=4, epsilon=1.0)
    big = expected_stopping_time(mech, [0.4, 0.3, 0.2, 0.1], P0)
    small = expected_stopping_time(mech, P1, P0)
    assert 0 < big < small
    with pytest.raises(InvalidInputError, match="satisfies the null"):
        expected_stopping_time(mech, P0, P0)
