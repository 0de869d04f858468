"""Design-based chi-square tests on locally private reports: Rao-Scott first- and second-order
corrections ([Rao1981], [Rao1984]) and the adjusted Wald test (survey-design-and-monitoring
spec D.3).

Each test is the local SRS statistic ``X2 = n h^T Sigma0^-1 h`` on a contrast vector h that
vanishes under the null, ``Sigma0`` the SRS covariance of one report's h (the mechanism's P0).
Under the design, ``X2 -> sum_j delta_j Z_j^2`` with delta the eigenvalues of
``Sigma0^-1 (n Var_design(h))``:

* ``first-order``: ``X2 / mean(delta) ~ chi2(df)``;
* ``second-order``: Satterthwaite, ``X2 / scale ~ chi2(nu)``, ``scale = sum delta^2 / sum
  delta``, ``nu = (sum delta)^2 / sum delta^2``;
* ``F``: ``X2 / sum delta ~ F(nu, nu d)``, d the design degrees of freedom (R's default);
* ``F-unbiased`` (the default): the same F with nu from unbiased estimates of ``(sum delta)^2``
  and ``sum delta^2`` (aggregator/stats/design/spread.py), where the plug-in nu collapses when
  the contrasts are many for the PSUs;
* ``wald``: ``W = h^T Var_design(h)^-1 h``, ``(d - df + 1) W / (d df) ~ F(df, d - df + 1)``
  ([Korn1990]), unstable when d is small.

Goodness of fit: h is the residual ``(T - p0 N) / sqrt(N)`` on the sum-zero contrasts, its
covariance linearized at the estimate. Independence and homogeneity: h is the log-linear
interaction contrast ``C^T D^-1 (theta_hat - theta_null)`` of the joint table at the product of
its margins, its design effects evaluated at the estimate for answers seen directly and at the
null fit with local noise (where the estimate is noisy and may leave the simplex). Independence
under local noise takes the interaction contrasts of ``theta_hat - row_hat x column_hat`` through
the fit's Jacobian instead, which divide by no margin: the same test while every margin is
positive, and one where a noisy margin is estimated as 0 or below.

With answers seen directly (``mechanism`` None) these are R ``survey``'s ``svygofchisq``
(Satterthwaite) and ``svychisq`` ("F", "Chisq", "adjWald") to rounding, and where a
mechanism's channel is affine on one-hot reports (randomized response) the goodness-of-fit test
equals R's on the privatized category (docs/designs.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy import linalg, stats

from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.stats.channel import project_simplex
from aggregator.stats.design.cells import DesignCells, srs_covariance
from aggregator.stats.design.options import (
    CORRECTIONS,
    DEFAULT_CORRECTION,
    DEFAULT_REPLICATES,
    DEFAULT_VARIANCE,
)
from aggregator.stats.design.spread import spread_degrees_of_freedom
from aggregator.stats.design.variance import Function, covariance
from aggregator.stats.result import TestResult
from client.mechanisms import Mechanism

_CORRECTION_NAMES = {
    "F-unbiased": "Rao-Scott second order, F, unbiased spread",
    "F": "Rao-Scott second order, F",
    "second-order": "Rao-Scott second order, Satterthwaite chi-square",
    "first-order": "Rao-Scott first order",
    "wald": "adjusted Wald F",
}


@dataclass(frozen=True)
class DesignTestResult(TestResult):
    """A ``TestResult`` of a design-based test; ``dof`` is the contrast count, the corrected
    law's degrees of freedom are ``numerator_df`` (and ``denominator_df`` for an F law).
    ``pearson`` is the uncorrected SRS statistic, ``eigenvalues`` the generalized design
    effects delta."""

    __test__ = False

    pearson: float = 0.0
    eigenvalues: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    numerator_df: float = 0.0
    denominator_df: float | None = None
    design_df: int = 0

    def reference(self) -> str:
        """The corrected statistic's reference law, e.g. ``F(2.71, 206.2)``."""
        if self.denominator_df is None:
            return f"chi2({self.numerator_df:.4g})"
        return f"F({self.numerator_df:.4g}, {self.denominator_df:.4g})"

    def summary(self) -> str:
        mean = float(np.mean(self.eigenvalues)) if self.eigenvalues.size else float("nan")
        return (
            f"{super().summary()}\n  reference law: {self.reference()}; uncorrected "
            f"statistic {self.pearson:.4g}, mean generalized design effect {mean:.3g}"
        )

    def to_dict(self) -> dict:
        return {
            **super().to_dict(),
            "pearson": self.pearson,
            "eigenvalues": self.eigenvalues.tolist(),
            "numerator_df": self.numerator_df,
            "denominator_df": self.denominator_df,
            "design_df": self.design_df,
        }


