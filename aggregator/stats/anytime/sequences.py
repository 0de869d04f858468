"""Confidence sequences: intervals for the true frequencies, a two-group difference and an
ordinal mean score that hold at every n at once (survey-design-and-monitoring spec S.1).

Each is a function of the current sufficient statistic (n and the histogram's values) only: a
service recomputes it at any look from its store's running sums, and no state is carried between
looks. Every number says which guarantee it carries (``guarantee``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats.anytime import laws
from aggregator.stats.anytime.mixture import interval, log_capital
from aggregator.stats.channel import debiased_histogram
from aggregator.stats.validate import check_alpha, check_histogram
from client.mechanisms import Mechanism

#: The n near which the sequences are tightest unless the caller plans another.
DEFAULT_TUNED_N = 10_000

TIME_UNIFORM = (
    "time-uniform: with probability >= {level:g}, {what} at every n, whenever you look and "
    "whenever you stop"
)


@dataclass(frozen=True)
class ConfidenceSequence:
    """Intervals ``low``/``high`` for the k true frequencies at this look.

    ``estimate`` is the unbiased running estimate (no guarantee of its own). With
    ``simultaneous`` the intervals cover all k frequencies together at every n (alpha / k each);
    otherwise each covers its own frequency at every n.
    """

    estimate: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n: int
    alpha: float
    simultaneous: bool
    tuned_n: int
    method: str

    @property
    def guarantee(self) -> str:
        what = (
            "all k intervals cover their true frequencies together"
            if self.simultaneous
            else "each interval covers its true frequency"
        )
        return TIME_UNIFORM.format(level=1 - self.alpha, what=what)


@dataclass(frozen=True)
class DifferenceSequence:
    """Intervals for p_a - p_b, category by category, from two groups' reports (any
    interleaving of their arrivals)."""

    difference: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n: tuple[int, int]
    alpha: float
    simultaneous: bool
    tuned_n: int

    @property
    def guarantee(self) -> str:
        what = (
            "all k intervals cover their true differences together"
            if self.simultaneous
            else "each interval covers its true difference"
        )
        return TIME_UNIFORM.format(level=1 - self.alpha, what=what)


@dataclass(frozen=True)
class MeanScoreSequence:
    """An interval for the mean score sum_j s_j p_j of an ordinal question at this look."""

    mean: float
    low: float
    high: float
    n: int
    alpha: float
    tuned_n: int
    scores: tuple[float, ...]

    @property
    def guarantee(self) -> str:
        return TIME_UNIFORM.format(level=1 - self.alpha, what="the interval covers the mean score")


METHOD = "normal-mixture confidence sequence on the exact report law (Bernoulli{noise})"


def _check_tuned_n(tuned_n: object) -> int:
    if isinstance(tuned_n, bool) or not isinstance(tuned_n, int | np.integer) or tuned_n < 1:
        raise InvalidInputError(f"tuned_n must be a positive integer, got {tuned_n!r}")
    return int(tuned_n)


def frequency_sequence(
    hist: Histogram,
    alpha: float = 0.05,
    *,
    simultaneous: bool = True,
    tuned_n: int = DEFAULT_TUNED_N,
) -> ConfidenceSequence:
    """The confidence sequence of every category's frequency, at the look ``hist``.

    Coordinate j of a report's statistic is B + Z with B a 0/1 indicator of mean
    ``offset + slope * p_j`` (Z the noise of Gaussian/Laplace reports, 0 otherwise); the
    sequence for that mean is mapped through the channel to p_j. Candidates are limited to what
    p_j in [0, 1] allows, so the intervals lie in [0, 1].

    Raises
    ------
    InvalidInputError
        Public-coin reports (no per-category channel), alpha outside (0, 1), a bad tuned_n.
    """
    check_histogram(hist, minimum_n=0)
    mech = laws.check_mechanism(hist.mechanism, "confidence sequence")
    alpha = check_alpha(alpha)
    tuned_n = _check_tuned_n(tuned_n)
    level = alpha / hist.k if simultaneous else alpha
    c0, c1 = float(mech.offset), float(mech.slope)
    noise = laws.noise_variance(mech)

    def variance(m: np.ndarray) -> np.ndarray:
        return m * (1 - m) + noise

    def log_mgf(m: np.ndarray, lam: np.ndarray) -> np.ndarray:
        return laws.coordinate_log_mgf(mech, m, lam)

    # A category's interval depends on its total alone: one search per distinct total (a few
    # dozen even at k = 4,096), not per category.
    totals, where = np.unique(np.asarray(hist.values, dtype=float), return_inverse=True)
    bounds = (c0, c0 + c1)
    edges = np.array(
        [interval(hist.n, float(t), bounds, variance, log_mgf, tuned_n, level) for t in totals]
    ).reshape(-1, 2)
    low, high = (edges[where, 0] - c0) / c1, (edges[where, 1] - c0) / c1
    estimate = debiased_histogram(hist) if hist.n else np.full(hist.k, np.nan)
    noise_text = " plus the noise's sub-Gaussian/Laplace bound" if noise else ""
    return ConfidenceSequence(
        estimate,
        np.clip(low, 0.0, 1.0),
        np.clip(high, 0.0, 1.0),
        hist.n,
        alpha,
        simultaneous,
        tuned_n,
        METHOD.format(noise=noise_text),
    )


def frequency_excluded(
    n: int,
    values: np.ndarray,
    mechanism: Mechanism,
    p: np.ndarray,
    alpha: float = 0.05,
    *,
    simultaneous: bool = True,
    tuned_n: int = DEFAULT_TUNED_N,
) -> np.ndarray:
    """(paths, k): whether the sequence at n excludes p_j, for each row of ``values``
    (statistics of simulated paths at the same n): what a coverage study counts."""
    mech = laws.check_mechanism(mechanism, "confidence sequence")
    values = np.atleast_2d(values)
    level = alpha / mech.k if simultaneous else alpha
    noise = laws.noise_variance(mech)
    out = np.empty(values.shape, dtype=bool)
    for j in range(mech.k):
        m = np.array([mech.offset + mech.slope * p[j]])
        capital = log_capital(
            n,
            values[:, j],
            m,
            m * (1 - m) + noise,
            lambda mm, lam: laws.coordinate_log_mgf(mech, mm, lam),
            _check_tuned_n(tuned_n),
            level,
        )
        out[:, j] = capital >= np.log(1 / level)
    return out


def difference_sequence(
    hist_a: Histogram,
    hist_b: Histogram,
    alpha: float = 0.05,
    *,
    simultaneous: bool = True,
    tuned_n: int = DEFAULT_TUNED_N,
) -> DifferenceSequence:
    """Confidence sequence of p_a - p_b per category: each group's sequence at alpha / 2 (a
    union bound), so it holds however the two groups' reports interleave."""
    if hist_a.k != hist_b.k:
        raise InvalidInputError(f"the groups have {hist_a.k} and {hist_b.k} categories")
    alpha = check_alpha(alpha)
    a = frequency_sequence(hist_a, alpha / 2, simultaneous=simultaneous, tuned_n=tuned_n)
    b = frequency_sequence(hist_b, alpha / 2, simultaneous=simultaneous, tuned_n=tuned_n)
    return DifferenceSequence(
        a.estimate - b.estimate,
        a.low - b.high,
        a.high - b.low,
        (hist_a.n, hist_b.n),
        alpha,
        simultaneous,
        a.tuned_n,
    )


