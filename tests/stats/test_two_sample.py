"""Two-sample (homogeneity) tests: Type I inside the 99% binomial band, power against the
noncentral chi-square prediction, the exact permutation null of randomized response, and typed
errors. The long grid is ``scripts/validate_tests.py --two-sample`` (docs/validation.md)."""

from __future__ import annotations

import re
import zlib

import numpy as np
import pytest

from aggregator.errors import IncompatibleHistogramsError, InsufficientDataError, InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats import two_sample, two_sample_power
from aggregator.stats.studies import two_sample_rate, zipf
from client.mechanisms import FlipComponents, GaussianNoise, LaplaceNoise, RandomizedResponse

ALPHA = 0.05
FACTORIES = {
    "RR": lambda k, eps: RandomizedResponse(k, eps),
    "FC": lambda k, eps: FlipComponents(k, eps),
    "Gauss": lambda k, eps: GaussianNoise(k, eps * eps / 2),
    "Laplace": lambda k, eps: LaplaceNoise(k, eps),
}
# (label, k, eps, (n_a, n_b)): small n, sparse k, k = 1,024, eps 0.05 .. 8
SETTINGS = [
    ("small n", 4, 1.0, (30, 20)),
    ("eps 0.05", 16, 0.05, (500, 800)),
    ("sparse eps 8", 64, 8.0, (150, 150)),
    ("k 1024", 1024, 1.0, (2000, 1500)),
]


@pytest.mark.slow
@pytest.mark.parametrize("name", FACTORIES)
@pytest.mark.parametrize(("setting", "k", "eps", "sizes"), SETTINGS, ids=[s[0] for s in SETTINGS])
def test_type1_inside_band(name, setting, k, eps, sizes):
    trials = 400 if k < 1024 else 120
    p = zipf(k)
    rate = two_sample_rate(
        FACTORIES[name](k, eps),
        p,
        p,
        sizes,
        trials=trials,
        seed=zlib.crc32(f"two-sample {name} {setting}".encode()),
        n_draws=99,
    )
    assert rate.within_band(ALPHA), f"{name} {setting}: Type I {rate.rate:.3f}"


@pytest.mark.parametrize("name", FACTORIES)
def test_power_matches_noncentral_prediction(name):
    mech = FACTORIES[name](4, 2.0)
    p_a = np.array([0.25, 0.25, 0.25, 0.25])
    p_b = np.array([0.31, 0.25, 0.22, 0.22])
    sizes = (3000, 2000)
    predicted = two_sample_power(mech, p_a, p_b, sizes)
    rate = two_sample_rate(mech, p_a, p_b, sizes, trials=300, seed=11, calibration="asymptotic")
    assert 0.2 < predicted < 0.95
    assert rate.close_to(predicted, points=0.05), (rate.rate, predicted)


def test_permutation_null_is_exact_at_tiny_n():
    """Randomized response's permutation p-value keeps its level with 6 and 9 reports."""
    rate = two_sample_rate(
        RandomizedResponse(3, 1.0),
        np.array([0.6, 0.3, 0.1]),
        np.array([0.6, 0.3, 0.1]),
        (6, 9),
        trials=600,
        seed=5,
        calibration="monte-carlo",
        n_draws=99,
    )
    assert rate.rate <= 0.05 + 2.58 * np.sqrt(0.05 * 0.95 / 600), rate.rate


def test_randomized_response_is_the_classical_homogeneity_chi_square():
    from scipy.stats import chi2_contingency

    mech = RandomizedResponse(5, 1.0)
    a = Histogram(mech, 100, [30, 20, 25, 15, 10])
    b = Histogram(mech, 80, [10, 20, 20, 20, 10])
    result = two_sample(a, b, calibration="asymptotic")
    reference = chi2_contingency(np.array([a.values, b.values]), correction=False)
    assert result.statistic == pytest.approx(reference.statistic)
    assert result.pvalue == pytest.approx(reference.pvalue)
    assert result.dof == 4


def test_monte_carlo_is_reproducible_and_reported():
    mech = FlipComponents(8, 1.0)
    rng = np.random.default_rng(3)
    a = Histogram(mech, 400, mech.simulate_histogram(400, zipf(8), rng))
    b = Histogram(mech, 300, mech.simulate_histogram(300, zipf(8), rng))
    first = two_sample(a, b, calibration="monte-carlo", rng=7)
    again = two_sample(a, b, calibration="monte-carlo", rng=7)
    assert first.pvalue == again.pvalue
    assert first.n_draws == 999 and first.dof is None
    assert "bootstrap" in first.calibration_reason
    assert first.n == 700


def test_one_category_only_is_inconclusive():
    mech = RandomizedResponse(3, 1.0)
    result = two_sample(Histogram(mech, 4, [4, 0, 0]), Histogram(mech, 2, [2, 0, 0]))
    assert result.inconclusive and not result.reject and result.pvalue == 1.0


@pytest.mark.parametrize(
    ("other", "why"),
    [
        (FlipComponents(4, 1.0), "group A uses randomized_response, group B uses flip"),
        (RandomizedResponse(5, 1.0), "group A has 4 categories, group B has 5"),
        (RandomizedResponse(4, 2.0), "epsilon=1), group B is randomized_response(k=4, epsilon=2)"),
    ],
)
def test_different_definitions_are_refused_with_the_reason(other, why):
    mech = RandomizedResponse(4, 1.0)
    a = Histogram(mech, 10, [4, 3, 2, 1])
    b = Histogram(
        other,
        10,
        other.simulate_histogram(10, np.full(other.k, 1 / other.k), np.random.default_rng(0)),
    )
    with pytest.raises(IncompatibleHistogramsError, match=re.escape(why)):
        two_sample(a, b)


def test_bad_inputs_are_typed_errors():
    mech = RandomizedResponse(3, 1.0)
    a = Histogram(mech, 3, [1, 1, 1])
    with pytest.raises(InsufficientDataError):
        two_sample(a, Histogram.empty(mech))
    with pytest.raises(InvalidInputError):
        two_sample(a, [1, 1, 1])
    with pytest.raises(InvalidInputError):
        two_sample(a, a, alpha=1.5)
    with pytest.raises(InvalidInputError):
        two_sample(a, a, calibration="bootstrap")
    with pytest.raises(InvalidInputError):
        two_sample(a, a, n_draws=5)
    with pytest.raises(InvalidInputError):
        two_sample_power(mech, [0.5, 0.5, 0.0], [0.2, 0.2], (10, 10))