@dataclass(frozen=True)
class _Options:
    mechanism: Mechanism | None
    correction: str
    alpha: float
    method: str
    replicates: int
    seed: int


def design_goodness_of_fit(
    cells: DesignCells,
    mechanism: Mechanism | None,
    p0: np.ndarray,
    correction: str = DEFAULT_CORRECTION,
    alpha: float = 0.05,
    method: str = DEFAULT_VARIANCE,
    replicates: int = DEFAULT_REPLICATES,
    seed: int = 0,
) -> DesignTestResult:
    """H0: the answers' distribution is ``p0``. The residual ``(T - p0 N) / sqrt(N)`` on the
    sum-zero contrasts, its covariance linearized at the estimate as R's ``svygofchisq`` does."""
    options = _options(mechanism, correction, alpha, method, replicates, seed)
    k = cells.total.shape[2]
    p0 = _distribution(p0, k)
    if cells.total.shape[1] != 1:
        raise InvalidInputError("goodness of fit needs one domain")
    basis = _sum_zero_basis(k)
    sigma0 = basis.T @ srs_covariance(mechanism, p0) @ basis
    root = _inverse_root(sigma0)
    sums = cells.columns().sum(axis=0)
    n, population = cells.n, sums[k]

    def residual(s: np.ndarray) -> np.ndarray:
        return root @ basis.T @ (s[:k] - p0 * s[k]) / np.sqrt(s[k])

    def residual_jacobian(s: np.ndarray) -> np.ndarray:
        excess = (s[:k] - p0 * s[k]) / (2 * s[k] ** 1.5)
        jac = np.column_stack([np.eye(k) / np.sqrt(s[k]), -p0 / np.sqrt(s[k]) - excess])
        return root @ basis.T @ jac

    r = residual(sums)
    v = _covariance(cells, residual, residual_jacobian, options)
    scale = n / population
    linear = basis.T @ np.column_stack([np.eye(k), -p0])
    wald = _wald_parts(cells, lambda s: linear @ s, lambda s: linear, options)
    return _result(
        "design-based goodness of fit",
        float(r @ r) * scale,
        np.linalg.eigvalsh(v) * scale,
        k - 1,
        wald,
        cells,
        options,
        p0,
        sums[:k] / population,
        lambda: cells.columns() @ residual_jacobian(sums).T,
    )


def design_independence(
    cells: DesignCells,
    mechanism: Mechanism | None,
    rows: int,
    columns: int,
    correction: str = DEFAULT_CORRECTION,
    alpha: float = 0.05,
    method: str = DEFAULT_VARIANCE,
    replicates: int = DEFAULT_REPLICATES,
    seed: int = 0,
) -> DesignTestResult:
    """H0: the two attributes of a ``rows`` x ``columns`` question (cell (i, j) at index
    ``i * columns + j``) are independent."""
    options = _options(mechanism, correction, alpha, method, replicates, seed)
    k = cells.total.shape[2]
    if cells.total.shape[1] != 1 or rows * columns != k or rows < 2 or columns < 2:
        raise InvalidInputError(f"independence needs one domain and k = rows x columns, k = {k}")
    d = k + 1
    cell = np.eye(k, d)
    row_sum = np.kron(np.eye(rows), np.ones(columns)) @ cell
    column_sum = np.kron(np.ones(rows), np.eye(columns)) @ cell
    one = np.eye(d)[k]

    def null_covariance(theta: np.ndarray) -> np.ndarray:
        return srs_covariance(mechanism, theta)

    table = _Table(rows, columns, cell, row_sum, column_sum, one, null_covariance, True)
    return _table_test("design-based independence", table, cells, options)


