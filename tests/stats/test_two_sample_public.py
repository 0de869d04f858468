"""Two-sample test for public-coin one-bit reports (``PublicCoinBit``): the per-group 2 x 2
homogeneity chi-square, summed. Type I inside the 99% binomial band at small, large and sparse
settings, the exact within-group permutation null at tiny n, power against the noncentral
chi-square(L) prediction, and typed refusals."""

from __future__ import annotations

import re
import zlib

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from aggregator.errors import IncompatibleHistogramsError, InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats import two_sample, two_sample_power
from aggregator.stats.studies import two_sample_rate, zipf
from client.mechanisms import PublicCoinBit

ALPHA = 0.05
# (label, k, eps, groups L, (n_a, n_b), calibration)
TYPE1 = [
    ("small n", 16, 1.0, 5, (40, 30), "auto"),
    ("sparse groups", 64, 1.0, 40, (60, 50), "auto"),
    ("large n asymptotic", 64, 1.0, 10, (4000, 3000), "asymptotic"),
    ("k 1024 eps 4", 1024, 4.0, 20, (1500, 1000), "auto"),
    ("eps 0.1 permutation", 32, 0.1, 8, (300, 200), "monte-carlo"),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setting", "k", "eps", "groups", "sizes", "calibration"), TYPE1, ids=[s[0] for s in TYPE1]
)
def test_type1_inside_band(setting, k, eps, groups, sizes, calibration):
    mech = PublicCoinBit(k, eps, zlib.crc32(setting.encode()), groups)
    p = zipf(k)
    rate = two_sample_rate(
        mech,
        p,
        p,
        sizes,
        trials=500,
        seed=zlib.crc32(f"public two-sample {setting}".encode()),
        calibration=calibration,
        n_draws=99,
    )
    assert rate.within_band(ALPHA), f"{setting}: Type I {rate.rate:.3f}"


def test_permutation_null_is_exact_at_tiny_n():
    """With 7 and 5 reports over 3 groups the permutation p-value keeps its level (a study with
    no informative group is refused, so it cannot reject: counted as not rejecting)."""
    mech, p = PublicCoinBit(4, 1.0, 9, 3), np.array([0.5, 0.2, 0.2, 0.1])
    rng = np.random.default_rng(5)
    trials, rejections, refused = 800, 0, 0
    for _ in range(trials):
        a = Histogram(mech, 7, mech.simulate_histogram(7, p, rng))
        b = Histogram(mech, 5, mech.simulate_histogram(5, p, rng))
        try:
            rejections += two_sample(a, b, calibration="monte-carlo", rng=rng, n_draws=99).reject
        except InvalidInputError:
            refused += 1
    assert refused < trials / 10
    assert rejections / trials <= ALPHA + 2.58 * np.sqrt(ALPHA * (1 - ALPHA) / trials)


@pytest.mark.parametrize(
    ("sizes", "calibration"), [((1500, 1000), "asymptotic"), ((600, 400), "auto")]
)
def test_power_matches_noncentral_prediction(sizes, calibration):
    mech = PublicCoinBit(64, 1.0, 5, 10)
    p_a, p_b = np.full(64, 1 / 64), zipf(64)
    predicted = two_sample_power(mech, p_a, p_b, sizes)
    rate = two_sample_rate(
        mech, p_a, p_b, sizes, trials=400, seed=11, calibration=calibration, n_draws=199
    )
    assert 0.2 < predicted < 0.95
    assert rate.close_to(predicted, points=0.05), (rate.rate, predicted)


def test_power_at_the_null_is_alpha():
    mech = PublicCoinBit(20, 1.0, 2, 6)
    assert two_sample_power(mech, zipf(20), zipf(20), (500, 500)) == pytest.approx(ALPHA)


def test_statistic_is_the_sum_of_per_group_homogeneity_chi_squares():
    mech = PublicCoinBit(8, 1.0, 3, 3)
    a = Histogram(mech, 90, [30, 40, 20, 10, 25, 5])  # sizes, then ones
    b = Histogram(mech, 70, [20, 30, 20, 12, 10, 15])
    result = two_sample(a, b, calibration="asymptotic")
    reference = sum(
        chi2_contingency(
            np.array([[a_ones, a_n - a_ones], [b_ones, b_n - b_ones]]), correction=False
        ).statistic
        for a_n, a_ones, b_n, b_ones in zip(
            a.values[:3], a.values[3:], b.values[:3], b.values[3:], strict=True
        )
    )
    assert result.statistic == pytest.approx(reference)
    assert result.dof == 3 and result.n == 160 and result.reason == ""
    assert list(result.observed) == list(a.values)
    assert result.expected[:3].tolist() == [30, 40, 20]


def test_uninformative_groups_are_left_out_and_said():
    mech = PublicCoinBit(8, 1.0, 3, 4)
    # group 0: no report in B; group 1: all bits 1; groups 2, 3 informative
    a = Histogram(mech, 50, [10, 10, 15, 15, 4, 10, 5, 9])
    b = Histogram(mech, 30, [0, 10, 10, 10, 0, 10, 6, 2])
    result = two_sample(a, b, calibration="monte-carlo", rng=1)
    assert result.reason.startswith("2 of 4 public groups left out")
    assert "note: 2 of 4 public groups left out" in result.summary()
    assert result.n_draws == 999 and result.dof is None
    assert two_sample(a, b, calibration="asymptotic").dof == 2


def test_monte_carlo_is_reproducible():
    mech = PublicCoinBit(32, 1.0, 4, 8)
    rng = np.random.default_rng(3)
    a = Histogram(mech, 200, mech.simulate_histogram(200, zipf(32), rng))
    b = Histogram(mech, 150, mech.simulate_histogram(150, zipf(32), rng))
    first = two_sample(a, b, rng=7)
    assert first.calibration == "monte-carlo" and "permutation" in first.calibration_reason
    assert first.pvalue == two_sample(a, b, rng=7).pvalue


def test_no_informative_group_is_a_typed_error():
    mech = PublicCoinBit(8, 1.0, 3, 2)
    a = Histogram(mech, 5, [5, 0, 5, 0])
    b = Histogram(mech, 4, [0, 4, 0, 1])
    with pytest.raises(InvalidInputError, match="none of the 2 public groups is informative"):
        two_sample(a, b)


@pytest.mark.parametrize(
    ("other", "why"),
    [
        (PublicCoinBit(8, 1.0, 4, 2), "public_seed=3"),
        (PublicCoinBit(8, 1.0, 3, 3), "groups=2), group B is public_coin_bit(k=8, epsilon=1, gr"),
        (PublicCoinBit(8, 2.0, 3, 2), "epsilon=1, groups=2), group B is public_coin_bit(k=8, ep"),
        (PublicCoinBit(9, 1.0, 3, 2), "group A has 8 categories, group B has 9"),
    ],
)
def test_different_definitions_are_refused(other, why):
    mech = PublicCoinBit(8, 1.0, 3, 2)
    rng = np.random.default_rng(0)
    a = Histogram(mech, 40, mech.simulate_histogram(40, np.full(8, 1 / 8), rng))
    b = Histogram(other, 40, other.simulate_histogram(40, np.full(other.k, 1 / other.k), rng))
    with pytest.raises(IncompatibleHistogramsError, match=re.escape(why)):
        two_sample(a, b)
