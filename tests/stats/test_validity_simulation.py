"""Per-user randomizers and the fast aggregate sampler agree in distribution, and the
estimator's variance matches its closed form within sampling error."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from aggregator.histogram import Histogram
from aggregator.stats import estimate, goodness_of_fit
from aggregator.stats.estimate import estimate_covariance
from aggregator.stats.studies import draw_histogram
from client.mechanisms import FlipComponents, GaussianNoise, LaplaceNoise, RandomizedResponse

pytestmark = pytest.mark.slow  # a statistical validation (docs/validation.md)

P = np.array([0.4, 0.3, 0.2, 0.1])
MECHANISMS = [
    RandomizedResponse(4, 1.0),
    FlipComponents(4, 1.0),
    GaussianNoise(4, 0.5),
    LaplaceNoise(4, 1.0),
]
IDS = [m.name for m in MECHANISMS]


@pytest.mark.parametrize("mech", MECHANISMS, ids=IDS)
def test_per_user_and_aggregate_sampler_agree(mech):
    """Two-sample KS on every coordinate and on the GOF statistic, 400 studies each."""
    rng = np.random.default_rng(12)
    studies = 400
    per_user = [draw_histogram(mech, P, 1500, rng, per_user=True) for _ in range(studies)]
    aggregate = [draw_histogram(mech, P, 1500, rng) for _ in range(studies)]
    a = np.array([h.values for h in per_user])
    b = np.array([h.values for h in aggregate])
    for j in range(4):
        assert stats.ks_2samp(a[:, j], b[:, j]).pvalue > 1e-3, f"coordinate {j}"
    method = "projected" if mech.name != "randomized_response" else None
    if mech.name == "laplace":
        method = "monte-carlo"
    stat = lambda hs: [goodness_of_fit(h, P, method=method, n_draws=19).statistic for h in hs]  # noqa: E731
    assert stats.ks_2samp(stat(per_user), stat(aggregate)).pvalue > 1e-3


@pytest.mark.parametrize("mech", MECHANISMS, ids=IDS)
def test_secure_randomize_histograms_match_channel(mech):
    """Histograms of reports from the secure per-record path have the channel's mean and
    covariance (Hotelling-style check on 60 studies of 150 devices)."""
    rng = np.random.default_rng(13)
    studies, n = 60, 150
    values = []
    for _ in range(studies):
        answers = rng.choice(4, size=n, p=P)
        hist = Histogram.from_reports(mech, np.array([mech.randomize(int(x)) for x in answers]))
        values.append(hist.values)
    values = np.array(values)
    mean = n * mech.report_mean(P)
    cov = n * mech.report_covariance(P)
    # Drop one coordinate for randomized response (its counts sum to n).
    keep = slice(0, 3) if mech.name == "randomized_response" else slice(0, 4)
    dev = (values.mean(axis=0) - mean)[keep]
    t2 = studies * dev @ np.linalg.solve(cov[keep, keep], dev)
    assert stats.chi2.sf(t2, dev.size) > 1e-4
    ratio = values.var(axis=0, ddof=1)[keep] / np.diag(cov)[keep]
    assert np.all(np.abs(ratio - 1) < 0.7)


class _AtTruth(Histogram):
    """The expected statistic n * E[report] (not integer for randomized response), used only to
    evaluate the closed-form covariance at the true p."""

    def _check_support(self, values: np.ndarray) -> None:
        return None


@pytest.mark.parametrize("mech", MECHANISMS, ids=IDS)
def test_estimator_variance_matches_closed_form(mech):
    rng = np.random.default_rng(14)
    n, replicates = 5000, 3000
    draws = mech.simulate_histogram(n, P, rng, size=replicates)
    estimates = (draws / n - mech.offset) / mech.slope
    closed_form = np.diag(estimate_covariance(_AtTruth(mech, n, n * mech.report_mean(P))))
    # Unbiased: the mean is within 5 standard errors of p.
    assert np.all(np.abs(estimates.mean(axis=0) - P) < 5 * np.sqrt(closed_form / replicates))
    # Variance ratio within 5 standard errors of 1 (s.e. of a sample variance ~ sqrt(2/R)).
    ratio = estimates.var(axis=0, ddof=1) / closed_form
    assert np.all(np.abs(ratio - 1) < 5 * np.sqrt(2 / (replicates - 1))), ratio


@pytest.mark.parametrize("mech", MECHANISMS, ids=IDS)
def test_confidence_intervals_cover(mech):
    """Per-category 95% intervals cover the truth at a rate inside the 99% binomial band."""
    rng = np.random.default_rng(15)
    replicates = 1000
    covered = np.zeros(4, dtype=int)
    for _ in range(replicates):
        est = estimate(draw_histogram(mech, P, 4000, rng), confidence=0.95)
        covered += (est.ci_low <= P) & (est.ci_high >= P)
    low, high = stats.binom.interval(0.99, replicates, 0.95)
    assert np.all((low <= covered) & (covered <= high)), covered
