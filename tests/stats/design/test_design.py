"""Design-based estimates and tests (survey-design spec D.2-D.4): reductions to the SRS case,
replicate variances against linearization, the split of the design effect, and bad input as
typed errors. Agreement with R is tests/stats/design/test_design_r.py; validity by simulation is
tests/stats/design/test_design_validation.py."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats import (
    Design,
    design_cells,
    design_estimate,
    design_goodness_of_fit,
    design_independence,
    design_k_sample,
    goodness_of_fit,
    post_stratified_estimate,
)
from aggregator.stats.channel import debiased
from aggregator.stats.design.cells import contributions, indicators
from aggregator.stats.design.simulation import TwoStageSetting
from client.mechanisms import (
    FlipComponents,
    GaussianNoise,
    HadamardResponse,
    LaplaceNoise,
    LocalHashing,
    OptimizedUnaryEncoding,
    PublicCoinBit,
    RandomizedResponse,
    SubsetSelection,
)

RR = RandomizedResponse(k=4, epsilon=2.0)
CLUSTERED = TwoStageSetting(
    shares=(0.6, 0.4),
    distributions=((0.4, 0.3, 0.2, 0.1), (0.1, 0.2, 0.3, 0.4)),
    psus=15,
    psu_size=30,
    concentration=3.0,
    weight_spread=0.5,
)


def srs_sample(mechanism, n: int, seed: int):
    rng = np.random.default_rng(seed)
    answers = rng.choice(4, size=n, p=[0.4, 0.3, 0.2, 0.1])
    return contributions(mechanism, mechanism.simulate(answers, rng)), Design.simple(n)


@pytest.mark.parametrize(
    "mechanism",
    [
        RandomizedResponse(k=4, epsilon=1.0),
        FlipComponents(k=4, epsilon=1.0),
        GaussianNoise(k=4, rho=0.5),
        LaplaceNoise(k=4, epsilon=1.0),
        OptimizedUnaryEncoding(k=4, epsilon=1.0),
        HadamardResponse(k=4, epsilon=1.0),
        SubsetSelection(k=4, epsilon=1.0),
        LocalHashing(k=4, epsilon=1.0),
    ],
    ids=lambda m: m.name,
)
def test_every_mechanisms_contributions_are_unbiased_and_sum_to_its_estimate(mechanism):
    rng = np.random.default_rng(8)
    p = np.array([0.4, 0.3, 0.2, 0.1])
    decoded = mechanism.simulate(rng.choice(4, size=40_000, p=p), rng)
    x_hat = contributions(mechanism, decoded)
    values = mechanism.statistic_values(mechanism.statistic_sums(decoded))
    np.testing.assert_allclose(x_hat.mean(axis=0), debiased(values, len(x_hat), mechanism))
    z = (x_hat.mean(axis=0) - p) / (x_hat.std(axis=0) / np.sqrt(len(x_hat)))
    assert np.all(np.abs(z) < 4.5), z


@pytest.mark.parametrize(
    "mechanism",
    [
        RandomizedResponse(k=4, epsilon=1.0),
        FlipComponents(k=4, epsilon=1.0),
        GaussianNoise(k=4, rho=0.5),
    ],
    ids=lambda m: m.name,
)
def test_under_srs_the_uncorrected_statistic_is_the_local_tests(mechanism):
    """Spec D.3: with a simple random sample the design test's quadratic form is the local
    test's (Pearson on privatized counts, T_FC, the projected Gaussian statistic)."""
    rng = np.random.default_rng(9)
    decoded = mechanism.simulate(rng.choice(4, size=2000, p=[0.4, 0.3, 0.2, 0.1]), rng)
    hist = Histogram(mechanism, 2000, mechanism.statistic_values(mechanism.statistic_sums(decoded)))
    p0 = np.full(4, 0.25)
    local = goodness_of_fit(hist, p0, calibration="asymptotic")
    design = design_goodness_of_fit(
        design_cells(contributions(mechanism, decoded), Design.simple(2000)), mechanism, p0
    )
    np.testing.assert_allclose(design.pearson, local.statistic, rtol=1e-10)


