"""Simulated power against the analytic noncentral chi-square prediction (spec section 5), and
the planning figures of spec section 5 reproduced by power() and sample_size()."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.stats import IndependenceModel, advise, noncentrality, power, sample_size
from aggregator.stats.studies import (
    GOF_TESTS,
    INDEPENDENCE_TESTS,
    gof_runner,
    independence_runner,
    rejection_rate,
)
from client.mechanisms import FlipComponents, GaussianNoise, LaplaceNoise, RandomizedResponse

pytestmark = pytest.mark.slow  # a statistical validation (docs/validation.md)

UNIFORM4 = np.full(4, 0.25)
FIG24_ALT = UNIFORM4 + 0.01 * np.array([1, -1, -1, 1])
FIG25_ALT = np.full(4, 0.25) + 0.025 * np.array([1, -1, -1, 1])


@pytest.mark.parametrize(
    ("label", "eps", "n", "trials"),
    [
        ("LocalGOF (RR)", 2.0, 20000, 300),
        ("Gauss proj", 2.0, 20000, 300),
        ("Gauss nonproj", 2.0, 20000, 300),
        ("Gauss T (Imhof)", 2.0, 20000, 100),
        ("Laplace MC", 2.0, 50000, 300),
        ("MFC T_FC", 2.0, 20000, 300),
        ("LocalGOF (RR)", 1.0, 50000, 300),
        ("MFC T_FC", 4.0, 5000, 300),
    ],
)
def test_gof_power_matches_noncentral_chi_square(label, eps, n, trials):
    factory, method = GOF_TESTS[label]
    mech = factory(4, eps)
    analytic = power(mech, FIG24_ALT, n, null=UNIFORM4, method=method)
    rate = rejection_rate(mech, FIG24_ALT, n, gof_runner(UNIFORM4, method), trials, seed=3)
    assert 0.1 < analytic < 0.95
    assert rate.close_to(analytic), f"{label}: simulated {rate.rate:.3f} vs {analytic:.3f}"


@pytest.mark.parametrize(
    ("label", "eps", "n", "trials"),
    [
        ("LocalGeneral (RR)", 2.0, 2500, 300),
        ("Gauss proj", 2.0, 2500, 300),
        ("MFC proj", 2.0, 2500, 300),
        ("LocalGeneral (RR)", 1.0, 5000, 300),
        ("Laplace bootstrap", 2.0, 5000, 100),
    ],
)
def test_independence_power_matches_noncentral_chi_square(label, eps, n, trials):
    factory, method = INDEPENDENCE_TESTS[label]
    mech = factory(4, eps)
    analytic = power(mech, FIG25_ALT, n, shape=(2, 2), method=method)
    runner = independence_runner((2, 2), method, n_draws=99)
    rate = rejection_rate(mech, FIG25_ALT, n, runner, trials, seed=4)
    assert 0.1 < analytic < 0.95
    assert rate.close_to(analytic), f"{label}: simulated {rate.rate:.3f} vs {analytic:.3f}"


# Spec section 5: predicted n for 50% / 80% power, Figure-24 GOF setting.
@pytest.mark.parametrize(
    ("factory", "eps", "n50", "n80"),
    [
        (lambda eps: RandomizedResponse(4, eps), 1, 39873, 75466),
        (lambda eps: RandomizedResponse(4, eps), 4, 4158, 7869),
        (lambda eps: LaplaceNoise(4, eps), 1, 118810, 224865),
        (lambda eps: GaussianNoise(4, eps * eps / 2), 2, 10801, 20442),
        (lambda eps: FlipComponents(4, eps), 2, 16859, 31908),
    ],
)
def test_sample_size_reproduces_spec_table(factory, eps, n50, n80):
    mech = factory(eps)
    for target, expected in ((0.5, n50), (0.8, n80)):
        n = sample_size(mech, FIG24_ALT, null=UNIFORM4, power=target)
        # The spec rounds nu to 3-4 digits; the discrete Laplace variance is 8/eps^2 * (1 - 1e-8).
        assert abs(n - expected) <= max(2, 1e-4 * expected), (n, expected)
        assert power(mech, FIG24_ALT, n, null=UNIFORM4) >= target
        assert power(mech, FIG24_ALT, n - 1, null=UNIFORM4) < target


@pytest.mark.parametrize(
    ("factory", "eps", "n50", "n80"),
    [
        (lambda eps: RandomizedResponse(4, eps), 1, 4254, 8693),
        (lambda eps: LaplaceNoise(4, eps), 2, 3457, 7064),
        (lambda eps: GaussianNoise(4, eps * eps / 2), 4, 576, 1177),
    ],
)
def test_independence_sample_size_reproduces_spec_table(factory, eps, n50, n80):
    mech = factory(eps)
    for target, expected in ((0.5, n50), (0.8, n80)):
        n = sample_size(mech, FIG25_ALT, shape=(2, 2), power=target)
        assert abs(n - expected) <= 2, (n, expected)


def test_independence_noncentrality_uses_model_fit():
    """For 2x2, nu/n = 1e-2 a1^2 for RR (spec 5): the min-chi-square fit is the marginals."""
    mech = RandomizedResponse(4, 1.0)
    model = IndependenceModel(2, 2)
    by_model = power(mech, FIG25_ALT, 3000, model=model)
    by_shape = power(mech, FIG25_ALT, 3000, shape=(2, 2))
    assert by_model == pytest.approx(by_shape)


def test_advisor_ranks_as_spec_predicts():
    """d = 4: at eps = 1 Gauss > RR > MFC > Laplace; at eps = 2 RR > Gauss > MFC > Laplace
    (the spec's four mechanisms with their default tests, within the full ranking)."""
    spec = {"gaussian", "randomized_response", "flip_components", "laplace"}
    names = lambda eps: [  # noqa: E731
        a.mechanism.name
        for a in advise(4, eps, FIG24_ALT, 20000, null=UNIFORM4)
        if a.mechanism.name in spec and a.method not in ("t1", "t2")
    ]
    assert names(1.0) == ["gaussian", "randomized_response", "flip_components", "laplace"]
    assert names(2.0) == ["randomized_response", "gaussian", "flip_components", "laplace"]


@pytest.mark.parametrize(
    ("factory", "coefficient"),
    [
        (lambda: RandomizedResponse(4, 1.0), 0.361),
        (lambda: GaussianNoise(4, 0.5), 0.444),
        (lambda: LaplaceNoise(4, 1.0), 0.121),
        (lambda: FlipComponents(4, 1.0), 0.240),
    ],
)
def test_noncentrality_matches_spec_coefficients(factory, coefficient):
    """Spec 5, uniform p0 = 1/4, eps = 1: nu = n ||Delta||^2 * coefficient."""
    nu = noncentrality(factory(), FIG24_ALT, 10_000, null=UNIFORM4)
    assert nu == pytest.approx(10_000 * 4e-4 * coefficient, rel=2e-3)
