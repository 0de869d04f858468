"""Agreement with R's ``survey`` package (survey-design spec D.5): with the privatized reports as
data, the design-based estimates, covariances, design effects and Rao-Scott tests equal
``svymean``, ``svytotal``, ``svygofchisq`` and ``svychisq`` to 1e-8 on stratified cluster designs
with unequal weights, with and without a finite population correction, on a jackknife
replicate design, and on our bootstrap replicates passed to R as replicate weights.

Runs ``Rscript`` (Debian's ``r-base-core`` and ``r-cran-survey``, installed by ``.ci/run``).
Skipped where R is missing, except when ``LDP_REQUIRE_R=1`` (set by CI): then a missing R fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from aggregator.stats.design.calibration import post_stratified_estimate
from aggregator.stats.design.cells import Design, contributions, design_cells, indicators
from aggregator.stats.design.estimate import design_estimate
from aggregator.stats.design.options import AS_R
from aggregator.stats.design.rao_scott import (
    design_goodness_of_fit,
    design_independence,
    design_k_sample,
)
from aggregator.stats.design.simulation import TwoStageSetting
from aggregator.stats.design.variance import replicate_factors
from client.mechanisms import FlipComponents, GaussianNoise, RandomizedResponse

RTOL = 1e-8
SETTING = TwoStageSetting(
    shares=(0.5, 0.3, 0.2),
    distributions=((0.4, 0.3, 0.2, 0.1), (0.25, 0.25, 0.25, 0.25), (0.1, 0.2, 0.3, 0.4)),
    psus=6,
    psu_size=12,
    concentration=5.0,
    weight_spread=0.4,
)
PREAMBLE = """
suppressMessages(library(survey))
out <- function(key, v) cat(key, sprintf("%.17g", as.numeric(v)), "\\n")
d <- read.csv("data.csv")
d$fpc <- 10 + d$st
plain <- svydesign(ids = ~psu, strata = ~st, weights = ~w, nest = TRUE, data = d)
finite <- svydesign(ids = ~psu, strata = ~st, weights = ~w, fpc = ~fpc, nest = TRUE, data = d)
jk <- as.svrepdesign(plain, type = "JKn")
designs <- list(plain = plain, finite = finite, jackknife = jk)
"""


@pytest.fixture(scope="module")
def rscript() -> str:
    path = shutil.which("Rscript")
    usable = (
        path is not None
        and subprocess.run([path, "-e", "library(survey)"], capture_output=True).returncode == 0
    )
    if not usable:
        message = "R with the survey package is not installed (apt-get install r-cran-survey)"
        if os.environ.get("LDP_REQUIRE_R") == "1":
            pytest.fail(message + ", and LDP_REQUIRE_R=1 requires it")
        pytest.skip(message)
    assert path is not None
    return path


def run_r(rscript: str, tmp: Path, columns: dict[str, np.ndarray], body: str) -> dict:
    """Write ``columns`` to data.csv, run the R script, parse its ``out(key, values)`` lines."""
    names = list(columns)
    table = np.column_stack([np.asarray(columns[name], dtype=float) for name in names])
    np.savetxt(
        tmp / "data.csv", table, delimiter=",", header=",".join(names), comments="", fmt="%.17g"
    )
    (tmp / "check.R").write_text(PREAMBLE + body)
    done = subprocess.run(
        [rscript, "check.R"], cwd=tmp, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    values = {}
    for line in done.stdout.splitlines():
        key, *numbers = line.split()
        values[key] = np.array([float(x) for x in numbers])
    return values


def data(mechanism, seed: int) -> tuple[np.ndarray, Design, dict[str, np.ndarray]]:
    sample = SETTING.sample(mechanism, np.random.default_rng(seed))
    columns = {
        "st": sample.design.strata,
        "psu": sample.design.clusters,
        "w": sample.design.weights,
        **{f"x{j + 1}": sample.x_hat[:, j] for j in range(SETTING.k)},
    }
    return sample.x_hat, sample.design, columns


def with_fpc(design: Design) -> Design:
    return Design(design.strata, design.clusters, design.weights, 10.0 + design.strata)


DESIGNS = {
    "plain": (lambda d: d, "linearization"),
    "finite": (with_fpc, "linearization"),
    "jackknife": (lambda d: d, "jackknife"),
}


@pytest.mark.parametrize(
    "mechanism",
    [
        RandomizedResponse(k=4, epsilon=2.0),
        FlipComponents(k=4, epsilon=1.0),
        GaussianNoise(k=4, rho=0.5),
    ],
    ids=lambda m: m.name,
)
def test_means_totals_and_design_effects_equal_svymean(rscript, tmp_path, mechanism):
    x_hat, design, columns = data(mechanism, 1)
    r = run_r(
        rscript,
        tmp_path,
        columns,
        """
