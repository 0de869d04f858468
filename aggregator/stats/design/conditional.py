"""Design-based conditional distributions of a two-attribute question: P(outcome | condition)
as ratios of the Hajek shares, with Fieller intervals from their joint design covariance and the
t reference of the design's interval degrees of freedom (the smallest over the categories)."""

from __future__ import annotations

import numpy as np
from scipy import stats

from aggregator.stats.design.estimate import DesignEstimate
from aggregator.stats.summaries import Conditional, conditional_of


def design_conditional(
    est: DesignEstimate, shape: tuple[int, int], given: int, confidence: float
) -> Conditional:
    """P(row | column) (``given`` 1) or P(column | row) (``given`` 0) of a one-domain design
    estimate."""
    df = float(np.min(est.interval_df[0]))
    quantile = float(stats.t.isf((1 - confidence) / 2, df))
    return conditional_of(
        est.estimate[0], est.covariance, est.n, shape, given, confidence, quantile
    )