def mean_score_sequence(
    hist: Histogram,
    scores: Sequence[float] | None = None,
    alpha: float = 0.05,
    *,
    tuned_n: int = DEFAULT_TUNED_N,
) -> MeanScoreSequence:
    """Confidence sequence of the mean score sum_j s_j p_j (default scores 1..k).

    A report's contribution ``c + sum_j (s_j - c) x_j`` (x its de-biased vector) has mean the
    mean score for any shift c, and is a bounded signal plus, for Gaussian/Laplace reports, the
    scored noise: Hoeffding's bound on the signal's range R (randomized response:
    (max s - min s) / slope; unary and support rows: sum_j |s_j - c| / slope, c the median score;
    noise: max s - min s) plus the noise's own bound.
    """
    check_histogram(hist, minimum_n=0)
    alpha = check_alpha(alpha)
    law = _ScoreLaw(hist.mechanism, _scores(scores, hist.k), _check_tuned_n(tuned_n))
    total = float(law.totals(hist.n, hist.values))
    low, high = interval(hist.n, total, law.bounds, law.variance, law.log_mgf, law.tuned_n, alpha)
    mean = total / hist.n if hist.n else float("nan")
    return MeanScoreSequence(mean, low, high, hist.n, alpha, law.tuned_n, tuple(law.s.tolist()))