for (name in names(designs)) {
  m <- svymean(~x1 + x2 + x3 + x4, designs[[name]], deff = "replace")
  t <- svytotal(~x1 + x2 + x3 + x4, designs[[name]])
  out(paste0(name, ".mean"), coef(m)); out(paste0(name, ".cov"), vcov(m))
  out(paste0(name, ".total"), coef(t)); out(paste0(name, ".tcov"), vcov(t))
  if (name != "jackknife") out(paste0(name, ".deff"), deff(m))
  out(paste0(name, ".df"), degf(designs[[name]]))
}
""",
    )
    for name, (adjust, method) in DESIGNS.items():
        est = design_estimate(
            design_cells(x_hat, adjust(design)), mechanism, method=method, small_sample=AS_R
        )
        np.testing.assert_allclose(est.estimate[0], r[f"{name}.mean"], rtol=RTOL)
        np.testing.assert_allclose(est.covariance.ravel(), r[f"{name}.cov"], rtol=RTOL)
        np.testing.assert_allclose(est.total[0], r[f"{name}.total"], rtol=RTOL)
        np.testing.assert_allclose(est.total_covariance.ravel(), r[f"{name}.tcov"], rtol=RTOL)
        if name != "jackknife":
            np.testing.assert_allclose(est.deff[0], r[f"{name}.deff"], rtol=RTOL)
        assert est.degrees_of_freedom == r[f"{name}.df"][0]


def test_goodness_of_fit_equals_svygofchisq_on_the_privatized_category(rscript, tmp_path):
    """Randomized response: the GOF form is invariant under the channel's affine map, so the
    test on the contributions is R's on factor(Y) against A p0, after R's scaling by N_hat / n."""
    mechanism = RandomizedResponse(k=4, epsilon=2.0)
    x_hat, design, columns = data(mechanism, 2)
    p0 = SETTING.population_distribution()
    columns["y"] = x_hat.argmax(axis=1)
    body = "q0 <- c(" + ", ".join(f"{q:.17g}" for q in mechanism.report_mean(p0)) + ")\n"
    r = run_r(
        rscript,
        tmp_path,
        columns,
        body
        + """
for (name in c("plain", "finite")) {
  g <- svygofchisq(~factor(y), p = q0, design = designs[[name]])
  out(paste0(name, ".stat"), g$statistic); out(paste0(name, ".p"), g$p.value)
  out(paste0(name, ".lambda"), g$lambda); out(paste0(name, ".N"), sum(weights(designs[[name]])))
}
""",
    )
    for name in ("plain", "finite"):
        adjust = DESIGNS[name][0]
        result = design_goodness_of_fit(
            design_cells(x_hat, adjust(design)), mechanism, p0, correction="second-order"
        )
        scale = r[f"{name}.N"][0] / result.n
        np.testing.assert_allclose(result.pearson * scale, r[f"{name}.stat"][0], rtol=RTOL)
        np.testing.assert_allclose(result.pvalue, r[f"{name}.p"][0], rtol=RTOL)
        lambdas = np.sort(r[f"{name}.lambda"])[::-1][: len(result.eigenvalues)]
        np.testing.assert_allclose(result.eigenvalues * scale, lambdas, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name", ["plain", "finite", "jackknife"])
def test_independence_and_homogeneity_equal_svychisq(rscript, tmp_path, name):
    """The privatized categories of two randomized-response questions (3 x 2) as data, and a
    public group against a privatized 4-category answer: svychisq's F, Chisq and adjWald."""
    rng = np.random.default_rng(3)
    first, second = RandomizedResponse(k=3, epsilon=1.0), RandomizedResponse(k=2, epsilon=1.0)
    _, design, columns = data(None, 4)
    n = len(design.weights)
    a = first.simulate(rng.integers(0, 3, n), rng)
    b = second.simulate((a + rng.integers(0, 2, n)) % 2, rng)
    group = rng.integers(0, 3, n)
    answer = RandomizedResponse(k=4, epsilon=1.0)
    y = answer.simulate(np.minimum(group + rng.integers(0, 2, n), 3), rng)
    columns.update(a=a, b=b, g=group, y=y)
    r = run_r(
        rscript,
        tmp_path,
        columns,
        f"""
des <- designs[["{name}"]]
for (s in c("F", "Chisq", "adjWald")) {{
  i <- svychisq(~a + b, des, statistic = s); out(paste0("ind.", s), c(i$statistic, i$p.value))
  h <- svychisq(~g + y, des, statistic = s); out(paste0("hom.", s), c(h$statistic, h$p.value))
}}
""",
    )
    adjust, method = DESIGNS[name]
    joint = design_cells(indicators(a * 2 + b, 6), adjust(design))
    grouped = design_cells(indicators(y, 4), adjust(design), group, 3)
    for correction, key in (("F", "F"), ("first-order", "Chisq"), ("wald", "adjWald")):
        for label, result in (
            ("ind", design_independence(joint, None, 3, 2, correction, method=method)),
            ("hom", design_k_sample(grouped, None, correction, method=method)),
        ):
            statistic, pvalue = r[f"{label}.{key}"]
            # R reports the uncorrected Pearson statistic for "Chisq"
            mine = result.pearson if key == "Chisq" else result.statistic
            np.testing.assert_allclose(mine, statistic, rtol=RTOL)
            np.testing.assert_allclose(result.pvalue, pvalue, rtol=RTOL)
    # Homogeneity of the true answers behind randomized response: the statistic and the Wald
    # test are R's on the privatized category (the channel's map is affine and the same in
    # every group); the design effects are evaluated at the null fit, not at R's estimate.
    private = design_cells(contributions(answer, y), adjust(design), group, 3)
    pearson = design_k_sample(private, answer, "first-order", method=method).pearson
    np.testing.assert_allclose(pearson, r["hom.Chisq"][0], rtol=RTOL)
    wald = design_k_sample(private, answer, "wald", method=method)
    np.testing.assert_allclose([wald.statistic, wald.pvalue], r["hom.adjWald"], rtol=RTOL)


