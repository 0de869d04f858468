"""Design-based covariance of smooth functions of the cell totals
(survey-design-and-monitoring spec D.2).

An estimate here is ``theta(S)``, S the column sums of ``DesignCells.columns()``. Two methods:

* linearization: the PSU totals of the linearized values ``z_hc = J x_hc`` (J the Jacobian of
  theta at S), centred within their stratum, ``V = sum_h (1 - f_h) n_h / (n_h - 1)
  sum_c (z_hc - z_h)(z_hc - z_h)^T``: the with-replacement PSU approximation, with the finite
  population correction where the design gives one (R ``survey``'s ``svyrecvar``,
  [Lumley2010]); a certainty stratum (sampling fraction 1) adds nothing, with one PSU as with
  many;
* replicates: theta recomputed on reweighted cells, a delete-one-PSU jackknife (JKn; JK1 with one
  stratum) or the Rao-Wu rescaled bootstrap ([Rao1988]), spread around the replicates' mean
  (R's default, ``survey.replicates.mse = FALSE``). A certainty stratum gets no replicates (the
  jackknife) or is never resampled (the bootstrap), as R's ``survey.drop.replicates``.

The design degrees of freedom (``degrees_of_freedom``) are R's ``degf``: PSUs minus strata for
the linearization, and for the replicate methods the same without the certainty strata (R's
rank of the JKn replicate weights minus 1).

``small_sample`` (``options.SMALL_SAMPLE``): "as-r" is all of the above; "bell-mccaffrey"
replaces the linearization by its bias-reduced form and the t reference's df by Satterthwaite's
(``t_degrees_of_freedom``; aggregator/stats/design/small_sample.py). The building blocks here
default to "as-r" (the Rao-Scott tests use them as R does); the estimates default to
``options.DEFAULT_SMALL_SAMPLE``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.stats.design.cells import DesignCells
from aggregator.stats.design.options import (
    AS_R,
    BELL_MCCAFFREY,
    DEFAULT_REPLICATES,
    DEFAULT_VARIANCE,
    JACKKNIFE,
    LINEARIZATION,
    VARIANCES,
)
from aggregator.stats.design.small_sample import (
    bias_reduced,
    check_small_sample,
    psu_weights,
    satterthwaite,
)

Function = Callable[[np.ndarray], np.ndarray]


def covariance(
    cells: DesignCells,
    theta: Function,
    jacobian: Function,
    method: str = DEFAULT_VARIANCE,
    replicates: int = DEFAULT_REPLICATES,
    seed: int = 0,
    *,
    small_sample: str = AS_R,
    ratio: bool = True,
) -> np.ndarray:
    """The design covariance of ``theta(S)`` by ``method`` (one of ``VARIANCES``), the
    linearization bias-reduced when ``small_sample`` is "bell-mccaffrey" (``ratio``: theta is a
    ratio of totals, a mean; False for totals)."""
    check_small_sample(small_sample)
    columns = cells.columns()
    _check_psus(cells)
    if method == LINEARIZATION:
        jac = np.atleast_2d(jacobian(columns.sum(axis=0)))
        z = columns @ jac.T
        if small_sample == BELL_MCCAFFREY:
            return bias_reduced(cells, z, psu_weights(cells, jac, ratio).share)
        return linearized(cells, z)
    if method not in VARIANCES:
        raise InvalidInputError(f"variance method must be one of {', '.join(VARIANCES)}")
    factors, rscales, scale = replicate_factors(cells, method, replicates, seed)
    if len(factors) == 0:  # every stratum sampled completely: a census, no sampling variance
        size = np.atleast_1d(theta(columns.sum(axis=0))).size
        return np.zeros((size, size))
    thetas = np.stack([np.atleast_1d(theta(f @ columns)) for f in factors])
    centred = thetas - thetas.mean(axis=0)
    return scale * (centred * rscales[:, None]).T @ centred


def linearized(cells: DesignCells, z: np.ndarray) -> np.ndarray:
    """With-replacement PSU covariance of per-cell linearized totals ``z`` (m, p)."""
    _check_psus(cells)
    v = np.zeros((z.shape[1], z.shape[1]))
    psus = cells.psus_per_stratum()
    certainty = cells.certainty
    for h in range(cells.strata_count):
        if certainty[h]:
            continue
        zh = z[cells.stratum == h]
        centred = zh - zh.mean(axis=0)
        factor = (1 - cells.sampling_fraction[h]) * psus[h] / (psus[h] - 1)
        v += factor * centred.T @ centred
    return v


def degrees_of_freedom(cells: DesignCells, method: str = DEFAULT_VARIANCE) -> int:
    """R's ``degf``: PSUs minus strata (the linearization, every stratum counted), or for a
    replicate method the same over the strata that get replicates (not the certainty ones)."""
    if method == LINEARIZATION:
        return cells.degrees_of_freedom
    sampled = ~cells.certainty[cells.stratum]
    return int(sampled.sum()) - int(np.unique(cells.stratum[sampled]).size)


def t_degrees_of_freedom(
    cells: DesignCells,
    jacobian: Function,
    method: str = DEFAULT_VARIANCE,
    small_sample: str = AS_R,
    ratio: bool = True,
) -> np.ndarray:
    """(p,) degrees of freedom of the t reference of each estimate's interval: R's degf
    ("as-r"), or Bell-McCaffrey's Satterthwaite df of the variance under the working model
    (of the bias-reduced linearization; of R's quadratic form for a replicate method)."""
    check_small_sample(small_sample)
    columns = cells.columns()
    jac = np.atleast_2d(jacobian(columns.sum(axis=0)))
    if small_sample == AS_R:
        return np.full(len(jac), float(degrees_of_freedom(cells, method)))
    _check_psus(cells)
    if cells.certainty.all():  # a census: no variance, no reference
        return np.zeros(len(jac))
    weights = psu_weights(cells, jac, ratio)
    return satterthwaite(cells, weights, corrected=method == LINEARIZATION)


def replicate_factors(
    cells: DesignCells, method: str, replicates: int, seed: int
) -> tuple[np.ndarray, np.ndarray, float]:
    """(R, m) cell multipliers, per-replicate scales and the overall scale of a method."""
    psus = cells.psus_per_stratum()
    m = len(cells.stratum)
    certainty = cells.certainty
    if certainty.all():  # a census: no replicates
        return np.ones((0, m)), np.zeros(0), 1.0
    if method == JACKKNIFE:
        deleted = np.flatnonzero(~certainty[cells.stratum])
        factors = np.ones((len(deleted), m))
        rscales = np.zeros(len(deleted))
        for r, c in enumerate(deleted):
            h = cells.stratum[c]
            inside = cells.stratum == h
            factors[r, inside] = psus[h] / (psus[h] - 1)
            factors[r, c] = 0.0
            rscales[r] = (psus[h] - 1) / psus[h] * (1 - cells.sampling_fraction[h])
        return factors, rscales, 1.0
    if replicates < 2:
        raise InvalidInputError("the bootstrap needs at least 2 replicates")
    rng = np.random.default_rng(seed)
    factors = np.ones((replicates, m))
    for h in np.flatnonzero(~certainty):
        members = np.flatnonzero(cells.stratum == h)
        draws = rng.integers(0, len(members), size=(replicates, len(members) - 1))
        chosen = np.zeros((replicates, len(members)))
        np.add.at(chosen, (np.arange(replicates)[:, None], draws), 1.0)
        factors[:, members] = chosen * len(members) / (len(members) - 1)
    return factors, np.ones(replicates), 1.0 / (replicates - 1)


def _check_psus(cells: DesignCells) -> None:
    psus = cells.psus_per_stratum()
    if len(psus) == 0:
        raise InsufficientDataError("a design-based variance needs reports")
    lonely = np.flatnonzero((psus < 2) & ~cells.certainty)
    if lonely.size:
        raise InsufficientDataError(
            f"{lonely.size} stratum(s) with a single PSU: its variance cannot be estimated "
            "(merge it with a neighbouring stratum, or give fpc 1 if it was taken whole)"
        )
