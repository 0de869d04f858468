"""Summaries a survey statistician reads beside the distribution: conditional distributions of a
two-attribute question (P(row | column)) and ordinal summaries of a question whose categories are
ordered (a mean score, and a trend test of equal mean scores across groups).

All are smooth functions of the unbiased estimate, so they use its closed-form covariance
(``estimate.covariance``):

* a conditional share P(x | y) = p(x, y) / p(y) is a ratio of two correlated, asymptotically
  normal estimates; its interval is Fieller's (the set of theta with
  (a - theta b)^2 <= z^2 Var(a - theta b)), which keeps its coverage where the delta method's
  does not (a denominator near zero), then clipped to [0, 1]. When p(y) is not significantly
  above zero at that level the set is unbounded and the interval is all of [0, 1]: the data do
  not pin the conditional share down, and the summary says so (``bounded`` False);
* a mean score sum_j s_j p_j has variance s^T Cov s; its Wald interval is clipped to the score
  range;
* the trend test compares G groups' mean scores: sum_g w_g (m_g - m_bar)^2 with w_g = 1 / Var(m_g)
  and m_bar their weighted mean is chi-square(G - 1) under H0 (equal mean scores). Against a
  shift along the order it has one degree of freedom per contrast instead of k - 1, so it finds
  a trend that the omnibus homogeneity test spreads over all categories.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from aggregator.errors import InvalidInputError
from aggregator.stats.estimate import Estimate
from aggregator.stats.validate import check_alpha

TREND_LABEL = "trend test of equal mean scores (Wald)"


@dataclass(frozen=True)
class Conditional:
    """P(row category | column category) of a two-attribute question (or the transpose when
    conditioning on rows): ``shares[i, j]`` with Fieller intervals ``low``/``high``;
    ``bounded[j]`` is False where the condition's own share is not significantly above zero."""

    shares: np.ndarray  # (categories of the outcome, categories of the condition)
    low: np.ndarray
    high: np.ndarray
    bounded: np.ndarray  # (categories of the condition,)
    condition_shares: np.ndarray
    confidence: float
    n: int


@dataclass(frozen=True)
class MeanScore:
    """The mean score of an ordinal question and its Wald interval (within the score range)."""

    mean: float
    standard_error: float
    low: float
    high: float
    confidence: float
    n: int
    scores: tuple[float, ...]


def _check_confidence(confidence: float) -> float:
    if not isinstance(confidence, int | float) or not 0 < confidence < 1:
        raise InvalidInputError(f"confidence must be in (0, 1), got {confidence!r}")
    return float(confidence)


def conditional(
    est: Estimate, shape: tuple[int, int], given: int = 1, confidence: float | None = None
) -> Conditional:
    """P(outcome | condition) from the joint estimate of a two-attribute question.

    Parameters
    ----------
    est : Estimate
        The joint estimate, categories in row-major order of ``shape``.
    shape : (rows, columns)
        The question's two attributes' numbers of categories.
    given : {0, 1}, default 1
        The attribute conditioned on: 1 gives P(row | column), 0 gives P(column | row).
    confidence : float, optional
        Interval level; default the estimate's own.

    Raises
    ------
    InvalidInputError
        A shape that does not match the estimate, or a ``given`` other than 0 or 1.
    """
    level = _check_confidence(est.confidence if confidence is None else confidence)
    z = float(stats.norm.isf((1 - level) / 2))
    return conditional_of(est.frequencies, est.covariance, est.n, shape, given, level, z)


def conditional_of(
    p: np.ndarray,
    cov: np.ndarray,
    n: int,
    shape: tuple[int, int],
    given: int,
    level: float,
    quantile: float,
) -> Conditional:
    """:func:`conditional` of a joint estimate ``p`` with covariance ``cov``, its Fieller
    intervals at the reference ``quantile`` (normal for a simple estimate, t(df) for a
    design-based one)."""
    rows, columns = (int(v) for v in shape)
    k = p.size
    if rows * columns != k or rows < 2 or columns < 2:
        raise InvalidInputError(f"shape {shape} does not match a two-attribute estimate of {k}")
    if given not in (0, 1):
        raise InvalidInputError(f"given must be 0 (rows) or 1 (columns), got {given!r}")
    z = quantile
    index = np.arange(k).reshape(rows, columns)
    if given == 0:
        index = index.T  # outcome along axis 0, condition along axis 1
    conditions = index.shape[1]
    shares = np.empty(index.shape)
    low, high = np.empty(index.shape), np.empty(index.shape)
    bounded = np.empty(conditions, dtype=bool)
    margin = np.empty(conditions)
    for j in range(conditions):
        cells = index[:, j]
        b = float(p[cells].sum())
        v_bb = float(cov[np.ix_(cells, cells)].sum())
        margin[j] = b
        # a plug-in variance of 0 (every report in one privatized category, e.g. n = 1) pins
        # nothing down: the condition is not estimable, its interval all of [0, 1]
        bounded[j] = b > 0 and v_bb > 0 and b * b > z * z * v_bb
        for i, cell in enumerate(cells):
            a = float(p[cell])
            v_aa = float(cov[cell, cell])
            v_ab = float(cov[cell, cells].sum())
            shares[i, j] = min(max(a / b, 0.0), 1.0) if b > 0 else 0.0
            low[i, j], high[i, j] = _fieller(a, b, v_aa, v_ab, v_bb, z, bool(bounded[j]))
    return Conditional(shares, low, high, bounded, margin, level, n)


