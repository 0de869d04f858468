"""Type I error of every local test under its null, inside the 99% binomial band around alpha.

The grid covers the Figure 24/25 settings (spec section 6), a non-uniform p0, a zero cell, d = 2,
epsilon in {0.5, 1, 2, 4}, small n and a 2 x 3 table. Fixed seeds; the long version with more
trials is scripts/validate_tests.py (docs/validation.md).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from aggregator.stats import FunctionModel, composite
from aggregator.stats.studies import (
    GOF_TESTS,
    INDEPENDENCE_TESTS,
    gof_runner,
    independence_runner,
    rejection_rate,
)

pytestmark = pytest.mark.slow  # a statistical validation (docs/validation.md)

ALPHA = 0.05
UNIFORM4 = np.full(4, 0.25)
ASYMPTOTIC_GOF = [label for label in GOF_TESTS if label != "Gauss T (Imhof)"]
ASYMPTOTIC_INDEPENDENCE = [label for label in INDEPENDENCE_TESTS if label != "Laplace bootstrap"]

GOF_SETTINGS = [
    *[
        (f"fig24 eps={eps} n={n}", UNIFORM4, eps, n)
        for eps in (0.5, 1, 2, 4)
        for n in (5000, 50000)
    ],
    ("non-uniform p0", np.array([1 / 2, 1 / 6, 1 / 6, 1 / 6]), 2.0, 20000),
    ("zero cell", np.array([0.0, 0.2, 0.3, 0.5]), 1.0, 20000),
    ("d=2", np.array([0.3, 0.7]), 1.0, 20000),
    ("small n", UNIFORM4, 1.0, 50),
]


@pytest.mark.parametrize("label", ASYMPTOTIC_GOF)
@pytest.mark.parametrize(
    ("setting", "p0", "eps", "n"), GOF_SETTINGS, ids=[s[0] for s in GOF_SETTINGS]
)
def test_gof_type1(label, setting, p0, eps, n):
    factory, method = GOF_TESTS[label]
    mech = factory(p0.size, eps)
    rate = rejection_rate(
        mech,
        p0,
        n,
        gof_runner(p0, method),
        trials=400,
        seed=zlib.crc32(f"{label} {setting}".encode()),
    )
    assert rate.within_band(ALPHA), f"{label} {setting}: Type I {rate.rate:.3f}"


@pytest.mark.parametrize(
    ("p0", "eps", "n"),
    [
        (UNIFORM4, 1.0, 5000),
        (UNIFORM4, 2.0, 50000),
        (np.array([0.5, 1 / 6, 1 / 6, 1 / 6]), 2.0, 20000),
    ],
)
def test_imhof_gof_type1(p0, eps, n):
    factory, method = GOF_TESTS["Gauss T (Imhof)"]
    rate = rejection_rate(factory(4, eps), p0, n, gof_runner(p0, method), trials=150, seed=7)
    assert rate.within_band(ALPHA), f"Type I {rate.rate:.3f}"


PI_HALF = np.full(4, 0.25)
PI_2X3 = np.outer([2 / 3, 1 / 3], [0.5, 0.3, 0.2]).ravel()
INDEPENDENCE_SETTINGS = [
    *[(f"fig25 eps={eps} n={n}", PI_HALF, (2, 2), eps, n) for eps in (1, 2) for n in (1000, 10000)],
    *[(f"fig25 eps={eps} n=5000", PI_HALF, (2, 2), eps, 5000) for eps in (0.5, 4)],
    ("2x3 eps=2 n=5000", PI_2X3, (2, 3), 2.0, 5000),
]


@pytest.mark.parametrize("label", ASYMPTOTIC_INDEPENDENCE)
@pytest.mark.parametrize(
    ("setting", "p", "shape", "eps", "n"),
    INDEPENDENCE_SETTINGS,
    ids=[s[0] for s in INDEPENDENCE_SETTINGS],
)
def test_independence_type1(label, setting, p, shape, eps, n):
    factory, method = INDEPENDENCE_TESTS[label]
    mech = factory(p.size, eps)
    runner = independence_runner(shape, method)
    rate = rejection_rate(
        mech, p, n, runner, trials=300, seed=zlib.crc32(f"{label} {setting}".encode())
    )
    assert rate.within_band(ALPHA), f"{label} {setting}: Type I {rate.rate:.3f}"


@pytest.mark.parametrize(("p", "shape"), [(PI_HALF, (2, 2)), (PI_2X3, (2, 3))])
def test_laplace_bootstrap_type1(p, shape):
    factory, method = INDEPENDENCE_TESTS["Laplace bootstrap"]
    runner = independence_runner(shape, method, n_draws=99)
    rate = rejection_rate(factory(p.size, 2.0), p, 5000, runner, trials=150, seed=11)
    assert rate.within_band(ALPHA), f"Type I {rate.rate:.3f}"


def binomial_model() -> FunctionModel:
    """Answers 0..3 ~ Binomial(3, theta): a one-parameter composite null (s = 1, df = 2)."""
    from scipy import stats

    return FunctionModel(
        4,
        probabilities=lambda theta: stats.binom.pmf(np.arange(4), 3, theta[0]),
        initial=lambda p: np.array([np.dot(np.arange(4), p) / 3]),
        n_params=1,
        bounds=(np.array([0.0]), np.array([1.0])),
    )


@pytest.mark.parametrize("label", ASYMPTOTIC_INDEPENDENCE)
def test_general_composite_type1(label):
    from scipy import stats

    factory, method = INDEPENDENCE_TESTS[label]
    p = stats.binom.pmf(np.arange(4), 3, 0.3)
    model = binomial_model()
    runner = lambda hist, rng: composite(  # noqa: E731
        hist, model, method=method, calibration="asymptotic"
    )
    rate = rejection_rate(factory(4, 2.0), p, 10000, runner, trials=300, seed=5)
    assert rate.within_band(ALPHA), f"{label}: Type I {rate.rate:.3f}"
