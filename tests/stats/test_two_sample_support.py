"""Issue 17 item 3: two_sample for the support-count mechanisms (optimized unary encoding,
Hadamard response, subset selection, local hashing): parametric bootstrap at the pooled estimate
(optimized unary encoding: permutation of each category's pooled bits; subset selection with
one-category subsets: permutation of the reports), Type I inside the 99% band, power, the
same-definition check."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.errors import IncompatibleHistogramsError
from aggregator.histogram import Histogram
from aggregator.stats import two_sample, two_sample_power
from aggregator.stats.studies import geometric, two_sample_rate, zipf
from client.mechanisms import (
    HadamardResponse,
    LocalHashing,
    OptimizedUnaryEncoding,
    SubsetSelection,
)

ALPHA = 0.05


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mech", "p", "sizes", "trials"),
    [
        (HadamardResponse(30, 1.0), zipf(30), (600, 400), 300),
        (OptimizedUnaryEncoding(30, 1.0), zipf(30), (500, 500), 300),
        # sparse at eps = 8: the bootstrap at the pooled estimate rejected 0.085 of 800 here
        (OptimizedUnaryEncoding(64, 8.0), geometric(64, 0.9), (150, 150), 400),
        (HadamardResponse(200, 2.0), zipf(200, 1.5), (300, 200), 300),  # sparse: many p_j ~ 0
        (SubsetSelection(12, 1.0), zipf(12), (200, 150), 200),
        # d = 1: the bootstrap at the pooled estimate rejected 0.090 of 300 here
        (SubsetSelection(64, 8.0), geometric(64, 0.9), (150, 150), 400),
        (LocalHashing(12, 1.0), zipf(12), (200, 150), 200),
        # sparse at eps = 8: the bootstrap at the pooled estimate rejected 0.087 of 300 here
        (LocalHashing(64, 8.0), geometric(64, 0.9), (150, 150), 400),
    ],
    ids=[
        "hr",
        "oue",
        "oue sparse eps 8",
        "hr sparse",
        "ss",
        "ss d 1 sparse eps 8",
        "olh",
        "olh sparse eps 8",
    ],
)
def test_type1_inside_band(mech, p, sizes, trials):
    rate = two_sample_rate(mech, p, p, sizes, trials=trials, seed=sizes[0], n_draws=99)
    assert rate.within_band(ALPHA), f"{mech.name}: Type I {rate.rate:.3f}"


@pytest.mark.parametrize(
    "factory", [OptimizedUnaryEncoding, HadamardResponse, SubsetSelection, LocalHashing]
)
def test_detects_a_clear_difference_and_reports_its_calibration(factory):
    mech = factory(8, 2.0)
    rng = np.random.default_rng(5)
    a = Histogram(mech, 800, mech.simulate_histogram(800, np.full(8, 1 / 8), rng))
    b = Histogram(mech, 800, mech.simulate_histogram(800, zipf(8, 2.0), rng))
    result = two_sample(a, b, rng=6, n_draws=199)
    assert result.reject and result.calibration == "monte-carlo" and result.n_draws == 199
    permuted = factory is not HadamardResponse  # subset selection: d = 1 here
    null = "permutation" if permuted else "bootstrap"
    assert "support" in result.method and null in result.calibration_reason
    limit = two_sample(a, b, calibration="asymptotic")
    assert limit.calibration == "asymptotic" and 0 <= limit.pvalue < 0.01
    assert two_sample(a, a, rng=1, n_draws=99).pvalue > 0.5


@pytest.mark.slow
@pytest.mark.parametrize("factory", [HadamardResponse, OptimizedUnaryEncoding, LocalHashing])
def test_power_follows_simulation(factory):
    mech, sizes = factory(20, 1.0), (1500, 1000)
    p_a, p_b = np.full(20, 1 / 20), zipf(20, 1.0)
    predicted = two_sample_power(mech, p_a, p_b, sizes)
    rate = two_sample_rate(mech, p_a, p_b, sizes, trials=200, seed=3, n_draws=99)
    assert 0.2 < predicted < 0.95
    assert rate.close_to(predicted, points=0.1), (rate.rate, predicted)


def test_same_definition_is_checked():
    rng = np.random.default_rng(1)
    hr = HadamardResponse(8, 1.0)
    a = Histogram(hr, 100, hr.simulate_histogram(100, np.full(8, 1 / 8), rng))
    for other in (
        HadamardResponse(8, 2.0),
        OptimizedUnaryEncoding(8, 1.0),
        HadamardResponse(9, 1.0),
    ):
        b = Histogram(other, 100, other.simulate_histogram(100, np.full(other.k, 1 / other.k), rng))
        with pytest.raises(IncompatibleHistogramsError, match="same question definition"):
            two_sample(a, b)
