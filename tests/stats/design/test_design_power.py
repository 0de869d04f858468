"""Power of the design-based tests under a planned design effect (survey-design spec D.3, D.4):
reductions to the SRS plans, the dilution of the clustering part by local noise, bad input as
typed errors, and predicted power against simulated rejections of the Rao-Scott F test on
stratified cluster samples (binomial 99 % band)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from aggregator.errors import InvalidInputError
from aggregator.stats import k_sample_power, noncentrality, power
from aggregator.stats.design.cells import design_cells
from aggregator.stats.design.power import (
    DesignEffect,
    plan_goodness_of_fit,
    plan_independence,
    plan_k_sample,
    signal_share,
)
from aggregator.stats.design.rao_scott import design_goodness_of_fit
from aggregator.stats.design.simulation import TwoStageSetting
from client.mechanisms import FlipComponents, PublicCoinBit, RandomizedResponse

UNIFORM = np.full(4, 0.25)
TILTED = np.array([0.3, 0.3, 0.2, 0.2])


def test_without_a_design_effect_the_plans_are_the_srs_plans():
    rr = RandomizedResponse(k=4, epsilon=1.0)
    gof = plan_goodness_of_fit(rr, TILTED, UNIFORM, DesignEffect())
    assert gof.power(3000) == pytest.approx(power(rr, TILTED, 3000, null=UNIFORM), rel=1e-9)
    joint = np.array([0.3, 0.2, 0.2, 0.3])
    independence = plan_independence(rr, joint, (2, 2), DesignEffect())
    assert independence.nu_per_n == pytest.approx(noncentrality(rr, joint, 1, shape=(2, 2)))
    groups = [[0.4, 0.3, 0.2, 0.1], [0.3, 0.3, 0.25, 0.15]]
    two = plan_k_sample(rr, groups, [1, 1], DesignEffect())
    assert two.power(2000) == pytest.approx(k_sample_power(rr, groups, [1000, 1000]), rel=1e-9)


def test_a_design_effect_multiplies_the_reports_needed():
    rr = RandomizedResponse(k=4, epsilon=1.0)
    srs = plan_goodness_of_fit(rr, TILTED, UNIFORM, DesignEffect())
    designed = plan_goodness_of_fit(rr, TILTED, UNIFORM, DesignEffect(total=2.5))
    n = srs.sample_size(0.8)
    assert abs(designed.sample_size(0.8) - 2.5 * n) <= 3
    assert designed.power(2.5 * n) == pytest.approx(srs.power(n))
    # an F reference with few PSUs costs more reports than the chi-square
    assert designed.sample_size(0.8, design_df=10) > designed.sample_size(0.8)


def test_local_noise_dilutes_the_clustering_but_not_the_weighting():
    """k-RR, k = 4: signal share about 0.09 at epsilon 1, 0.38 at 2, 0.87 at 4 (spec D.4)."""
    shares = [signal_share(RandomizedResponse(4, e), UNIFORM) for e in (1.0, 2.0, 4.0)]
    np.testing.assert_allclose(shares, [0.090, 0.378, 0.866], atol=1e-3)
    assert signal_share(FlipComponents(4, 1.0), UNIFORM) < shares[0] * 2
    effect = DesignEffect(clustering=2.0, weighting=1.5)
    assert effect.privatized(shares[0]) == pytest.approx(1.5 * 1.09, abs=1e-3)
    assert effect.privatized(0.0) == 1.5  # pure noise: only the weights cost
    assert DesignEffect(total=1.8).privatized(0.1) == 1.8
    text = effect.describe(shares[0])
    assert "weighting 1.5" in text and "clustering 2" in text and "signal share 0.09" in text


@pytest.mark.parametrize(
    ("make", "text"),
    [
        (lambda: DesignEffect(clustering=0.0), "clustering must be a positive"),
        (lambda: DesignEffect(total=float("nan")), "total must be a positive"),
        (
            lambda: plan_goodness_of_fit(
                PublicCoinBit(4, 1.0, 0, 2), TILTED, UNIFORM, DesignEffect()
            ),
            "one-hot",
        ),
        (
            lambda: plan_goodness_of_fit(
                RandomizedResponse(4, 1.0), UNIFORM, UNIFORM, DesignEffect()
            ).sample_size(0.8),
            "equals the null",
        ),
        (
            lambda: plan_independence(RandomizedResponse(4, 1.0), TILTED, (3, 2), DesignEffect()),
            "does not match",
        ),
        (
            lambda: plan_k_sample(
                RandomizedResponse(4, 1.0), [TILTED.tolist()], [1], DesignEffect()
            ),
            "two",
        ),
    ],
)
def test_bad_plans_are_typed_errors(make, text):
    with pytest.raises(InvalidInputError, match=text):
        make()


def mean_size_ratio(m: int) -> tuple[float, float]:
    """TwoStageSetting's PSU sizes are uniform on m/2..3m/2: E[size^2] / E[size] (the cluster
    size behind a clustering effect) and E[size]."""
    sizes = np.arange(m // 2, 3 * m // 2 + 1)
    return float((sizes**2).mean() / sizes.mean()), float(sizes.mean())


@pytest.mark.parametrize(
    ("epsilon", "psus", "m", "concentration", "spread", "p1"),
    [
        (2.0, 40, 20, 4.0, 0.0, (0.33, 0.27, 0.22, 0.18)),  # clusters, ICC 0.2
        (4.0, 40, 10, 9.0, 0.4, (0.31, 0.27, 0.23, 0.19)),  # clusters and weights
        (1.0, 60, 15, np.inf, 0.5, (0.37, 0.26, 0.21, 0.16)),  # weights only
    ],
)
def test_predicted_power_matches_simulated_rejections(epsilon, psus, m, concentration, spread, p1):
    """Raw clustering 1 + ICC (E[m^2]/E[m] - 1), ICC = 1 / (concentration + 1); Kish's
    weighting effect exp(spread^2) of log-normal PSU weights; the default Rao-Scott F test
    (design df = PSUs - 1) rejects at the predicted rate within the binomial 99 % band."""
    rr = RandomizedResponse(k=4, epsilon=epsilon)
    ratio, mean_size = mean_size_ratio(m)
    effect = DesignEffect(1 + (ratio - 1) / (concentration + 1), float(np.exp(spread**2)))
    plan = plan_goodness_of_fit(rr, np.array(p1), UNIFORM, effect)
    predicted = plan.power(psus * mean_size, design_df=psus - 1)
    assert 0.3 < predicted < 0.9
    setting = TwoStageSetting((1.0,), (p1,), psus, m, concentration, spread)
    rng = np.random.default_rng(int(10 * epsilon))
    trials = 400
    rejected = sum(
        design_goodness_of_fit(design_cells(s.x_hat, s.design), rr, UNIFORM).reject
        for s in (setting.sample(rr, rng) for _ in range(trials))
    )
    low, high = stats.binom.interval(0.99, trials, predicted)
    assert low <= rejected <= high, (rejected / trials, predicted)
