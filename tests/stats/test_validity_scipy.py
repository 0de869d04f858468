"""With privacy switched off (epsilon or rho huge), the local tests agree with SciPy's classical
chi-square tests; plus the curator-model regression check of the source's Table 3."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from aggregator.histogram import Histogram
from aggregator.stats import goodness_of_fit, independence
from aggregator.stats.gof import imhof_matrix
from aggregator.stats.imhof import weighted_chi2_isf, weighted_chi2_sf
from client.mechanisms import FlipComponents, GaussianNoise, LaplaceNoise, RandomizedResponse

pytestmark = pytest.mark.slow  # a statistical validation (docs/validation.md)

# Parameters at which the randomizers almost surely leave every answer untouched.
NO_PRIVACY = [
    (lambda k: RandomizedResponse(k, 60.0), "pearson", "min-chi-square"),
    (lambda k: FlipComponents(k, 120.0), "projected", "projected"),
    (lambda k: GaussianNoise(k, 1e8), "projected", "projected"),
    (lambda k: LaplaceNoise(k, 1e5), "monte-carlo", "bootstrap"),
]


@pytest.mark.parametrize(("factory", "gof_method", "_"), NO_PRIVACY)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_gof_agrees_with_scipy_chisquare(factory, gof_method, _, seed):
    rng = np.random.default_rng(seed)
    p0 = np.array([0.1, 0.2, 0.3, 0.15, 0.25])
    truth = rng.choice(5, size=3000, p=[0.12, 0.18, 0.3, 0.15, 0.25])
    mech = factory(5)
    hist = Histogram.from_reports(mech, mech.simulate(truth, rng))
    counts = np.bincount(truth, minlength=5)
    expected = stats.chisquare(counts, 3000 * p0)
    result = goodness_of_fit(hist, p0, method=gof_method, rng=seed, n_draws=1999)
    assert result.statistic == pytest.approx(expected.statistic, rel=1e-6)
    tolerance = 0.025 if gof_method == "monte-carlo" else 1e-6
    assert result.pvalue == pytest.approx(expected.pvalue, rel=1e-6, abs=tolerance)


@pytest.mark.parametrize(("factory", "_", "method"), NO_PRIVACY)
@pytest.mark.parametrize("shape", [(2, 2), (3, 4)])
def test_independence_agrees_with_scipy_chi2_contingency(factory, _, method, shape):
    rng = np.random.default_rng(sum(shape))
    r, c = shape
    p = np.outer(rng.dirichlet(np.ones(r) * 5), rng.dirichlet(np.ones(c) * 5)).ravel()
    p = 0.9 * p + 0.1 * rng.dirichlet(np.ones(r * c) * 5)  # dependent, so the statistic is large
    truth = rng.choice(r * c, size=4000, p=p)
    mech = factory(r * c)
    hist = Histogram.from_reports(mech, mech.simulate(truth, rng))
    table = np.bincount(truth, minlength=r * c).reshape(r, c)
    expected = stats.chi2_contingency(table, correction=False)
    result = independence(hist, shape, method=method, rng=1, n_draws=999)
    assert result.statistic == pytest.approx(expected.statistic, rel=1e-5)
    if method == "bootstrap":
        assert result.dof is None
        assert result.pvalue == pytest.approx(expected.pvalue, abs=0.04)
    else:
        assert result.dof == expected.dof
        assert result.pvalue == pytest.approx(expected.pvalue, rel=1e-4, abs=1e-9)


def test_imhof_reproduces_source_table_3():
    """d = 100, uniform p0, curator rho_c = 0.00125: tau = 10070.47, 1117.85, 222.64, 133.16."""
    p0 = np.full(100, 0.01)
    printed = {1e3: 10070.47, 1e4: 1117.85, 1e5: 222.64, 1e6: 133.16}
    for n, tau in printed.items():
        weights = np.linalg.eigvalsh(imhof_matrix(p0, 1 / (n * 0.00125)))
        assert weighted_chi2_isf(0.05, weights) == pytest.approx(tau, abs=0.006)


def test_imhof_matches_central_and_noncentral_chi_square():
    for x in (0.5, 3.0, 11.07, 25.0):
        assert weighted_chi2_sf(x, np.ones(5)) == pytest.approx(stats.chi2.sf(x, 5), abs=1e-9)
    delta = np.array([2.0, 1.0, 0.5])
    assert weighted_chi2_sf(15.0, np.ones(3), delta) == pytest.approx(
        stats.ncx2.sf(15.0, 3, delta.sum()), abs=1e-9
    )
    # Unequal weights against a large Monte Carlo sample.
    rng = np.random.default_rng(0)
    weights = np.array([3.0, 1.0, 0.2])
    draws = (rng.chisquare(1, size=(400_000, 3)) * weights).sum(axis=1)
    assert weighted_chi2_sf(9.0, weights) == pytest.approx(np.mean(draws > 9.0), abs=0.003)
