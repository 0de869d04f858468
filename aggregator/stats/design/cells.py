"""Survey designs under local privacy: the declaration and its sufficient statistics
(survey-design-and-monitoring spec D.1-D.2).

A design gives each report a stratum, a primary sampling unit (PSU, nested in its stratum) and a
weight, all public. Every design-based estimate and its variance needs only, per (stratum, PSU)
cell and per domain (public group), the number of reports, the sum of weights, the sum of
squared weights, and the weighted sums of the per-report unbiased contributions and of their
squares: a store can keep these cells and drop the reports. The linearized PSU totals of D.2 are
linear in the cell sums (``z_hc = (T_hc - pi_hat W_hc) / W``), so they are formed at analysis
time, and a replicate (a PSU deleted or resampled) only rescales whole cells.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aggregator.errors import InvalidInputError
from aggregator.stats.channel import check_signal
from client.mechanisms import Mechanism

#: A stratum whose PSU sampling fraction is within this of 1 was sampled completely (a
#: certainty stratum): it adds no sampling variance (R ``survey``'s threshold in ``onestrat``).
CERTAINTY = 1e-7
#: The largest ratio of the largest to the smallest design weight. The variance's sums mix terms
#: of both sizes, and rounding costs its SE about 2.2e-16 x the ratio of relative precision
#: (measured: 1e-5 at 1e12): past 1e15 no digit is left and the SE, though finite, means
#: nothing. 1e12 keeps four digits and is far outside real designs (trimmed survey weights
#: rarely span more than 1e3 to 1e4).
MAX_WEIGHT_RATIO = 1e12
#: Design weights lie in [1 / MAX_WEIGHT, MAX_WEIGHT]: sums of squared weights times counts then
#: neither overflow (1.8e308) nor underflow, so design effects and totals' variances stay finite.
MAX_WEIGHT = 1e100


@dataclass(frozen=True)
class Design:
    """Per-report design variables: stratum and PSU labels, weights (inverse inclusion
    probabilities) and, optionally, R-style ``fpc``: the number of PSUs in the report's stratum's
    population (a value above 1) or the stratum's PSU sampling fraction (at most 1)."""

    strata: np.ndarray
    clusters: np.ndarray
    weights: np.ndarray
    fpc: np.ndarray | None = None

    @classmethod
    def simple(cls, n: int) -> Design:
        """A simple random sample with replacement: one stratum, every report its own PSU."""
        return cls(np.zeros(n, dtype=np.int64), np.arange(n), np.ones(n))

    def __post_init__(self) -> None:
        n = len(self.weights)
        for name in ("strata", "clusters"):
            if len(getattr(self, name)) != n:
                raise InvalidInputError(
                    f"design {name} has {len(getattr(self, name))} entries, weights {n}"
                )
        check_weights(self.weights)
        if self.fpc is not None:
            fpc = np.asarray(self.fpc, dtype=float)
            if fpc.shape != (n,) or not np.all(np.isfinite(fpc)) or not np.all(fpc > 0):
                raise InvalidInputError("design fpc must be finite and positive, one per report")


@dataclass(frozen=True)
class DesignCells:
    """Sufficient statistics of a design: one row per (stratum, PSU) cell, one block per domain.

    ``count``, ``weight``, ``weight_square``: (m, G); ``total`` (weighted sums of the
    contributions) and ``square`` (weighted sums of their squares): (m, G, k).
    ``sampling_fraction``: (H,) the PSU sampling fraction per stratum (0: with replacement).
    """

    stratum: np.ndarray
    sampling_fraction: np.ndarray
    count: np.ndarray
    weight: np.ndarray
    weight_square: np.ndarray
    total: np.ndarray
    square: np.ndarray

    @property
    def n(self) -> int:
        return int(self.count.sum())

    @property
    def strata_count(self) -> int:
        return len(self.sampling_fraction)

    @property
    def degrees_of_freedom(self) -> int:
        """Design degrees of freedom: number of PSUs minus number of strata."""
        return len(self.stratum) - self.strata_count

    def columns(self) -> np.ndarray:
        """(m, G (k + 1)): per domain the weighted contributions then the weight: the totals
        every estimate here is a smooth function of."""
        blocks = np.concatenate([self.total, self.weight[:, :, None]], axis=2)
        return blocks.reshape(len(self.stratum), -1)

    def psus_per_stratum(self) -> np.ndarray:
        return np.bincount(self.stratum, minlength=self.strata_count)

    @property
    def certainty(self) -> np.ndarray:
        """(H,) whether each stratum was sampled completely (sampling fraction 1): it adds no
        sampling variance, with one PSU as with many, and gets no replicates (R ``survey``)."""
        return 1 - self.sampling_fraction < CERTAINTY