def design_k_sample(
    cells: DesignCells,
    mechanism: Mechanism | None,
    correction: str = DEFAULT_CORRECTION,
    alpha: float = 0.05,
    method: str = DEFAULT_VARIANCE,
    replicates: int = DEFAULT_REPLICATES,
    seed: int = 0,
) -> DesignTestResult:
    """H0: every domain (public group: arm, region, wave) has the same answer distribution.

    The groups are domains of one design, so their estimates' cross-covariances are kept: the
    test is independence of the public group and the answer in the joint table."""
    options = _options(mechanism, correction, alpha, method, replicates, seed)
    groups, k = cells.total.shape[1:]
    if groups < 2:
        raise InvalidInputError("a k-sample test needs at least 2 domains")
    d = groups * (k + 1)
    picks = np.arange(d).reshape(groups, k + 1)
    cell = np.eye(d)[picks[:, :k].reshape(-1)]
    weight = np.eye(d)[picks[:, k]]
    column_sum = np.kron(np.ones(groups), np.eye(k)) @ cell
    one = weight.sum(axis=0)
    sums = cells.columns().sum(axis=0)
    share = (weight @ sums) / (one @ sums)

    def null_covariance(theta: np.ndarray) -> np.ndarray:
        blocks = theta.reshape(groups, k) / share[:, None]
        second = [
            s * (srs_covariance(mechanism, p) + np.outer(p, p))
            for s, p in zip(share, blocks, strict=True)
        ]
        return linalg.block_diag(*second) - np.outer(theta, theta)

    table = _Table(groups, k, cell, weight, column_sum, one, null_covariance, False)
    return _table_test("design-based k-sample homogeneity", table, cells, options)


@dataclass(frozen=True)
class _Table:
    """A two-way table whose cells, row and column totals and grand total are linear in the
    column sums S of the design cells (matrices acting on S); ``margins_of_cells``: the row and
    column totals are sums of the cells (independence; not so for groups' weights)."""

    rows: int
    columns: int
    cell: np.ndarray
    row_sum: np.ndarray
    column_sum: np.ndarray
    one: np.ndarray
    null_covariance: Function
    margins_of_cells: bool


