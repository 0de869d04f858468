"""Hypothesis fuzz of the public statistics API: any input either gives finite numbers (p-values
in [0, 1]) or a typed error naming what is wrong; never NaN, an untyped exception or a hang."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats import advise, estimate, goodness_of_fit, independence, power, sample_size
from client.mechanisms import FlipComponents, GaussianNoise, LaplaceNoise, RandomizedResponse

pytestmark = pytest.mark.slow  # hypothesis fuzzing (docs/fuzzing.md)

TYPED = (InvalidInputError, InsufficientDataError)
MAX_EXAMPLES = int(os.environ.get("LDP_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
anything = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**20), 10**20),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)
privacy = st.floats(1e-200, 1e3)


@st.composite
def histograms(draw):
    kind = draw(st.sampled_from(["rr", "fc", "gauss", "laplace"]))
    eps = draw(privacy)
    factory = {
        "rr": RandomizedResponse,
        "fc": FlipComponents,
        "gauss": GaussianNoise,
        "laplace": LaplaceNoise,
    }[kind]
    try:
        mech = factory(4, eps)
    except ValueError:
        mech = factory(4, 1.0)
    n = draw(st.integers(0, 10**7))
    weights = np.array(draw(st.lists(st.floats(0, 1), min_size=4, max_size=4))) + 1e-12
    try:
        values = mech.simulate_histogram(n, weights / weights.sum(), np.random.default_rng(0))
    except ValueError:  # NumPy cannot sample noise this large; any values will do
        values = np.zeros(4) if kind in ("gauss", "laplace") else np.eye(4)[0] * n
    if kind in ("gauss", "laplace") and draw(st.booleans()):
        values = np.array(draw(st.lists(st.floats(-1e300, 1e300), min_size=4, max_size=4)))
    return Histogram(mech, n, values if n else np.zeros(4))


def finite_result(result) -> None:
    assert np.isfinite(result.statistic) and 0 <= result.pvalue <= 1


def call(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # what counts is what comes out
        try:
            return fn()
        except TYPED:
            return None


@FUZZ
@given(
    histograms(),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=4, max_size=4),
    st.one_of(st.floats(allow_nan=True), st.just(0.05)),
    st.sampled_from(["auto", "asymptotic", "monte-carlo"]),
)
def test_tests_never_return_nan(hist, p0, alpha, calibration):
    for test in (
        lambda: goodness_of_fit(hist, p0, alpha, calibration=calibration, rng=0, n_draws=99),
        lambda: goodness_of_fit(hist, [0.25] * 4, alpha, calibration=calibration, rng=0),
        lambda: independence(hist, (2, 2), alpha, calibration=calibration, rng=0, n_draws=99),
    ):
        result = call(test)
        if result is not None:
            finite_result(result)


@FUZZ
@given(histograms(), st.one_of(anything, st.floats(0.01, 0.999)), st.booleans())
def test_estimates_are_finite(hist, confidence, simultaneous):
    est = call(lambda: estimate(hist, confidence, simultaneous=simultaneous))
    if est is not None:
        assert np.isfinite(est.frequencies).all() and np.isfinite(est.standard_errors).all()
        assert (est.ci_high > est.ci_low).all() or est.confidence < 0.01


@FUZZ
@given(
    st.one_of(anything, st.floats(1, 1e15)),
    st.one_of(privacy, anything),
    st.floats(-0.2, 0.2),
    st.one_of(st.floats(0.06, 0.99), anything),
)
def test_planning_is_bounded_and_typed(n, eps, delta, target):
    alternative = np.array([0.25 + delta, 0.25 - delta, 0.25, 0.25])
    null = np.full(4, 0.25)
    for plan in (
        lambda: power(RandomizedResponse(4, 1.0), alternative, n, null=null),
        lambda: advise(4, eps, alternative, n, null=null),
        lambda: sample_size(FlipComponents(4, 1.0), alternative, null=null, power=target),
        lambda: sample_size(RandomizedResponse(4, 1.0), alternative, shape=(2, 2), power=target),
    ):
        out = call(plan)
        if isinstance(out, float):
            assert 0 <= out <= 1
        elif isinstance(out, int):
            assert out >= 1
        elif out is not None:
            assert all(0 <= a.power <= 1 for a in out)


@pytest.mark.parametrize(
    "mech", [FlipComponents(4, 1e-170), RandomizedResponse(4, 1e-170)], ids=str
)
def test_tiny_epsilon_is_a_typed_error(mech):
    hist = Histogram(
        mech, 100, mech.simulate_histogram(100, np.full(4, 0.25), np.random.default_rng())
    )
    for fn in (
        lambda: goodness_of_fit(hist, np.full(4, 0.25)),
        lambda: independence(hist, (2, 2)),
        lambda: estimate(hist),
    ):
        with pytest.raises(InvalidInputError, match="epsilon"):
            fn()
