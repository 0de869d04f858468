"""Design intervals inside [0, 1] (issue 36 item 2; aggregator/stats/design/intervals.py).

* Without local noise the Korn-Graubard and logit intervals are R's ``svyciprop(method =
  "beta")`` and ``svyciprop(method = "xlogit")`` to 1e-8 (linearization with and without fpc,
  and a JKn design), by linearization ``svyciprop(method = "logit")`` to its fitting tolerance
  (1e-6; on the JKn design R refits the logistic model per replicate, 5e-3 away), and "wald" is
  ``confint(svymean, df = degf)``.
* Under local noise every interval but "wald" lies inside [0, 1] with positive width, even where
  the unbiased estimate lies outside, and the unbiased estimate is kept.
* Coverage by simulation, a short run of scripts/validate_design_coverage.py: clustered designs
  with randomized response and without, true shares near 0.015 and 0.35.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from stats.design.test_design_r import RTOL, data, rscript, run_r, with_fpc

from aggregator.errors import InvalidInputError
from aggregator.stats.design.calibration import post_stratified_estimate
from aggregator.stats.design.cells import Design, contributions, design_cells, indicators
from aggregator.stats.design.estimate import design_estimate
from aggregator.stats.design.intervals import (
    ReportShare,
    design_intervals,
    interval_name,
    report_share,
)
from aggregator.stats.design.options import AS_R, BELL_MCCAFFREY, DEFAULT_SMALL_SAMPLE
from client.mechanisms import GaussianNoise, RandomizedResponse

__all__ = ["rscript"]  # the fixture of test_design_r, imported so that pytest finds it here

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "validate_design_coverage.py"


@pytest.mark.parametrize("name", ["plain", "finite", "jackknife"])
def test_beta_and_logit_equal_svyciprop_without_local_noise(rscript, tmp_path, name):
    _, design, columns = data(None, 21)
    answers = np.asarray(columns["x1"]) + 2 * np.asarray(columns["x2"])  # categories 0, 1, 2
    # a rare category: answer 1 only in the first PSUs of stratum 0
    rare = (np.asarray(design.strata) == 0) & (np.asarray(design.clusters) < 2)
    answers = np.where(rare & (np.arange(len(answers)) % 5 == 0), 3, answers).astype(int)
    columns.update({f"y{j}": (answers == j).astype(float) for j in range(4)})
    r = run_r(
        rscript,
        tmp_path,
        columns,
        f"""