def _table_test(
    name: str, table: _Table, cells: DesignCells, options: _Options
) -> DesignTestResult:
    sums = cells.columns().sum(axis=0)
    grand = table.one @ sums
    theta = table.cell @ sums / grand
    row, column = table.row_sum @ sums / grand, table.column_sum @ sums / grand
    margins = [project_simplex(row), project_simplex(column)]
    null = np.outer(*margins).reshape(-1)
    contrasts = _interaction_basis(table.rows, table.columns)
    n = cells.n
    if table.margins_of_cells and options.mechanism is not None:
        # Local noise: the contrasts of theta - row x column through the fit's Jacobian at the
        # null, dividing by no margin; the design effects at the null fit
        # (survey-design-and-monitoring spec D.3), where they do not move with the noisy
        # estimate.
        g_point = contrasts.T @ _fit_jacobian(*margins)
        h = contrasts.T @ (theta - np.outer(row, column).reshape(-1))
        sigma_point = g_point @ table.null_covariance(null) @ g_point.T
        if not np.linalg.eigvalsh(sigma_point).min() > 0:
            raise InsufficientDataError(f"{name}: the null fit's SRS covariance is singular")
        pearson = float(n * h @ np.linalg.solve(sigma_point, h))
    else:
        if np.any(null <= 0):
            raise InsufficientDataError(f"{name}: a row or column margin is estimated as 0")
        g_null = contrasts.T / null
        h = g_null @ (theta - null)
        sigma0 = g_null @ table.null_covariance(null) @ g_null.T
        pearson = float(n * h @ np.linalg.solve(sigma0, h))
        # The design effects: at the estimate for answers seen directly, as R's svychisq; with
        # local noise at the null fit.
        point = theta if options.mechanism is None else null
        inverse = np.divide(1.0, point, out=np.zeros_like(point), where=point > 0)
        g_point = contrasts.T * inverse
        sigma_point = g_point @ table.null_covariance(point) @ g_point.T

    def ratio(s: np.ndarray) -> np.ndarray:
        return table.cell @ s / (table.one @ s)

    def ratio_jacobian(s: np.ndarray) -> np.ndarray:
        total = table.one @ s
        return table.cell / total - np.outer(table.cell @ s, table.one) / total**2

    v = _covariance(cells, ratio, ratio_jacobian, options)
    delta = np.linalg.eigvals(np.linalg.solve(sigma_point, n * g_point @ v @ g_point.T)).real

    def residual(s: np.ndarray) -> np.ndarray:
        outer = np.outer(table.row_sum @ s, table.column_sum @ s).reshape(-1)
        return contrasts.T @ (table.cell @ s - outer / (table.one @ s))

    def residual_jacobian(s: np.ndarray) -> np.ndarray:
        row, column, total = table.row_sum @ s, table.column_sum @ s, table.one @ s
        outer = np.outer(row, column).reshape(-1)
        d_outer = (
            np.repeat(table.row_sum, table.columns, axis=0) * np.tile(column, table.rows)[:, None]
            + np.tile(table.column_sum, (table.rows, 1)) * np.repeat(row, table.columns)[:, None]
        )
        jac = table.cell - d_outer / total + np.outer(outer, table.one) / total**2
        return contrasts.T @ jac

    def whitened() -> np.ndarray:
        z = cells.columns() @ ratio_jacobian(sums).T
        return z @ (_inverse_root(sigma_point) @ g_point).T

    wald = _wald_parts(cells, residual, residual_jacobian, options)
    df = (table.rows - 1) * (table.columns - 1)
    return _result(name, pearson, delta, df, wald, cells, options, null, theta, whitened)


def _fit_jacobian(row: np.ndarray, column: np.ndarray) -> np.ndarray:
    """The Jacobian of ``theta - row(theta) x column(theta)`` (row-major cells) at margins
    ``row`` and ``column``: what the interaction contrasts see of a change in theta."""
    r, c = len(row), len(column)
    row_sums = np.kron(np.eye(r), np.ones(c))
    column_sums = np.kron(np.ones(r), np.eye(c))
    fit = np.kron(np.eye(r), column[:, None]) @ row_sums
    fit += np.kron(row[:, None], np.eye(c)) @ column_sums
    return np.eye(r * c) - fit


def _wald_parts(
    cells: DesignCells, residual: Function, jacobian: Function, options: _Options
) -> tuple[np.ndarray, np.ndarray]:
    """For the Wald correction only: the residual (zero under the null, on the contrasts) at
    the data and its covariance, ``J V J^T`` with V the design covariance of the totals (by
    replicates too, as R's ``svychisq`` does)."""
    if options.correction != "wald":
        return np.zeros(0), np.zeros((0, 0))
    sums = cells.columns().sum(axis=0)
    totals = _covariance(cells, lambda s: s, lambda s: np.eye(len(s)), options)
    jac = jacobian(sums)
    return residual(sums), jac @ totals @ jac.T


