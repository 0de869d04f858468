"""Planning matches the test as it is run: where the calibrated test simulates its null, power()
simulates that test, and agrees with the rejection rate of goodness_of_fit / independence
themselves (issue 11: the noncentral chi-square said 0.98 where the test as run had 0.79)."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.stats import power, sample_size
from aggregator.stats.studies import (
    gof_runner,
    independence_runner,
    rejection_rate,
    skewed_table,
    zipf,
)
from client.mechanisms import LaplaceNoise, RandomizedResponse

pytestmark = pytest.mark.slow  # a statistical validation (docs/validation.md)

K = 256
P0 = np.full(K, 1 / K)
P1 = 0.5 * zipf(K) + 0.5 * P0
MECH = RandomizedResponse(K, 6.0)


def test_power_is_the_power_of_the_calibrated_test():
    planned = power(MECH, P1, 100, null=P0)
    asymptotic = power(MECH, P1, 100, null=P0, calibration="asymptotic")
    rate = rejection_rate(MECH, P1, 100, gof_runner(P0, None, n_draws=199), 300, seed=7)
    assert rate.close_to(planned, points=0.05), (rate.rate, planned)
    assert not rate.close_to(asymptotic, points=0.05), (rate.rate, asymptotic)


def test_sample_size_reaches_the_power_as_run():
    n = sample_size(MECH, P1, null=P0, power=0.8)
    assert n != sample_size(MECH, P1, null=P0, power=0.8, calibration="asymptotic")
    rate = rejection_rate(MECH, P1, n, gof_runner(P0, None, n_draws=199), 300, seed=8)
    assert rate.close_to(0.8, points=0.06), (n, rate.rate)


def test_bootstrap_independence_power_is_simulated():
    shape = (5, 4)
    null = skewed_table(shape)
    alternative = null + 0.02 * np.outer([1, -1, 0, 0, 0], [1, -1, 0, 0]).ravel()
    mech = LaplaceNoise(20, 2.0)
    planned = power(mech, alternative, 5000, shape=shape)
    rate = rejection_rate(
        mech, alternative, 5000, independence_runner(shape, None, n_draws=99), 120, seed=9
    )
    assert rate.close_to(planned, points=0.08), (rate.rate, planned)