des <- designs[["{name}"]]
for (j in 0:3) {{
  f <- as.formula(paste0("~y", j))
  for (m in c("beta", "logit", "xlogit")) {{
    out(paste0(m, j), attr(svyciprop(f, des, method = m), "ci"))
  }}
  out(paste0("wald", j), confint(svymean(f, des), df = degf(des)))
}}
""",
    )
    adjust = with_fpc if name == "finite" else (lambda d: d)
    method = "jackknife" if name == "jackknife" else "linearization"
    est = design_estimate(
        design_cells(indicators(answers, 4), adjust(design)), None, method, small_sample=AS_R
    )
    checks = [("beta", "beta", RTOL), ("wald", "wald", RTOL), ("logit", "xlogit", RTOL)]
    if method == "linearization":  # R's "logit" fits a logistic regression (to its IRLS
        # tolerance); on replicates it refits it per replicate, which the delta method is not
        checks.append(("logit", "logit", 1e-6))
    for interval, reference, rtol in checks:
        low, high = est.intervals(0.95, interval)
        for j in range(4):
            np.testing.assert_allclose(
                [low[0, j], high[0, j]], r[f"{reference}{j}"], rtol=rtol, err_msg=reference
            )


def test_intervals_stay_inside_the_unit_interval_where_the_unbiased_estimate_does_not():
    mechanism = RandomizedResponse(k=4, epsilon=0.5)
    rng = np.random.default_rng(5)
    n = 400
    answers = rng.choice(4, size=n, p=[0.0, 0.1, 0.4, 0.5])
    x_hat = contributions(mechanism, mechanism.simulate(answers, rng))
    design = Design(np.repeat([0, 1], n // 2), np.arange(n) // 20, np.linspace(1, 3, n))
    outside = 0
    for seed in range(20):
        est = design_estimate(design_cells(np.roll(x_hat, seed * 7, axis=0), design), mechanism)
        outside += int(np.any((est.estimate < 0) | (est.estimate > 1)))
        wald = est.intervals(0.95, "wald")
        for method in ("beta", "logit"):
            low, high = est.intervals(0.95, method)
            assert np.all(low >= 0) and np.all(high <= 1) and np.all(high > low)
            # never narrower than the Wald interval where that lies inside [0, 1]
            inside = (wald[0] >= 0) & (wald[1] <= 1)
            assert np.all(high[inside] - low[inside] >= 0.8 * (wald[1] - wald[0])[inside])
    assert outside > 0  # the case the intervals are for did occur


def test_a_census_and_additive_noise_have_intervals_inside_the_unit_interval():
    rng = np.random.default_rng(2)
    noise = GaussianNoise(k=3, rho=0.5)
    assert report_share(noise) is None and report_share(None) == ReportShare(0.0, 1.0)
    x = rng.choice(3, size=60, p=[0.02, 0.48, 0.5])
    design = Design(np.zeros(60), np.arange(60) // 6, np.ones(60))
    est = design_estimate(design_cells(contributions(noise, noise.simulate(x, rng)), design), noise)
    low, high = est.intervals()
    assert np.all(low >= 0) and np.all(high <= 1) and np.all(high > low)
    assert interval_name("beta", est.share, 9, AS_R) == "Wald, t(9), cut to [0, 1]"
    named = interval_name("beta", est.share, float(est.interval_df[0, 0]), BELL_MCCAFFREY)
    assert named == f"Wald, t({est.interval_df[0, 0]:.1f}, Bell-McCaffrey), cut to [0, 1]"
    # a census: no variance, an interval that is the estimate (or holds it, answers seen)
    census = Design(design.strata, design.clusters, design.weights, np.ones(60))
    whole = design_estimate(design_cells(indicators(x, 3), census), None)
    for method in ("wald", "beta", "logit"):
        low, high = whole.intervals(0.95, method)
        assert np.all(low <= whole.estimate) and np.all(whole.estimate <= high)


def test_post_stratified_intervals_use_the_channel_when_told_it():
    mechanism = RandomizedResponse(k=3, epsilon=1.0)
    rng = np.random.default_rng(8)
    x = rng.choice(3, size=300, p=[0.02, 0.48, 0.5])
    design = Design(np.zeros(300), np.arange(300) // 10, np.ones(300))
    cells = design_cells(contributions(mechanism, mechanism.simulate(x, rng)), design, x % 2, 2)
    population = np.array([600.0, 400.0])
    plain = post_stratified_estimate(cells, population)
    told = post_stratified_estimate(cells, population, share=report_share(mechanism))
    np.testing.assert_array_equal(plain.estimate, told.estimate)
    for result in (plain, told):
        low, high = result.intervals()
        assert np.all(low >= 0) and np.all(high <= 1)
    assert not np.allclose(told.intervals()[0], plain.intervals()[0])


def test_an_unknown_interval_is_refused():
    with pytest.raises(InvalidInputError, match="beta, logit, wald"):
        design_intervals(np.array([0.5]), np.array([0.1]), 10, 100, None, 0.95, "score")


def test_korn_graubard_at_zero_is_clopper_pearson():
    """A category nobody chose: no variance, n* = n, the exact upper bound 1 - (alpha/2)^(1/n)."""
    low, high = design_intervals(
        np.array([0.0]), np.array([0.0]), 12, 50, ReportShare(0.0, 1.0), 0.95, "beta"
    )
    assert low[0] == 0 and high[0] == pytest.approx(1 - 0.025 ** (1 / 50))
    assert stats.beta.ppf(0.975, 1, 50) == pytest.approx(high[0])


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("validate_design_coverage", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_default_intervals_cover_near_zero_and_mid_range(study):
    """300 trials at 12 and 64 PSUs (the documented run has 2,000 and more settings): near 0.35
    the default interval covers at least 0.92 (the 99 % binomial band of 300 trials at 0.95
    starts at 0.917); near 0.015 at least 0.90 (docs/validation.md), where R's Wald interval
    covers 0.81-0.85 with answers seen and leaves [0, 1] in most trials under local noise."""
    for i, setting in enumerate(study.SETTINGS):
        if study.psus(setting) not in (12, 64):
            continue
        row = study.run(setting, 300, 100 + i)
        rare, mid = row["coverage"][DEFAULT_SMALL_SAMPLE, "beta"]
        assert rare >= 0.90 and mid >= 0.92, row
        if setting.mechanism is None:
            assert rare > row["coverage"][AS_R, "wald"][0] + 0.02, row
        else:
            assert row["wald outside"][0] > 0.5, row