def _result(
    name: str,
    pearson: float,
    delta: np.ndarray,
    df: int,
    wald: tuple[np.ndarray, np.ndarray],
    cells: DesignCells,
    options: _Options,
    expected: np.ndarray,
    observed: np.ndarray,
    whitened: Callable[[], np.ndarray],
) -> DesignTestResult:
    """The corrected test; ``whitened`` gives the per-cell linearized contrasts whitened by the
    null's SRS covariance, whose spread the ``F-unbiased`` correction estimates."""
    design_df = cells.degrees_of_freedom
    total, square = float(delta.sum()), float(np.sum(delta**2))
    if not total > 0:
        raise InsufficientDataError(f"{name}: the design variance of the contrasts is zero")
    nu = total**2 / square
    denominator: float | None = None
    if options.correction == "first-order":
        statistic = pearson * df / total
        pvalue = stats.chi2.sf(statistic, df)
        numerator = float(df)
    elif options.correction == "second-order":
        statistic = pearson * total / square
        pvalue = stats.chi2.sf(statistic, nu)
        numerator = nu
    elif options.correction in ("F", "F-unbiased"):
        _check_design_df(name, design_df, 1)
        statistic = pearson / total
        spread = None if options.correction == "F" else spread_degrees_of_freedom(cells, whitened())
        numerator = nu if spread is None else spread
        denominator = numerator * design_df
        pvalue = stats.f.sf(statistic, numerator, denominator)
    else:
        _check_design_df(name, design_df, df)
        y, v = wald
        w = float(y @ np.linalg.solve(v, y))
        numerator, denominator = float(df), float(design_df - df + 1)
        statistic = w * denominator / (df * design_df)
        pvalue = stats.f.sf(statistic, numerator, denominator)
    pvalue = float(pvalue)
    return DesignTestResult(
        statistic=float(statistic),
        pvalue=pvalue,
        dof=df,
        method=f"{name} ({_CORRECTION_NAMES[options.correction]})",
        n=cells.n,
        alpha=options.alpha,
        reject=pvalue < options.alpha,
        expected=expected,
        observed=observed,
        mechanism="direct" if options.mechanism is None else options.mechanism.describe(),
        calibration=f"design-based: {options.correction}",
        calibration_reason=(
            f"{options.method} variance, {cells.strata_count} strata, {len(cells.stratum)} PSUs,"
            f" {design_df} design degrees of freedom"
        ),
        pearson=pearson,
        eigenvalues=np.sort(delta)[::-1],
        numerator_df=float(numerator),
        denominator_df=denominator,
        design_df=design_df,
    )


def _covariance(
    cells: DesignCells, function: Function, jacobian: Function, options: _Options
) -> np.ndarray:
    return covariance(cells, function, jacobian, options.method, options.replicates, options.seed)


def _options(mechanism, correction, alpha, method, replicates, seed) -> _Options:
    if correction not in CORRECTIONS:
        raise InvalidInputError(f"correction must be one of {', '.join(CORRECTIONS)}")
    if not 0 < alpha < 1:
        raise InvalidInputError("alpha must lie in (0, 1)")
    return _Options(mechanism, correction, alpha, method, replicates, seed)


def _check_design_df(name: str, design_df: int, df: int) -> None:
    if design_df - df + 1 <= 0 or design_df <= 0:
        raise InsufficientDataError(
            f"{name}: {design_df} design degrees of freedom are too few for this correction"
        )


def _distribution(p0: np.ndarray, k: int) -> np.ndarray:
    p0 = np.asarray(p0, dtype=float)
    if p0.shape != (k,) or not np.all(p0 > 0) or not np.isclose(p0.sum(), 1.0):
        raise InvalidInputError(f"p0 must be {k} positive probabilities summing to 1")
    return p0 / p0.sum()


def _sum_zero_basis(k: int) -> np.ndarray:
    """(k, k - 1) orthonormal columns orthogonal to the all-ones vector."""
    return np.linalg.svd(np.eye(k) - 1.0 / k)[0][:, : k - 1]


def _interaction_basis(rows: int, columns: int) -> np.ndarray:
    """(rc, (r-1)(c-1)) orthonormal columns orthogonal to the row and column indicators."""
    main = np.hstack(
        [np.kron(np.eye(rows), np.ones((columns, 1))), np.kron(np.ones((rows, 1)), np.eye(columns))]
    )
    return linalg.null_space(main.T)


def _inverse_root(matrix: np.ndarray) -> np.ndarray:
    values, vectors = np.linalg.eigh(matrix)
    if not values.min() > 0:
        raise InvalidInputError("the null distribution's SRS covariance is singular")
    return vectors @ np.diag(values**-0.5) @ vectors.T
