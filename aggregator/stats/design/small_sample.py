"""Small-sample correction of the linearization variance and of the t reference (docs/designs.md,
"Few PSUs"), from the design cells alone.

With few PSUs the with-replacement linearization variance is biased low and t(PSUs - strata)
is too light a reference: R ``survey``'s 95 % intervals cover 0.90-0.93 with 10-14 PSUs. The
default ("bell-mccaffrey") repairs both, after [Bell2002] and [Imbens2016]:

* bias-reduced linearization (CR2): a PSU's centred linearized total ``r_c`` (R's) is divided
  by ``sqrt(1 - h_c)``, ``h_c`` its leverage: the diagonal of ``I - R``, ``R = C (I - s 1')``
  the map from the PSU totals at the true value to the residual totals the variance sees (C
  centres within each stratum; ``s_c`` the PSU's share of the weight behind the estimate, its
  pull on a ratio estimate: ``W_cg / W_g`` for a domain's Hajek mean, the calibrated weight's
  share for a post-stratified or raked one, 0 for a total). So ``h_c = 1 / n_h + s_c - mean_h
  s``: with equal PSU weights within a stratum, ``1 / (1 - h_c) = n_h / (n_h - 1)``, R's
  factor, and the heavier PSUs of an unequal design get more;
* Satterthwaite degrees of freedom of that variance as a quadratic form ``u' R' D R u`` of
  independent PSU totals u under a working model, ``df = tr(D P)^2 / tr(D P D P)``, ``P = R
  Omega R'``: Bell and McCaffrey's df. Omega is Imbens and Kolesar's random-effects model: a
  PSU total's variance ``(1 - rho) sum w^2 + rho W_c^2`` (in the estimate's units), ``rho`` the
  intra-PSU correlation estimated from the cells by one-way ANOVA (0 without two reports in a
  PSU). The df counts how many PSUs effectively carry the variance: R's PSUs minus strata when
  they weigh alike, fewer when a few heavy PSUs dominate.

"as-r" keeps R's variance and degf. Replicate variances (jackknife, bootstrap) keep their
variance (the jackknife already re-estimates the ratio without each PSU) and take the df of R's
linearization quadratic form under the same working model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse

from aggregator.errors import InvalidInputError
from aggregator.stats.design.cells import DesignCells
from aggregator.stats.design.options import SMALL_SAMPLE

#: Below this, ``1 - h_c`` is a PSU that carries all the weight of its estimate: its residual is
#: 0 and so is its adjusted one.
_FULL_LEVERAGE = 1e-12


def check_small_sample(small_sample: object) -> str:
    if small_sample not in SMALL_SAMPLE:
        raise InvalidInputError(f"small-sample mode must be one of {', '.join(SMALL_SAMPLE)}")
    return str(small_sample)


@dataclass(frozen=True)
class PsuWeights:
    """Per PSU (rows) and estimate (columns): ``share``, the PSU's share of the weight behind the
    estimate (0 for a total), and ``variance``, its total's working-model variance (up to a
    common factor)."""

    share: np.ndarray
    variance: np.ndarray


def psu_weights(cells: DesignCells, jacobian: np.ndarray, ratio: bool) -> PsuWeights:
    """The PSUs' weights in the units of the estimates whose Jacobian at the totals is
    ``jacobian`` (p, G (k + 1)): its derivatives by the weighted contributions applied to the
    PSU's weights (a ratio of totals: means, post-stratified and raked estimates; ``ratio``
    False: totals, no share)."""
    groups, k = cells.total.shape[1:]
    by_total = jacobian.reshape(-1, groups, k + 1)[:, :, :k]  # (p, G, k)
    # Per estimate one derivative per domain: the categories of a domain weigh alike.
    derivative = by_total.sum(axis=2) / np.maximum((by_total != 0).sum(axis=2), 1)  # (p, G)
    weight = cells.weight @ derivative.T  # (m, p)
    squares = cells.weight_square @ (derivative**2).T
    rho = intra_psu_correlation(cells)
    variance = (1 - rho) * squares + rho * weight**2
    variance[cells.certainty[cells.stratum]] = 0.0  # taken whole: not random
    return PsuWeights(weight if ratio else np.zeros_like(weight), variance)


def intra_psu_correlation(cells: DesignCells) -> float:
    """One-way ANOVA estimate of the correlation of two contributions in one PSU, within
    strata and domains, pooled over categories, cut to [0, 1] (0 when no PSU has 2 reports)."""
    n, m = cells.n, len(cells.stratum)
    between_df = m - cells.strata_count
    if n - m < 1 or between_df < 1:
        return 0.0
    safe = np.where(cells.weight > 0, cells.weight, 1.0)[:, :, None]
    within = float(np.sum(cells.square - cells.total**2 / safe))
    stratum = np.zeros((cells.strata_count, *cells.total.shape[1:]))
    np.add.at(stratum, cells.stratum, cells.total)
    weight = np.zeros((cells.strata_count, cells.total.shape[1]))
    np.add.at(weight, cells.stratum, cells.weight)
    spread = float(np.sum(cells.square)) - float(
        np.sum(stratum**2 / np.where(weight > 0, weight, 1.0)[:, :, None])
    )
    within_mean = within / (n - m)
    between_mean = (spread - within) / between_df
    size = n / m
    denominator = between_mean + (size - 1) * within_mean
    if denominator <= 0:
        return 0.0
    return float(np.clip((between_mean - within_mean) / denominator, 0.0, 1.0))


def leverage(cells: DesignCells, share: np.ndarray) -> np.ndarray:
    """(m, p) ``h_c = 1 / n_h + s_c - mean_h s``, the diagonal of ``I - C (I - s 1')``."""
    psus = cells.psus_per_stratum()
    mean = np.zeros((cells.strata_count, share.shape[1]))
    np.add.at(mean, cells.stratum, share)
    mean /= psus[:, None]
    return 1.0 / psus[cells.stratum][:, None] + share - mean[cells.stratum]


def bias_reduced(cells: DesignCells, z: np.ndarray, share: np.ndarray) -> np.ndarray:
    """The CR2 covariance of per-cell linearized totals ``z`` (m, p): each PSU's centred total
    divided by ``sqrt(1 - h_c)`` per estimate, with the finite population correction."""
    room = 1.0 - leverage(cells, share)
    adjust = np.where(room > _FULL_LEVERAGE, 1.0 / np.sqrt(np.maximum(room, _FULL_LEVERAGE)), 0.0)
    v = np.zeros((z.shape[1], z.shape[1]))
    for h in np.flatnonzero(~cells.certainty):
        inside = cells.stratum == h
        zh = z[inside]
        adjusted = (zh - zh.mean(axis=0)) * adjust[inside]
        v += (1 - cells.sampling_fraction[h]) * adjusted.T @ adjusted
    return v


def satterthwaite(cells: DesignCells, weights: PsuWeights, corrected: bool) -> np.ndarray:
    """(p,) Bell-McCaffrey degrees of freedom of each estimate's variance: of the CR2 form
    (``corrected``) or of R's (factors ``n_h / (n_h - 1)``)."""
    psus = cells.psus_per_stratum()[cells.stratum].astype(float)
    sampled = ~cells.certainty[cells.stratum]
    fpc = 1 - cells.sampling_fraction[cells.stratum]
    h = leverage(cells, weights.share)
    out = np.empty(weights.share.shape[1])
    seen: dict[bytes, float] = {}
    for o in range(len(out)):
        s, omega = weights.share[:, o], weights.variance[:, o]
        if corrected:
            room = 1.0 - h[:, o]
            factor = np.where(room > _FULL_LEVERAGE, 1.0 / np.maximum(room, _FULL_LEVERAGE), 0.0)
        else:
            factor = psus / np.maximum(psus - 1, 1)
        d = np.where(sampled, fpc * factor, 0.0)
        key = np.concatenate([s, omega, d]).tobytes()
        if key not in seen:
            seen[key] = _quadratic_form_df(cells.stratum, psus, s, omega, d)
        out[o] = seen[key]
    return out


def _quadratic_form_df(
    stratum: np.ndarray, psus: np.ndarray, s: np.ndarray, omega: np.ndarray, d: np.ndarray
) -> float:
    """``tr(D P)^2 / tr(D P D P)``, ``P = R Omega R'``, ``R = C - (C s) 1'``, from P = diag(omega)
    + X Y' with sparse X, Y of a few columns per stratum: O(m) for any number of PSUs."""
    m = len(stratum)
    strata = int(stratum.max()) + 1
    stratum_sum = np.bincount(stratum, weights=omega, minlength=strata)
    centred_omega = omega - (stratum_sum / np.bincount(stratum, minlength=strata))[stratum]
    c = s - (np.bincount(stratum, weights=s, minlength=strata) / np.bincount(stratum))[stratum]
    rows = np.arange(m)
    ones = np.ones(m)
    # C Omega C within each stratum: - omega 1' / n - 1 omega' / n + (sum omega / n^2) 1 1'
    pieces = [
        (-omega / psus, ones),
        (ones, -omega / psus),
        (stratum_sum[stratum] / psus**2, ones),
    ]
    x_blocks = [sparse.csc_array((a, (rows, stratum)), shape=(m, strata)) for a, _ in pieces]
    y_blocks = [sparse.csc_array((b, (rows, stratum)), shape=(m, strata)) for _, b in pieces]
    # The ratio's pull: - (C omega) c' - c (C omega)' + (sum omega) c c'
    x_global = np.stack([-centred_omega, -c, omega.sum() * c], axis=1)
    y_global = np.stack([c, centred_omega, c], axis=1)
    x = sparse.hstack([*x_blocks, sparse.csc_array(x_global)]).tocsc()
    y = sparse.hstack([*y_blocks, sparse.csc_array(y_global)]).tocsc()
    low_rank_diagonal = np.asarray(x.multiply(y).sum(axis=1)).reshape(-1)
    trace = float(np.sum(d * (omega + low_rank_diagonal)))
    dx = x.multiply(d[:, None]).tocsc()
    dy = y.multiply(d[:, None]).tocsc()
    square = (
        float(np.sum(d**2 * omega**2))
        + 2 * float(np.sum(d**2 * omega * low_rank_diagonal))
        + float(sparse.csc_array(x.T @ dx).multiply(y.T @ dy).sum())
    )
    if trace <= 0 or square <= 0:
        return 0.0
    return trace**2 / square
