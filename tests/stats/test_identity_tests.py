"""The rate-optimal identity tests of spec large-domain §3: T1 (flip components), T2 (any
finite-output channel; k-RR and a hand-made channel), T3 (RAPTOR, grouped chi-square).

The spec's exact mean and null variance of T1/T2 are checked against simulation, their Monte
Carlo p-values keep Type I inside the 99% binomial band, and power() follows simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats import advise, goodness_of_fit, noncentrality, power, sample_size
from aggregator.stats.identity import (
    channel_matrix,
    channel_test,
    raptor_power,
    raptor_test,
    u_moments,
    u_statistic,
)
from aggregator.stats.studies import (
    RejectionRate,
    gof_runner,
    raptor_rate,
    rejection_rate,
    zipf,
)
from client.mechanisms import FlipComponents, RandomizedResponse

ALPHA = 0.05
K = 40
P0 = np.full(K, 1 / K)
ALT = P0 + 0.006 * np.where(np.arange(K) < K // 2, 1.0, -1.0)  # ||Delta||_1 = 0.24
STRONG = P0 + 0.018 * np.where(np.arange(K) < K // 2, 1.0, -1.0)


@pytest.mark.parametrize(
    ("mech", "method"), [(FlipComponents(K, 1.0), "t1"), (RandomizedResponse(K, 2.0), "t2")]
)
@pytest.mark.parametrize("truth", ["null", "alternative"])
def test_mean_and_variance_match_the_spec(mech, method, truth):
    """E T = n(n-1) ||W Delta||^2 exactly; Var0 T = 2n(n-1)||C0||_F^2; Var1 adds the linear
    term. 4,000 replicates: the mean within 4 s.e., the s.d. within 6%."""
    n, reps = 1500, 4000
    p1 = P0 if truth == "null" else ALT
    draws = mech.simulate_histogram(n, p1, np.random.default_rng(3), size=reps)
    t = u_statistic(draws, n, mech.report_mean(P0))
    m = u_moments(mech, method, P0, p1)
    pairs = n * (n - 1)
    sd = math.sqrt(2 * pairs * m.trace1_sq + 4 * pairs * (n - 1) * m.linear)
    if truth == "null":
        assert sd == pytest.approx(math.sqrt(2 * pairs * m.trace0_sq))
        assert m.trace0 == pytest.approx(np.trace(mech.report_covariance(P0)))
    assert abs(t.mean() - pairs * m.mean) < 4 * sd / math.sqrt(reps), (t.mean(), pairs * m.mean)
    assert t.std() == pytest.approx(sd, rel=0.06)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mech", "method", "p0", "n"),
    [
        (FlipComponents(64, 1.0), "t1", np.full(64, 1 / 64), 1000),
        (FlipComponents(256, 0.5), "t1", zipf(256), 300),
        (RandomizedResponse(64, 1.0), "t2", np.full(64, 1 / 64), 1000),
        (RandomizedResponse(256, 4.0), "t2", zipf(256), 200),
    ],
    ids=["t1 uniform", "t1 zipf sparse", "t2 uniform", "t2 zipf sparse"],
)
def test_type1_inside_band(mech, method, p0, n):
    rate = rejection_rate(mech, p0, n, gof_runner(p0, method, n_draws=99), trials=300, seed=n)
    assert rate.within_band(ALPHA), f"{method}: Type I {rate.rate:.3f}"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mech", "method", "n"),
    [(FlipComponents(K, 1.0), "t1", 5400), (RandomizedResponse(K, 2.0), "t2", 1800)],
)
def test_power_follows_simulation(mech, method, n):
    predicted = power(mech, STRONG, n, null=P0, method=method)
    rate = rejection_rate(mech, STRONG, n, gof_runner(P0, method, n_draws=199), trials=200, seed=9)
    assert 0.3 < predicted < 0.9
    assert rate.close_to(predicted, points=0.08), (rate.rate, predicted)
    needed = sample_size(mech, STRONG, null=P0, method=method, power=predicted)
    assert abs(needed - n) <= 2
    assert noncentrality(mech, STRONG, n, null=P0, method=method) > 0


def test_t1_result_and_asymptotic_option():
    mech = FlipComponents(K, 1.0)
    hist = Histogram(mech, 500, mech.simulate_histogram(500, P0, np.random.default_rng(1)))
    result = goodness_of_fit(hist, P0, method="t1", rng=2)
    assert result.calibration == "monte-carlo" and result.n_draws == 999 and result.dof is None
    assert "T1" in result.method and "always simulate" in result.calibration_reason
    normal = goodness_of_fit(hist, P0, method="t1", calibration="asymptotic")
    assert normal.calibration == "asymptotic" and 0 < normal.pvalue <= 1
    assert goodness_of_fit(hist, P0, method="t1", rng=2).pvalue == result.pvalue


def test_t2_on_randomized_response_equals_the_channel_test():
    mech = RandomizedResponse(8, 1.0)
    hist = Histogram(mech, 400, mech.simulate_histogram(400, zipf(8), np.random.default_rng(4)))
    via_gof = goodness_of_fit(hist, zipf(8), method="t2", rng=5)
    via_channel = channel_test(hist.values, channel_matrix(mech), zipf(8), rng=5)
    assert via_gof.statistic == pytest.approx(via_channel.statistic)
    assert via_gof.pvalue == via_channel.pvalue


def test_t2_on_a_generic_channel_keeps_its_level_and_detects():
    """A channel with more outputs than inputs (as Hadamard response or subset selection have):
    the Type I of channel_test is in the band and it rejects a clear alternative."""
    rng = np.random.default_rng(6)
    k, outputs, n = 16, 32, 800
    w = rng.dirichlet(np.ones(outputs), size=k).T  # columns: P(output | answer)
    p0 = np.full(k, 1 / k)
    p1 = zipf(k)
    rejections = [0, 0]
    for _ in range(300):
        for j, truth in enumerate((p0, p1)):
            counts = rng.multinomial(n, w @ truth)
            rejections[j] += channel_test(counts, w, p0, rng=rng, n_draws=99).reject
    assert RejectionRate(rejections[0], 300).within_band(ALPHA), rejections
    assert rejections[1] > 150


@pytest.mark.slow
def test_t3_type1_and_power():
    k, eps, groups, n = 64, 1.0, 10, 4000
    p0 = np.full(k, 1 / k)
    p1 = p0 + 0.008 * np.where(np.arange(k) < k // 2, 1.0, -1.0)
    null = raptor_rate(k, eps, groups, n, p0, p0, trials=300, seed=8, n_draws=99)
    alt = raptor_rate(k, eps, groups, n, p1, p0, trials=300, seed=9, n_draws=99)
    assert null.within_band(ALPHA), null
    predicted = raptor_power(k, eps, n, float(np.sum((p1 - p0) ** 2)), groups, ALPHA)
    assert alt.close_to(predicted, points=0.1), (alt.rate, predicted)


def test_t3_sparse_null_keeps_its_level():
    k = 256
    p0 = zipf(k)
    rate = raptor_rate(k, 0.5, 20, 300, p0, p0, trials=300, seed=10, n_draws=99)
    assert rate.within_band(ALPHA), rate


def test_advisor_ranks_every_mechanism_and_test_by_default():
    """Issue 17: the rate-optimal tests are ranked unless u_statistics=False leaves them out."""
    k = 256
    p0 = np.full(k, 1 / k)
    alt = p0 + 0.2 / k * np.where(np.arange(k) < k // 2, 1.0, -1.0)
    ranked = advise(k, 1.0, alt, 20_000, null=p0)
    classic = advise(k, 1.0, alt, 20_000, null=p0, u_statistics=False)
    assert {a.method for a in classic}.isdisjoint({"t1", "t2", "t3"})
    assert {"t1", "t2", "t3"} <= {a.method for a in ranked}
    assert len({a.mechanism.name for a in classic}) == 8
    assert [a.power for a in ranked] == sorted((a.power for a in ranked), reverse=True)


def test_bad_inputs_are_typed_errors():
    masks = np.zeros((2, 4), dtype=bool)
    masks[:, :2] = True
    p0 = np.full(4, 0.25)
    with pytest.raises(InvalidInputError):
        raptor_test([5, 3], [4, 4], masks, p0, 1.0)  # a sum above its group size
    with pytest.raises(InvalidInputError):
        raptor_test([1, 1], [4, 4], masks.astype(int), p0, 1.0)
    with pytest.raises(InvalidInputError):
        raptor_test([1, 1], [4, 4], masks, p0, -1.0)
    with pytest.raises(InvalidInputError):
        raptor_test([0, 0], [0, 0], masks, p0, 1.0)
    with pytest.raises(InvalidInputError):
        channel_test([1, 2, 3], np.full((3, 4), 0.5), p0)  # columns do not sum to 1
    with pytest.raises(InvalidInputError):
        channel_test([1, 2], np.full((3, 4), 1 / 3), p0)
    with pytest.raises(InvalidInputError):
        channel_matrix(FlipComponents(4, 1.0))
    mech = FlipComponents(4, 1.0)
    with pytest.raises(InvalidInputError):
        goodness_of_fit(Histogram(mech, 1, [1, 0, 0, 0]), p0, method="t1")
    with pytest.raises(InvalidInputError):
        goodness_of_fit(Histogram(mech, 5, [1, 0, 0, 0]), p0, method="t2")
