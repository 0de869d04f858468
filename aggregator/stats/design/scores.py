"""Design-based mean scores of an ordinal question and the test of equal mean scores across
groups, the groups domains of one design: each mean score is the linear function ``s . pi_g``
of a domain's Hajek estimate, its design variance ``s' C_gg s``, its interval t(design df)
(clipped to the score range, as the simple one is); across groups an adjusted Wald F of the
contrasts ``m_g - m_G`` with their joint design covariance, referred to F(q, df - q + 1)
([Korn1990])."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.stats.design.estimate import DesignEstimate
from aggregator.stats.summaries import MeanScore, TrendResult, check_scores

#: How the design-based trend test is named in its result.
DESIGN_TREND_LABEL = "design-based test of equal mean scores (adjusted Wald F)"


def design_mean_scores(
    est: DesignEstimate, scores: Sequence[float] | None, confidence: float
) -> tuple[MeanScore, ...]:
    """Each domain's mean score with its design standard error and t interval (the domain's
    ``interval_df``: R's degf as R, Bell-McCaffrey's by default)."""
    groups, k = est.estimate.shape
    s = check_scores(scores, k)
    out = []
    for g in range(groups):
        df = float(est.interval_df[g].min())
        if df < 1:
            raise InsufficientDataError("the design has no degrees of freedom for an interval")
        t = float(stats.t.ppf(0.5 + confidence / 2, df))
        block = est.covariance[g * k : (g + 1) * k, g * k : (g + 1) * k]
        mean = float(s @ est.estimate[g])
        se = float(np.sqrt(max(float(s @ block @ s), 0.0)))
        if se == 0:
            raise InvalidInputError("a mean score has a design variance of 0: no interval")
        low = min(max(mean - t * se, float(s.min())), float(s.max()))
        high = min(max(mean + t * se, float(s.min())), float(s.max()))
        out.append(MeanScore(mean, se, low, high, confidence, int(est.counts[g]), tuple(s)))
    return tuple(out)


def design_score_trend(
    est: DesignEstimate, scores: Sequence[float] | None, alpha: float, confidence: float = 0.95
) -> TrendResult:
    """Do the domains (G >= 2) have equal mean scores? The adjusted Wald F of the G - 1
    contrasts with the last domain, F(G - 1, df - G + 2); InsufficientDataError when the
    design has too few degrees of freedom for G - 1 contrasts."""
    groups, k = est.estimate.shape
    if groups < 2:
        raise InvalidInputError("a trend test needs two or more groups")
    s = check_scores(scores, k)
    means = design_mean_scores(est, s.tolist(), confidence)
    weights = np.kron(np.eye(groups), s)  # (G, G k): each domain's mean score
    covariance = weights @ est.covariance @ weights.T
    contrasts = np.hstack([np.eye(groups - 1), -np.ones((groups - 1, 1))])
    difference = contrasts @ np.array([m.mean for m in means])
    q, df = groups - 1, est.degrees_of_freedom
    if df - q + 1 < 1:
        raise InsufficientDataError(
            f"{df} design degrees of freedom are too few to compare {groups} groups"
        )
    wald = float(difference @ np.linalg.pinv(contrasts @ covariance @ contrasts.T) @ difference)
    statistic = wald * (df - q + 1) / (df * q)
    pvalue = float(stats.f.sf(statistic, q, df - q + 1))
    return TrendResult(
        statistic,
        pvalue,
        q,
        pvalue <= alpha,
        alpha,
        means,
        DESIGN_TREND_LABEL,
        denominator_df=float(df - q + 1),
    )
