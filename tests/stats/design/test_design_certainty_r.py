"""Certainty strata against R's ``survey`` package (issue 36 item 4): a stratum sampled completely
(fpc equal to its PSU count) adds no variance and gets no jackknife replicates, and a stratum of
one self-representing PSU (fpc 1) has zero variance instead of being refused: estimates,
covariances and ``degf`` equal R's ``svydesign(fpc = )`` and ``as.svrepdesign(type = "JKn")``.

Skipped without R locally; CI sets ``LDP_REQUIRE_R=1``, which makes a missing R a failure.
"""

from __future__ import annotations

import numpy as np
import pytest
from stats.design.test_design_r import RTOL, data, rscript, run_r

from aggregator.errors import InsufficientDataError
from aggregator.stats.design.cells import Design, design_cells
from aggregator.stats.design.estimate import design_estimate
from aggregator.stats.design.options import AS_R
from client.mechanisms import RandomizedResponse

__all__ = ["rscript"]  # the fixture of test_design_r, imported so that pytest finds it here


def certainty_design(design: Design) -> Design:
    """Stratum 0 taken whole (fpc 6 = its PSUs), stratum 1 from 20 PSUs, stratum 2's last PSU
    moved into a stratum 3 of its own taken whole (fpc 1), stratum 2's other 5 from 30."""
    strata = np.asarray(design.strata).copy()
    last = np.max(np.asarray(design.clusters)[strata == 2])
    strata[(strata == 2) & (np.asarray(design.clusters) == last)] = 3
    fpc = np.array([6.0, 20.0, 30.0, 1.0])[strata]
    return Design(strata, design.clusters, design.weights, fpc)


@pytest.mark.parametrize("mechanism", [RandomizedResponse(k=4, epsilon=2.0), None])
def test_certainty_strata_equal_r(rscript, tmp_path, mechanism):
    x_hat, plain, columns = data(mechanism, 11)
    design = certainty_design(plain)
    columns.update(cst=design.strata, cfpc=design.fpc)
    r = run_r(
        rscript,
        tmp_path,
        columns,
        """
cert <- svydesign(ids = ~psu, strata = ~cst, weights = ~w, fpc = ~cfpc, nest = TRUE, data = d)
jkc <- as.svrepdesign(cert, type = "JKn")
for (name in c("linearization", "jackknife")) {
  des <- if (name == "jackknife") jkc else cert
  m <- svymean(~x1 + x2 + x3 + x4, des)
  out(paste0(name, ".mean"), coef(m)); out(paste0(name, ".cov"), vcov(m))
  out(paste0(name, ".df"), degf(des))
}
out("replicates", ncol(jkc$repweights$weights))
""",
    )
    cells = design_cells(x_hat, design)
    for method in ("linearization", "jackknife"):
        est = design_estimate(cells, mechanism, method=method, small_sample=AS_R)
        np.testing.assert_allclose(est.estimate[0], r[f"{method}.mean"], rtol=RTOL)
        np.testing.assert_allclose(est.covariance.ravel(), r[f"{method}.cov"], rtol=RTOL)
        assert est.degrees_of_freedom == r[f"{method}.df"][0]
    # 6 + 6 + 5 + 1 PSUs in 4 strata; the jackknife deletes only the 11 of strata 1 and 2
    assert r["replicates"][0] == 11
    assert (r["linearization.df"][0], r["jackknife.df"][0]) == (14, 9)


def test_a_single_psu_that_is_not_taken_whole_is_still_refused():
    x_hat, plain, _ = data(None, 11)
    design = certainty_design(plain)
    fpc = np.where(design.strata == 3, 40.0, design.fpc)  # one PSU of 40: not self-representing
    cells = design_cells(x_hat, Design(design.strata, design.clusters, design.weights, fpc))
    for method in ("linearization", "jackknife", "bootstrap"):
        with pytest.raises(InsufficientDataError, match=r"1 stratum.* with a single PSU"):
            design_estimate(cells, None, method=method)


def test_a_census_has_no_sampling_variance():
    """Every stratum taken whole: zero covariance by every method, as R's linearization."""
    x_hat, plain, _ = data(RandomizedResponse(k=4, epsilon=2.0), 12)
    census = Design(plain.strata, plain.clusters, plain.weights, np.ones(len(plain.weights)))
    cells = design_cells(x_hat, census)
    for method in ("linearization", "jackknife", "bootstrap"):
        est = design_estimate(cells, RandomizedResponse(k=4, epsilon=2.0), method=method)
        assert np.all(est.covariance == 0) and np.all(est.total_covariance == 0)
