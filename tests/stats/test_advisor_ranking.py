"""Issue 17: the advisor and sample_size rank every mechanism and test, T3 included, and stay
interactive at k = 1,024 (the support-count Pearson tests planned by the four-cumulant law)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from aggregator.errors import InvalidInputError
from aggregator.planning.study import plan_study
from aggregator.stats import advise, noncentrality, power, sample_size
from aggregator.stats.identity import raptor_power
from client.mechanisms import (
    HadamardResponse,
    LocalHashing,
    OptimizedUnaryEncoding,
    PublicCoinBit,
    SubsetSelection,
)

POWER = sys.modules["aggregator.stats.power"]


def halves(k: int) -> tuple[np.ndarray, np.ndarray]:
    p0 = np.full(k, 1 / k)
    return p0, p0 + 0.2 / k * np.where(np.arange(k) < k // 2, 1.0, -1.0)


@pytest.mark.slow
@pytest.mark.parametrize(
    "factory", [OptimizedUnaryEncoding, HadamardResponse, SubsetSelection, LocalHashing]
)
def test_four_cumulant_plan_matches_the_exact_weighted_chi_square(factory, monkeypatch):
    mech = factory(128, 1.0)
    p0, alt = halves(128)
    approximate = sample_size(mech, alt, null=p0)
    approximate_nu = noncentrality(mech, alt, approximate, null=p0)
    small = factory(4, 1.0)
    tilt = np.array([0.3, 0.2, 0.25, 0.25])
    small_powers = [power(small, tilt, n, null=np.full(4, 0.25)) for n in (2000, 20000)]
    monkeypatch.setattr(POWER, "EXACT_SUPPORT_PLAN", 10**6)
    assert sample_size(mech, alt, null=p0) == pytest.approx(approximate, rel=1e-3)
    assert noncentrality(mech, alt, approximate, null=p0) == pytest.approx(approximate_nu, rel=1e-9)
    exact = [power(small, tilt, n, null=np.full(4, 0.25)) for n in (2000, 20000)]
    assert small_powers == pytest.approx(exact, abs=2e-3)


def test_t3_is_planned_by_raptor_power():
    k = 1024
    p0, alt = halves(k)
    mech = PublicCoinBit(k, 1.0, 7, 5)
    n = sample_size(mech, alt, null=p0)
    d2 = float(np.sum((alt - p0) ** 2))
    assert raptor_power(k, 1.0, n, d2, 5, 0.05) >= 0.8 > raptor_power(k, 1.0, n - 1, d2, 5, 0.05)
    assert power(mech, alt, n, null=p0) == pytest.approx(raptor_power(k, 1.0, n, d2, 5, 0.05))
    with pytest.raises(InvalidInputError, match=r"goodness of fit \(T3\) only"):
        power(mech, np.full(4, 0.25), 100, shape=(2, 2))


@pytest.mark.timeout(300)  # about 1 s on one core; its speed is not asserted on a shared machine
def test_advisor_at_k_1024_ranks_everything():
    p0, alt = halves(1024)
    ranked = advise(1024, 1.0, alt, 10**7, null=p0)
    tests = {(a.mechanism.name, a.method) for a in ranked}
    assert len(tests) == len(ranked) == 15  # 8 default tests, 6 U-statistics, T3
    pure = [a for a in ranked if a.mechanism.name != "gaussian"]  # Gaussian: a weaker guarantee
    assert pure[0].method == "t3"  # public coins: the k rate
    assert [a.power for a in ranked] == sorted((a.power for a in ranked), reverse=True)


@pytest.mark.slow
def test_plan_ranks_every_test_with_its_own_figure():
    p0, alt = halves(512)
    plan = plan_study(k=512, epsilon=1.0, alternative=alt, null=p0, target_power=0.8)
    assert next(row.method for row in plan.rows if row.mechanism.name != "gaussian") == "t3"
    for row in plan.rows:
        method = row.method or None
        assert row.n == sample_size(row.mechanism, alt, null=p0, method=method)
    assert {"t1", "t2", "t3", "pearson"} <= {row.method for row in plan.rows}