def check_weights(weights: np.ndarray) -> None:
    """InvalidInputError unless the design weights are finite, positive, inside
    [1 / MAX_WEIGHT, MAX_WEIGHT] and within MAX_WEIGHT_RATIO of each other."""
    w = np.asarray(weights, dtype=float)
    if w.ndim != 1 or not np.all(np.isfinite(w)) or not np.all(w > 0):
        raise InvalidInputError("design weights must be finite and positive")
    if w.size == 0:
        return
    low, high = float(w.min()), float(w.max())
    if high > MAX_WEIGHT or low < 1 / MAX_WEIGHT:
        raise InvalidInputError(
            f"design weights must lie in [{1 / MAX_WEIGHT:g}, {MAX_WEIGHT:g}], "
            f"got {low:.3g} to {high:.3g}"
        )
    if high > MAX_WEIGHT_RATIO * low:
        raise InvalidInputError(
            f"design weights span a ratio of {high / low:.3g}, beyond {MAX_WEIGHT_RATIO:g}: "
            "the variance would lose all precision (rescale or trim them)"
        )


def contributions(mechanism: Mechanism, decoded: np.ndarray) -> np.ndarray:
    """(n, k) per-report unbiased contributions ``x_hat_i`` with ``E[x_hat_i] = e_{x_i}``:
    each report's statistic row, de-biased through the channel (the notation of the
    survey-design-and-monitoring spec)."""
    _check_contributes(mechanism)
    rows = mechanism.statistic_values(mechanism.statistic_rows(decoded))
    return (np.asarray(rows, dtype=float) - mechanism.offset) / check_signal(mechanism)


def _check_contributes(mechanism: Mechanism) -> None:
    if mechanism.statistic_kind == "groups":
        raise InvalidInputError(
            f"{mechanism.describe()} has no per-report contribution per category; a design "
            "needs a mechanism whose reports each estimate the one-hot answer"
        )


def srs_covariance(mechanism: Mechanism | None, p: np.ndarray) -> np.ndarray:
    """``P0(p)``: the covariance of one report's contribution under simple random sampling from
    answers ~ p; ``mechanism`` None for answers seen directly (one-hot indicators)."""
    p = np.asarray(p, dtype=float)
    if mechanism is None:
        return np.diag(p) - np.outer(p, p)
    return mechanism.report_covariance(p) / check_signal(mechanism) ** 2


def indicators(values: np.ndarray, k: int) -> np.ndarray:
    """(n, k) one-hot rows of category indices: the contributions of answers seen directly."""
    values = np.asarray(values)
    if values.ndim != 1 or (values.size and (values.min() < 0 or values.max() >= k)):
        raise InvalidInputError(f"category indices must lie in 0..{k - 1}")
    rows = np.zeros((values.size, k))
    rows[np.arange(values.size), values] = 1.0
    return rows


