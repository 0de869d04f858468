"""Issue 17 item 2: T2 on Hadamard response (and the same U-statistic on the support counts of
the other support-count mechanisms), from the stored support counts, with an exact Monte Carlo
null and a power prediction."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.histogram import Histogram
from aggregator.stats import goodness_of_fit, power, sample_size
from aggregator.stats.identity import channel_test, u_statistic
from aggregator.stats.studies import gof_runner, rejection_rate, zipf
from client.mechanisms import (
    HadamardResponse,
    LocalHashing,
    OptimizedUnaryEncoding,
    SubsetSelection,
)
from client.mechanisms.hadamard import fwht

ALPHA = 0.05
K = 40
P0 = np.full(K, 1 / K)
STRONG = P0 + 0.018 * np.where(np.arange(K) < K // 2, 1.0, -1.0)


def test_hr_support_statistic_is_t2_on_the_column_counts_when_no_row_is_spare():
    """k = K - 1: by Parseval, T2 on the K column counts equals 4/K times the statistic on the
    support counts (the other rows of H carry no signal and only exist when k < K - 1)."""
    mech = HadamardResponse(7, 1.0)
    size = mech.columns
    rows = np.sign(fwht(np.eye(size)))  # H[r, c]
    t = 2 * mech.slope
    channel = (1 + t * rows[1 : mech.k + 1].T) / size  # W[c, j] = P(column c | answer j)
    p0 = zipf(7)
    answers = np.random.default_rng(1).choice(7, 500, p=zipf(7)[::-1])
    counts = np.bincount(mech.simulate(answers, np.random.default_rng(2)), minlength=size)
    support = mech.counts_support(counts)
    on_support = float(u_statistic(support, 500, mech.report_mean(p0)))
    on_columns = channel_test(counts, channel, p0, rng=0).statistic
    assert on_columns == pytest.approx(4 / size * on_support, rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mech", "method", "p0", "n"),
    [
        (HadamardResponse(64, 1.0), "t2", np.full(64, 1 / 64), 1000),
        (HadamardResponse(200, 2.0), "t2", zipf(200), 300),
        (OptimizedUnaryEncoding(64, 1.0), "t1", zipf(64), 500),
    ],
    ids=["hr uniform", "hr zipf sparse", "oue zipf"],
)
def test_type1_inside_band(mech, method, p0, n):
    rate = rejection_rate(mech, p0, n, gof_runner(p0, method, n_draws=99), trials=300, seed=n)
    assert rate.within_band(ALPHA), f"{mech.name} {method}: Type I {rate.rate:.3f}"


@pytest.mark.slow
@pytest.mark.parametrize(("mech", "n"), [(HadamardResponse(K, 1.0), 6000)])
def test_power_follows_simulation(mech, n):
    predicted = power(mech, STRONG, n, null=P0, method="t2")
    rate = rejection_rate(mech, STRONG, n, gof_runner(P0, "t2", n_draws=199), trials=200, seed=9)
    assert 0.3 < predicted < 0.9
    assert rate.close_to(predicted, points=0.08), (rate.rate, predicted)
    assert abs(sample_size(mech, STRONG, null=P0, method="t2", power=predicted) - n) <= 2


@pytest.mark.parametrize(
    ("mech", "method"),
    [
        (HadamardResponse(16, 1.0), "t2"),
        (SubsetSelection(16, 1.0), "t2"),
        (LocalHashing(16, 1.0), "t2"),
        (OptimizedUnaryEncoding(16, 1.0), "t1"),
    ],
)
def test_result_shape_and_asymptotic_option(mech, method):
    p0 = np.full(16, 1 / 16)
    values = mech.simulate_histogram(400, zipf(16, 2.0), np.random.default_rng(3))
    hist = Histogram(mech, 400, values)
    result = goodness_of_fit(hist, p0, method=method, rng=4, n_draws=199)
    assert result.calibration == "monte-carlo" and result.dof is None and 0 < result.pvalue <= 1
    assert method.upper() in result.method and result.reject  # a clear alternative
    normal = goodness_of_fit(hist, p0, method=method, calibration="asymptotic")
    assert normal.calibration == "asymptotic" and 0 <= normal.pvalue <= 1