def _fieller(
    a: float, b: float, v_aa: float, v_ab: float, v_bb: float, z: float, bounded: bool
) -> tuple[float, float]:
    """Fieller's interval for a / b, clipped to [0, 1]; all of [0, 1] where it is unbounded."""
    if not bounded:
        return 0.0, 1.0
    z2 = z * z
    quad = b * b - z2 * v_bb  # > 0: bounded
    half = a * b - z2 * v_ab
    disc = max(half * half - quad * (a * a - z2 * v_aa), 0.0)
    root = np.sqrt(disc)
    lo, hi = (half - root) / quad, (half + root) / quad
    return float(min(max(lo, 0.0), 1.0)), float(min(max(hi, 0.0), 1.0))


def default_scores(k: int) -> tuple[float, ...]:
    """Scores 1..k: the usual coding of a Likert item."""
    return tuple(float(j) for j in range(1, k + 1))


def check_scores(scores: Sequence[float] | None, k: int) -> np.ndarray:
    """The scores of k categories (default 1..k); InvalidInputError unless k finite numbers,
    not all equal."""
    if scores is None:
        return np.array(default_scores(k))
    values = np.asarray(scores, dtype=float)
    if values.shape != (k,) or not np.all(np.isfinite(values)):
        raise InvalidInputError(f"scores must be {k} finite numbers, one per category")
    if np.all(values == values[0]):
        raise InvalidInputError("scores must not all be equal")
    return values


def mean_score(
    est: Estimate, scores: Sequence[float] | None = None, confidence: float | None = None
) -> MeanScore:
    """The mean score sum_j s_j p_j of an ordinal question (default scores 1..k) with its Wald
    interval, clipped to the range of the scores. InvalidInputError when the plug-in variance is
    0 (too few reports to give any interval)."""
    s = check_scores(scores, est.frequencies.size)
    level = _check_confidence(est.confidence if confidence is None else confidence)
    mean = float(s @ est.frequencies)
    se = float(np.sqrt(max(float(s @ est.covariance @ s), 0.0)))
    if se == 0:
        raise InvalidInputError(
            f"the mean score of {est.n} report(s) has a plug-in variance of 0 (every report in "
            "one privatized category): no interval can be given; collect more reports"
        )
    z = float(stats.norm.isf((1 - level) / 2))
    low = min(max(mean - z * se, float(s.min())), float(s.max()))
    high = min(max(mean + z * se, float(s.min())), float(s.max()))
    return MeanScore(mean, se, low, high, level, est.n, tuple(s.tolist()))


@dataclass(frozen=True)
class TrendResult:
    """The trend test across groups: statistic, p-value, dof and the groups' mean scores."""

    statistic: float
    pvalue: float
    dof: int
    reject: bool
    alpha: float
    means: tuple[MeanScore, ...]
    method: str = TREND_LABEL
    denominator_df: float | None = None  # a design-based test: F(dof, denominator_df)

    def summary(self) -> str:
        verdict = "reject" if self.reject else "do not reject"
        law = (
            f"chi2({self.dof})"
            if self.denominator_df is None
            else f"F({self.dof}, {self.denominator_df:g})"
        )
        return (
            f"{self.method}: {law} = {self.statistic:.4g}, p = {self.pvalue:.4g} "
            f"-> {verdict} equal mean scores at alpha = {self.alpha:g}"
        )


def score_trend(
    estimates: Sequence[Estimate], scores: Sequence[float] | None = None, alpha: float = 0.05
) -> TrendResult:
    """Do G >= 2 groups of an ordinal question have equal mean scores? Wald chi-square(G - 1)
    from each group's mean score and its standard error.

    Raises
    ------
    InvalidInputError
        Fewer than two groups, estimates of different sizes, malformed scores, or a group whose
        mean score has no variance (every report in one category of a noiseless estimate).
    """
    alpha = check_alpha(alpha)
    if len(estimates) < 2:
        raise InvalidInputError("score_trend needs two or more groups")
    k = estimates[0].frequencies.size
    if any(e.frequencies.size != k for e in estimates):
        raise InvalidInputError("every group's estimate must have the same categories")
    means = tuple(mean_score(e, scores) for e in estimates)
    se = np.array([m.standard_error for m in means])
    if not np.all(se > 0):
        raise InvalidInputError("a group's mean score has zero variance: no test is possible")
    m = np.array([x.mean for x in means])
    w = 1 / se**2
    center = float(w @ m / w.sum())
    statistic = float(w @ (m - center) ** 2)
    dof = len(estimates) - 1
    pvalue = float(stats.chi2.sf(statistic, dof))
    return TrendResult(statistic, pvalue, dof, pvalue <= alpha, alpha, means)
