"""The spread of the generalized design effects, estimated without the plug-in's bias: the
numerator degrees of freedom ``nu = (sum delta)^2 / sum delta^2`` of the second-order Rao-Scott
test ([Rao1984]) when the design covariance comes from few PSUs (issue 36).

With ``A`` the design covariance of the whitened contrasts (eigenvalues delta),
``nu = (tr A)^2 / tr(A^2)``. The plug-in ``tr(A_hat^2)`` is biased upward by about
``(tr A)^2 / d`` (d design degrees of freedom; ``A_hat`` has rank at most d), so as the contrast
count approaches d the plug-in nu falls towards ``d df / (d + df)`` whatever the design does,
and the F test turns conservative: Type I 0.005 at k = 16 with 14 PSUs, none at k = 64.

Here ``(tr A)^2`` and ``tr(A^2)`` are each estimated without bias from the PSUs' linearized
totals z under the with-replacement model the linearization rests on (PSUs independent and alike
within a stratum, ``A = sum_h (1 - f_h) n_h Sigma_h``): across strata from products of the
strata's unbiased covariance estimates, within a stratum of at least 4 PSUs from the
distribution-free U-statistics of ``(tr Sigma_h)^2`` and ``tr(Sigma_h^2)`` ([Himeno2014]). A
stratum of 2 or 3 PSUs adds its cross terms only: its own share of both follows the other
strata's (exact when the strata's covariances share a shape).
"""

from __future__ import annotations

import numpy as np

from aggregator.stats.design.cells import DesignCells


def spread_degrees_of_freedom(cells: DesignCells, z: np.ndarray) -> float | None:
    """``(tr A)^2 / tr(A^2)`` from per-cell whitened linearized totals ``z`` (m, p), clipped to
    [1, p]; None when no term can be estimated (one stratum of fewer than 4 PSUs)."""
    if cells.strata_count == 1 and cells.psus_per_stratum()[0] < 4:
        return None
    squared_trace, square_trace = spread_terms(cells, z)
    p = z.shape[1]
    if not square_trace > 0:
        return float(p)
    return float(np.clip(squared_trace / square_trace, 1.0, p))


def spread_terms(cells: DesignCells, z: np.ndarray) -> tuple[float, float]:
    """Estimates of ``(tr A)^2`` and ``tr(A^2)``, ``A = sum_h (1 - f_h) n_h Cov(z_hc)``, each
    unbiased under the with-replacement model when every stratum has at least 4 PSUs."""
    psus = cells.psus_per_stratum()
    covariances, traces = [], []
    squared_trace = square_trace = 0.0
    for h in range(cells.strata_count):
        zh = z[cells.stratum == h]
        centred = zh - zh.mean(axis=0)
        n, factor = psus[h], (1 - cells.sampling_fraction[h]) * psus[h]
        covariances.append(factor * centred.T @ centred / (n - 1))
        traces.append(float(np.trace(covariances[-1])))
        if n >= 4:
            trace_sq, trace_of_sq = _within(centred)
            squared_trace += factor**2 * trace_sq
            square_trace += factor**2 * trace_of_sq
    total = np.sum(covariances, axis=0)
    squared_trace += sum(traces) ** 2 - sum(t**2 for t in traces)
    square_trace += float(np.sum(total * total)) - sum(float(np.sum(c * c)) for c in covariances)
    return float(squared_trace), float(square_trace)


def _within(centred: np.ndarray) -> tuple[float, float]:
    """Unbiased ``(tr Sigma)^2`` and ``tr(Sigma^2)`` from n >= 4 independent rows, centred at
    their mean: the U-statistic of ``|x_i - x_j|^2 |x_k - x_l|^2 / 4`` over distinct indices, and
    Himeno and Yamada's estimator."""
    n = len(centred)
    gram = centred @ centred.T
    norms = np.diag(gram)
    half_distance = (norms[:, None] + norms[None, :] - 2 * gram) / 2
    rows = half_distance.sum(axis=1)
    distinct = half_distance.sum() ** 2 - 4 * rows @ rows + 2 * np.sum(half_distance**2)
    trace_sq = distinct / (n * (n - 1) * (n - 2) * (n - 3))
    trace = norms.sum() / (n - 1)
    fourth = np.sum(norms**2) / (n - 1)
    square = np.sum(gram * gram) / (n - 1) ** 2
    trace_of_sq = (
        (n - 1) / (n * (n - 2) * (n - 3)) * ((n - 1) * (n - 2) * square + trace**2 - n * fourth)
    )
    return float(trace_sq), float(trace_of_sq)
