"""Raking against R's ``survey`` package (survey-design spec D.2, D.5): with the privatized
contributions as data, the raked estimates and covariances equal R's to 1e-8.

* linearization, unequal weights (with and without fpc): ``calibrate(calfun = "raking")`` then
  ``svymean``, whose variance uses the calibration residuals of Deville and Sarndal, as ours
  (R's ``grake`` needs the MASS package: Debian's ``r-cran-mass``);
* linearization, equal design weights: ``rake()`` then ``svymean`` (R's ``rake`` centres the
  residuals with unweighted means, which equal the design-weighted ones only when the design
  weights are equal);
* a JKn replicate design with unequal weights: ``rake()`` then ``svymean``, each replicate raked
  again; and ``rake()`` reaches the same weights as ``calibrate``.

Skipped without R locally; CI sets ``LDP_REQUIRE_R=1``, which makes a missing R a failure.
"""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
from stats.design.test_design_r import RTOL, data, rscript, run_r

from aggregator.stats.design.cells import Design, design_cells
from aggregator.stats.design.options import AS_R
from aggregator.stats.design.raking import joint_domains, raked_estimate
from client.mechanisms import FlipComponents, RandomizedResponse

__all__ = ["rscript"]  # the fixture of test_design_r, imported so that pytest finds it here

MARGINS = (np.array([5000.0, 3000.0, 2000.0]), np.array([6500.0, 3500.0]))
DESIGNS = """
d$fa <- factor(d$a); d$fb <- factor(d$b)
plain <- svydesign(ids = ~psu, strata = ~st, weights = ~w, nest = TRUE, data = d)
finite <- svydesign(ids = ~psu, strata = ~st, weights = ~w, fpc = ~fpc, nest = TRUE, data = d)
self <- svydesign(ids = ~psu, strata = ~st, weights = ~w1, nest = TRUE, data = d)
jk <- as.svrepdesign(plain, type = "JKn")
pa <- data.frame(fa = factor(0:2), Freq = c(5000, 3000, 2000))
pb <- data.frame(fb = factor(0:1), Freq = c(6500, 3500))
tight <- list(maxit = 1000, epsilon = 1e-15)
report <- function(raked) for (name in names(raked)) {
  m <- svymean(~x1 + x2 + x3 + x4, raked[[name]])
  out(paste0(name, ".mean"), coef(m)); out(paste0(name, ".cov"), vcov(m))
}
"""
RAKE = """
report(list(
  self = rake(self, list(~fa, ~fb), list(pa, pb), control = tight),
  jackknife = rake(jk, list(~fa, ~fb), list(pa, pb), control = tight),
  rake_plain = rake(plain, list(~fa, ~fb), list(pa, pb), control = tight)
))
"""
CALIBRATE = """
totals <- c(10000, 3000, 2000, 3500)
report(list(
  plain = calibrate(plain, ~fa + fb, totals, calfun = "raking", epsilon = 1e-14, maxit = 500),
  finite = calibrate(finite, ~fa + fb, totals, calfun = "raking", epsilon = 1e-14, maxit = 500)
))
"""
MECHANISMS = [RandomizedResponse(k=4, epsilon=2.0), FlipComponents(k=4, epsilon=1.0)]


@pytest.fixture(scope="module")
def mass(rscript: str) -> None:
    """R's calibrate(calfun = "raking") needs MASS (Debian's r-cran-mass, installed by .ci/run)."""
    if subprocess.run([rscript, "-e", "library(MASS)"], capture_output=True).returncode:
        message = "R's MASS package is not installed (apt-get install r-cran-mass)"
        if os.environ.get("LDP_REQUIRE_R") == "1":
            pytest.fail(message + ", and LDP_REQUIRE_R=1 requires it")
        pytest.skip(message)


def equal_weights(design: Design) -> Design:
    return Design(design.strata, design.clusters, np.full(len(design.weights), 3.0))


def with_fpc(design: Design) -> Design:
    return Design(design.strata, design.clusters, design.weights, 10.0 + design.strata)


def raking_data(mechanism, tmp_path, rscript, body):
    """A stratified cluster sample with unequal weights and two public raking variables drawn
    independently of the design; R's numbers from ``body``."""
    x_hat, design, columns = data(mechanism, 11)
    rng = np.random.default_rng(12)
    categories = np.column_stack([rng.integers(0, 3, len(x_hat)), rng.integers(0, 2, len(x_hat))])
    columns.update(a=categories[:, 0], b=categories[:, 1], w1=np.full(len(x_hat), 3.0))
    r = run_r(rscript, tmp_path, columns, DESIGNS + body)
    return x_hat, design, joint_domains(categories, (3, 2)), r


def check(r: dict, name: str, x_hat, design: Design, domains, method: str) -> None:
    cells = design_cells(x_hat, design, domains, 6)
    result = raked_estimate(cells, MARGINS, method=method, small_sample=AS_R)
    np.testing.assert_allclose(result.estimate, r[f"{name}.mean"], rtol=RTOL)
    np.testing.assert_allclose(result.covariance.ravel(), r[f"{name}.cov"], rtol=RTOL)


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m.name)
def test_raking_equals_r_rake(rscript, tmp_path, mechanism):
    x_hat, design, domains, r = raking_data(mechanism, tmp_path, rscript, RAKE)
    check(r, "self", x_hat, equal_weights(design), domains, "linearization")
    check(r, "jackknife", x_hat, design, domains, "jackknife")
    plain = raked_estimate(design_cells(x_hat, design, domains, 6), MARGINS)
    np.testing.assert_allclose(plain.estimate, r["rake_plain.mean"], rtol=RTOL)


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m.name)
def test_raking_linearization_equals_r_calibrate(rscript, mass, tmp_path, mechanism):
    x_hat, design, domains, r = raking_data(mechanism, tmp_path, rscript, CALIBRATE)
    check(r, "plain", x_hat, design, domains, "linearization")
    check(r, "finite", x_hat, with_fpc(design), domains, "linearization")