def mean_score_excluded(
    n: int,
    values: np.ndarray,
    mechanism: Mechanism,
    mean: float,
    scores: Sequence[float] | None = None,
    alpha: float = 0.05,
    *,
    tuned_n: int = DEFAULT_TUNED_N,
) -> np.ndarray:
    """Whether the mean-score sequence at n excludes ``mean``, for each row of ``values``
    (statistics of simulated paths at the same n): what a coverage study counts."""
    law = _ScoreLaw(mechanism, _scores(scores, mechanism.k), _check_tuned_n(tuned_n))
    totals = law.totals(n, np.atleast_2d(values))
    capital = log_capital(
        n, totals, np.array([mean]), law.variance(np.array([mean])), law.log_mgf, law.tuned_n, alpha
    )
    return capital >= np.log(1 / alpha)


class _ScoreLaw:
    """The bounded-plus-noise law of one report's scored contribution (``mean_score_sequence``)."""

    def __init__(self, mechanism: Mechanism, s: np.ndarray, tuned_n: int):
        self.mech = laws.check_mechanism(mechanism, "mean score")
        self.s, self.tuned_n = s, tuned_n
        self.c0, self.c1 = float(self.mech.offset), float(self.mech.slope)
        kind = self.mech.statistic_kind
        if kind == "counts":
            self.shift, self.spread = float(np.median(s)), float(np.ptp(s)) / self.c1
        elif kind == "noise":
            self.shift, self.spread = float(s.mean()), float(np.ptp(s))
        else:
            self.shift = float(np.median(s))
            self.spread = float(np.abs(s - self.shift).sum()) / self.c1
        self.centred = s - self.shift
        self.noise = laws.noise_variance(self.mech) * float(self.centred @ self.centred)
        self.bounds = (float(s.min()), float(s.max()))

    def totals(self, n: int, values: np.ndarray) -> np.ndarray:
        """The sum of the n contributions, from the statistic (rows of ``values``)."""
        return (values - n * self.c0) @ self.centred / self.c1 + n * self.shift

    def variance(self, m: np.ndarray) -> np.ndarray:
        return np.full_like(m, self.spread**2 / 4 + self.noise)

    def log_mgf(self, m: np.ndarray, lam: np.ndarray) -> np.ndarray:
        scored = laws.noise_log_mgf(self.mech, lam[..., None] * self.centred).sum(axis=-1)
        return lam**2 * self.spread**2 / 8 + scored + 0 * m


def _scores(scores: Sequence[float] | None, k: int) -> np.ndarray:
    if scores is None:
        return np.arange(1.0, k + 1)
    values = np.asarray(scores, dtype=float)
    if values.shape != (k,) or not np.all(np.isfinite(values)) or np.ptp(values) == 0:
        raise InvalidInputError(f"scores must be {k} finite numbers, not all equal")
    return values