def test_bootstrap_variance_equals_svrepdesign_on_the_same_replicates(rscript, tmp_path):
    """Our Rao-Wu replicates, written out as replicate weights, give R's bootstrap variance."""
    mechanism = RandomizedResponse(k=4, epsilon=2.0)
    x_hat, design, columns = data(mechanism, 5)
    cells_ = design_cells(x_hat, design)
    replicates = 50
    factors, _, _ = replicate_factors(cells_, "bootstrap", replicates, seed=3)
    pairs = np.stack(
        [
            np.unique(design.strata, return_inverse=True)[1],
            np.unique(design.clusters, return_inverse=True)[1],
        ]
    )
    cell_of = np.unique(pairs, axis=1, return_inverse=True)[1].reshape(-1)
    for r in range(replicates):
        columns[f"r{r}"] = design.weights * factors[r, cell_of]
    r = run_r(
        rscript,
        tmp_path,
        columns,
        f"""
b <- svrepdesign(data = d, weights = ~w, repweights = "r[0-9]+", type = "bootstrap",
                 combined.weights = TRUE)
m <- svymean(~x1 + x2 + x3 + x4, b)
out("cov", vcov(m)); out("scale", b$scale); out("n", {replicates})
""",
    )
    est = design_estimate(cells_, mechanism, method="bootstrap", replicates=replicates, seed=3)
    assert r["scale"][0] == pytest.approx(1 / (replicates - 1))
    np.testing.assert_allclose(est.covariance.ravel(), r["cov"], rtol=RTOL)


@pytest.mark.parametrize("name", ["plain", "jackknife"])
def test_post_stratification_equals_poststratify(rscript, tmp_path, name):
    """Post-strata from a public variable, known population counts: R's postStratify."""
    mechanism = FlipComponents(k=4, epsilon=1.0)
    x_hat, design, columns = data(mechanism, 6)
    band = np.random.default_rng(7).integers(0, 3, len(x_hat))
    population = np.array([5000.0, 3000.0, 2000.0])
    columns["band"] = band
    r = run_r(
        rscript,
        tmp_path,
        columns,
        f"""
counts <- data.frame(band = 0:2, Freq = c(5000, 3000, 2000))
ps <- postStratify(designs[["{name}"]], ~band, counts)
m <- svymean(~x1 + x2 + x3 + x4, ps)
out("mean", coef(m)); out("cov", vcov(m))
""",
    )
    adjust, method = DESIGNS[name]
    result = post_stratified_estimate(
        design_cells(x_hat, adjust(design), band, 3), population, method=method, small_sample=AS_R
    )
    np.testing.assert_allclose(result.estimate, r["mean"], rtol=RTOL)
    np.testing.assert_allclose(result.covariance.ravel(), r["cov"], rtol=RTOL)