def test_simple_random_sample_gives_the_srs_mean_and_no_design_effect():
    x_hat, design = srs_sample(RR, 20_000, 1)
    est = design_estimate(design_cells(x_hat, design), RR)
    np.testing.assert_allclose(est.estimate[0], x_hat.mean(axis=0), rtol=1e-12)
    # with-replacement SRS: the variance is the sample covariance over n (to n / (n - 1))
    expected = np.cov(x_hat.T) / len(x_hat)
    np.testing.assert_allclose(est.covariance, expected, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(est.deff, 1.0, rtol=1e-9)
    np.testing.assert_allclose(est.weighting_effect, 1.0)
    # the model design effect estimates 1 (sampling error of a variance: a few percent)
    assert np.all(np.abs(est.deff_model - 1) < 0.06)


def test_srs_rao_scott_eigenvalues_are_near_one():
    mechanism = GaussianNoise(k=4, rho=1.0)
    x_hat, design = srs_sample(mechanism, 20_000, 2)
    result = design_goodness_of_fit(
        design_cells(x_hat, design), mechanism, np.array([0.4, 0.3, 0.2, 0.1])
    )
    assert result.dof == 3
    assert np.all(np.abs(result.eigenvalues - 1) < 0.1)


def test_design_effect_splits_into_weighting_and_clustering():
    rng = np.random.default_rng(3)
    sample = CLUSTERED.sample(RR, rng)
    est = design_estimate(design_cells(sample.x_hat, sample.design), RR)
    w = sample.design.weights
    kish = len(w) * np.sum(w**2) / np.sum(w) ** 2
    np.testing.assert_allclose(est.weighting_effect, [kish])
    np.testing.assert_allclose(est.clustering_effect * kish, est.deff_model)
    # local noise dilutes clustering: the answers' own clustering effect is larger
    assert np.all(est.signal_share < 1)
    assert np.all(
        est.raw_clustering_effect[est.clustering_effect > 1]
        > est.clustering_effect[est.clustering_effect > 1]
    )
    low, high = est.intervals(0.95)
    assert np.all(low < est.estimate) and np.all(est.estimate < high)


def test_replicate_variances_agree_with_linearization():
    sample = CLUSTERED.sample(RR, np.random.default_rng(4))
    design_cells_ = design_cells(sample.x_hat, sample.design)
    linear = design_estimate(design_cells_, RR).standard_error
    jackknife = design_estimate(design_cells_, RR, method="jackknife").standard_error
    bootstrap = design_estimate(design_cells_, RR, method="bootstrap", replicates=1000, seed=1)
    # the jackknife of a smooth ratio is linearization to first order; the bootstrap to its
    # Monte Carlo error (1000 replicates: about 2 % on a standard error)
    np.testing.assert_allclose(jackknife, linear, rtol=0.03)
    np.testing.assert_allclose(bootstrap.standard_error, linear, rtol=0.12)


def test_cells_are_additive_so_a_store_can_keep_them():
    """Cells of two batches with disjoint PSUs stack into the cells of the whole sample."""
    sample = CLUSTERED.sample(RR, np.random.default_rng(5))
    whole = design_cells(sample.x_hat, sample.design)
    stratum = np.asarray(sample.design.strata)
    parts = [
        design_cells(
            sample.x_hat[stratum == h],
            Design(
                stratum[stratum == h],
                sample.design.clusters[stratum == h],
                sample.design.weights[stratum == h],
            ),
        )
        for h in (0, 1)
    ]
    np.testing.assert_allclose(np.concatenate([p.total for p in parts]), whole.total)
    np.testing.assert_allclose(np.concatenate([p.weight for p in parts]), whole.weight)


def test_every_correction_gives_a_p_value_and_names_the_design():
    sample = CLUSTERED.sample(RR, np.random.default_rng(6))
    cells = design_cells(sample.x_hat, sample.design)
    for correction in ("F", "second-order", "first-order", "wald"):
        result = design_goodness_of_fit(
            cells, RR, CLUSTERED.population_distribution(), correction=correction
        )
        assert 0 <= result.pvalue <= 1
        assert "2 strata, 30 PSUs, 28 design degrees of freedom" in result.summary()
        assert result.to_dict()["design_df"] == 28
        assert ("F(" in result.summary()) == (correction in ("F", "wald"))
    sample = replace(CLUSTERED, concentration=20.0).sample(RR, np.random.default_rng(6))
    domains = design_cells(sample.x_hat, sample.design, sample.design.strata, 2)
    result = design_k_sample(domains, RR)
    assert result.reject  # the strata differ
    # clustering inflates the variance: the corrected p-value is larger than the SRS one
    assert result.pvalue > stats.chi2.sf(result.pearson, result.dof)


@pytest.mark.parametrize(
    ("make", "error", "text"),
    [
        (
            lambda: Design(np.zeros(3), np.arange(3), np.array([1.0, -1.0, 1.0])),
            InvalidInputError,
            "positive",
        ),
        (lambda: Design(np.zeros(3), np.arange(2), np.ones(3)), InvalidInputError, "clusters"),
        (
            lambda: design_cells(
                np.ones((3, 4)),
                Design(np.zeros(3), np.arange(3), np.ones(3), np.array([5.0, 6.0, 5.0])),
            ),
            InvalidInputError,
            "constant within a stratum",
        ),
        (
            lambda: design_cells(
                np.ones((3, 4)), Design(np.zeros(3), np.arange(3), np.ones(3), np.full(3, 2.0))
            ),
            InvalidInputError,
            "population of 2",
        ),
        (
            lambda: design_estimate(
                design_cells(
                    np.eye(4)[[0, 1, 2, 3]], Design(np.arange(4), np.arange(4), np.ones(4))
                ),
                None,
            ),
            InsufficientDataError,
            "single PSU",
        ),
        (
            lambda: design_cells(np.full((2, 4), np.nan), Design.simple(2)),
            InvalidInputError,
            "finite",
        ),
        (
            lambda: contributions(
                PublicCoinBit(k=4, epsilon=1.0, public_seed=1, groups=4), np.zeros((1, 2))
            ),
            InvalidInputError,
            "no per-report contribution",
        ),
    ],
)
def test_bad_input_is_a_typed_error(make, error, text):
    with pytest.raises(error, match=text):
        make()


def test_post_stratification_weights_the_post_strata_means_by_their_population_shares():
    """Agreement with R's postStratify is tests/stats/design/test_design_r.py; here the
    definition."""
    rng = np.random.default_rng(10)
    sample = CLUSTERED.sample(RR, rng)
    by_stratum = design_cells(sample.x_hat, sample.design, sample.design.strata, 2)
    result = post_stratified_estimate(by_stratum, np.array([600.0, 400.0]))
    means = design_estimate(by_stratum, RR).estimate
    np.testing.assert_allclose(result.estimate, 0.6 * means[0] + 0.4 * means[1])
    low, high = result.intervals()
    assert np.all(low < result.estimate) and np.all(result.estimate < high)
    with pytest.raises(InvalidInputError, match="one per post-stratum"):
        post_stratified_estimate(by_stratum, np.array([1.0, 2.0, 3.0]))
    with pytest.raises(InvalidInputError, match="positive"):
        post_stratified_estimate(by_stratum, np.array([1.0, 0.0]))


def test_bad_test_arguments_are_typed_errors():
    x_hat, design = srs_sample(RR, 200, 7)
    cells = design_cells(x_hat, design)
    with pytest.raises(InvalidInputError, match="correction"):
        design_goodness_of_fit(cells, RR, np.full(4, 0.25), correction="third-order")
    with pytest.raises(InvalidInputError, match="p0"):
        design_goodness_of_fit(cells, RR, np.array([0.5, 0.5, 0.0, 0.0]))
    with pytest.raises(InvalidInputError, match="rows x columns"):
        design_independence(cells, RR, 3, 2)
    with pytest.raises(InvalidInputError, match="2 domains"):
        design_k_sample(cells, RR)
    with pytest.raises(InvalidInputError, match="variance method"):
        design_estimate(cells, RR, method="balanced")


def test_a_category_never_chosen_has_no_design_effect_and_no_warning():
    design = Design(np.repeat([0, 1], 4), np.tile([0, 0, 1, 1], 2), np.arange(1.0, 9.0))
    x_hat = indicators(np.array([0, 1, 0, 1, 1, 0, 2, 2]), 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = design_estimate(design_cells(x_hat, design), None)
    assert np.isnan(est.deff[0, 3]) and np.isnan(est.deff_model[0, 3])
    assert np.all(np.isfinite(est.deff[0, :3]))