def design_cells(
    x_hat: np.ndarray, design: Design, domains: np.ndarray | None = None, n_domains: int = 1
) -> DesignCells:
    """Sum per-report contributions (n, k) into the design's cells; ``domains`` (n,) are public
    group indices 0..n_domains-1 (none: one domain)."""
    x_hat = np.asarray(x_hat, dtype=float)
    n = len(design.weights)
    if x_hat.ndim != 2 or x_hat.shape[0] != n:
        raise InvalidInputError(f"contributions must have shape ({n}, k)")
    if not np.all(np.isfinite(x_hat)):
        raise InvalidInputError("contributions must be finite")
    group = np.zeros(n, dtype=np.int64) if domains is None else np.asarray(domains)
    if group.shape != (n,) or (n and (group.min() < 0 or group.max() >= n_domains)):
        raise InvalidInputError(f"domains must be {n} indices in 0..{n_domains - 1}")
    strata, stratum_of = np.unique(np.asarray(design.strata), return_inverse=True)
    _, cell_of = np.unique(
        np.stack([stratum_of, np.unique(design.clusters, return_inverse=True)[1]]),
        axis=1,
        return_inverse=True,
    )
    cell_of = cell_of.reshape(-1)
    m = int(cell_of.max()) + 1 if n else 0
    cell_stratum = np.zeros(m, dtype=np.int64)
    cell_stratum[cell_of] = stratum_of
    w = np.asarray(design.weights, dtype=float)
    k = x_hat.shape[1]
    count = np.zeros((m, n_domains))
    weight = np.zeros((m, n_domains))
    weight_square = np.zeros((m, n_domains))
    total = np.zeros((m, n_domains, k))
    square = np.zeros((m, n_domains, k))
    np.add.at(count, (cell_of, group), 1.0)
    np.add.at(weight, (cell_of, group), w)
    np.add.at(weight_square, (cell_of, group), w**2)
    np.add.at(total, (cell_of, group), w[:, None] * x_hat)
    np.add.at(square, (cell_of, group), w[:, None] * x_hat**2)
    psus = np.bincount(cell_stratum, minlength=len(strata))
    return DesignCells(
        cell_stratum,
        _sampling_fraction(design, stratum_of, psus),
        count,
        weight,
        weight_square,
        total,
        square,
    )


def _sampling_fraction(design: Design, stratum_of: np.ndarray, psus: np.ndarray) -> np.ndarray:
    """Per stratum the PSU sampling fraction from R-style fpc (0 without fpc)."""
    fraction = np.zeros(len(psus))
    if design.fpc is None:
        return fraction
    fpc = np.asarray(design.fpc, dtype=float)
    for h in range(len(psus)):
        values = np.unique(fpc[stratum_of == h])
        if len(values) != 1:
            raise InvalidInputError("design fpc must be constant within a stratum")
        fraction[h] = values[0] if values[0] <= 1 else psus[h] / values[0]
        if fraction[h] > 1:
            raise InvalidInputError(
                f"stratum {h}: {psus[h]} PSUs sampled from a population of {values[0]:g}"
            )
    return fraction


def contributions_from_counts(
    mechanism: Mechanism, n: int, sums: np.ndarray, squares: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(sum_i x_hat_i, sum_i x_hat_i**2)`` (each (k,)) of ``n`` reports from the stored sums of
    their statistic rows, equal to summing :func:`contributions`: ``x_hat`` is affine in the row.
    A count mechanism's rows are 0/1 (a row's square is the row), so ``sums`` is enough; additive
    noise needs ``squares``, the sums of the rows' squares (in the stored grid units)."""
    _check_contributes(mechanism)
    signal, offset = check_signal(mechanism), float(mechanism.offset)
    values = mechanism.statistic_values(np.asarray(sums))
    if mechanism.statistic_kind == "noise":
        if squares is None:
            raise InvalidInputError(f"{mechanism.describe()}: sums of squares are needed")
        unit = float(mechanism.statistic_values(np.ones(1))[0])  # a grid unit in real units
        value_squares = np.asarray(squares, dtype=float) * unit**2
    else:
        value_squares = values
    total = (values - n * offset) / signal
    square = (value_squares - 2 * offset * values + n * offset**2) / signal**2
    return total, square
