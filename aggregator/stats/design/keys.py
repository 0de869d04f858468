"""Design cells from per design key statistics: the sampling frame joined to what the store
keeps per key (docs/designs.md).

A design key is one row of the sampling frame (a stratum x PSU x weight class): every report
carrying it has the same stratum, PSU and weight, so the weighted sums of a cell are its keys'
weights times their sums of contributions, and the cells of :func:`design_cells` on the reports
themselves are recovered exactly (up to rounding) without the reports.
"""

from __future__ import annotations

import numpy as np

from aggregator.errors import InvalidInputError
from aggregator.stats.design.cells import DesignCells, check_weights


def keyed_cells(
    strata: np.ndarray,
    psus: np.ndarray,
    weights: np.ndarray,
    fpc: np.ndarray | None,
    counts: np.ndarray,
    totals: np.ndarray,
    squares: np.ndarray,
    domains: np.ndarray | None = None,
    n_domains: int = 1,
) -> DesignCells:
    """Cells of rows that each sum the reports of one design key (and domain): its stratum and
    PSU labels, weight and R-style fpc (None: with replacement), number of reports ``counts``,
    and the sums of the reports' contributions ``totals`` and of their squares ``squares``,
    (m, k) each. ``domains``: each row's public group index 0..n_domains-1."""
    counts = np.asarray(counts, dtype=float)
    m = len(counts)
    weights = np.asarray(weights, dtype=float)
    totals, squares = np.asarray(totals, dtype=float), np.asarray(squares, dtype=float)
    if weights.shape != (m,) or totals.ndim != 2 or totals.shape[0] != m:
        raise InvalidInputError(f"keyed statistics need {m} weights and ({m}, k) totals")
    if squares.shape != totals.shape or not np.all(np.isfinite(totals)):
        raise InvalidInputError("keyed totals and squares must be finite, of one shape")
    check_weights(weights)
    group = np.zeros(m, dtype=np.int64) if domains is None else np.asarray(domains)
    labels, stratum_of = np.unique(np.asarray(strata, dtype=str), return_inverse=True)
    psu_of = np.unique(np.asarray(psus, dtype=str), return_inverse=True)[1]
    _, cell_of = np.unique(np.stack([stratum_of, psu_of]), axis=1, return_inverse=True)
    cell_of = cell_of.reshape(-1)
    cells = int(cell_of.max()) + 1 if m else 0
    cell_stratum = np.zeros(cells, dtype=np.int64)
    cell_stratum[cell_of] = stratum_of
    k = totals.shape[1]
    count = np.zeros((cells, n_domains))
    weight = np.zeros((cells, n_domains))
    weight_square = np.zeros((cells, n_domains))
    total = np.zeros((cells, n_domains, k))
    square = np.zeros((cells, n_domains, k))
    np.add.at(count, (cell_of, group), counts)
    np.add.at(weight, (cell_of, group), weights * counts)
    np.add.at(weight_square, (cell_of, group), weights**2 * counts)
    np.add.at(total, (cell_of, group), weights[:, None] * totals)
    np.add.at(square, (cell_of, group), weights[:, None] * squares)
    psus_in = np.bincount(cell_stratum, minlength=len(labels))
    return DesignCells(
        cell_stratum,
        _sampling_fraction(fpc, stratum_of, psus_in),
        count,
        weight,
        weight_square,
        total,
        square,
    )


def _sampling_fraction(
    fpc: np.ndarray | None, stratum_of: np.ndarray, psus: np.ndarray
) -> np.ndarray:
    """Per stratum the PSU sampling fraction from R-style fpc (0: with replacement)."""
    fraction = np.zeros(len(psus))
    if fpc is None:
        return fraction
    values = np.asarray(fpc, dtype=float)
    for h in range(len(psus)):
        given = np.unique(values[stratum_of == h])
        if len(given) != 1 or not given[0] > 0:
            raise InvalidInputError("design fpc must be positive and constant within a stratum")
        fraction[h] = given[0] if given[0] <= 1 else psus[h] / given[0]
        if fraction[h] > 1:
            raise InvalidInputError(
                f"stratum {h}: {psus[h]} PSUs sampled from a population of {given[0]:g}"
            )
    return fraction
