"""Sequential tests: e-processes for goodness of fit, independence and homogeneity whose
p-values stay valid however often one looks and whenever one stops (survey-design-and-monitoring
spec S.2).

Between two looks a stream (one group's reports) gains a batch: n_b reports whose statistic rows
sum to T_b. Before the batch, an alternative p_alt is estimated from the stream's earlier reports
only. For each p, a tilt lam_b(p) from p towards p_alt makes
``exp(lam_b . T_b - n_b kappa_p(lam_b))`` a factor of expectation at most 1 when the answers are
iid ~ p, where ``kappa_p(lam) = log sum_x p_x E[exp(lam . Y) | x]`` (``laws.log_conditional_mgf``;
an upper bound where the report law is not known in closed form). The product over batches,
``M_n(p)``, is a test martingale under p: the goodness-of-fit e-process is ``M_n(p0)``, a
composite null's the infimum of ``M_n(p)`` over the null (``nulls``); by Ville's inequality
P(E_n ever >= 1/alpha) <= alpha under the null.

The tilt: for randomized response ``log(A p_alt) - log(A p)``, which makes ``M_n(p)`` exactly the
plug-in likelihood-ratio martingale of survey-design-and-monitoring spec S.2; otherwise
``Cov_p^+ (mu_alt - mu_p)``, the maximiser of the expected growth ``lam . mu_alt - kappa_p(lam)``
to second order, shortened into the MGF's domain (Laplace noise) or, for the support counts
still read through Hoeffding's bound (local hashing), scaled to that bound's optimum. Only
batch sums are read, so a service updates the e-process from its store's running sums.

State kept between looks: per stream the last cumulative (n, values) and, per batch, n_b, T_b
and p_alt (O(k) numbers); the running log e-value of a simple null; the last minimiser; the
running maximum.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import special

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats.anytime import laws
from aggregator.stats.anytime.nulls import NullModel
from aggregator.stats.channel import debiased, project_simplex
from aggregator.stats.validate import check_alpha

#: Pseudo-reports of the null fit mixed into the alternative's estimate before a tilt is chosen,
#: per category: early, noisy estimates then bet little.
PRIOR_REPORTS = 2.0

#: The largest |lam_j| a tilt may use (a log-odds of 4 per cell).
MAX_TILT = 4.0


@dataclass(frozen=True)
class SequentialResult:
    """An e-process at one look.

    ``evalue`` is E_n now; ``max_evalue`` its running maximum over the looks so far;
    ``pvalue = min(1, 1 / max_evalue)`` is anytime-valid: P(it ever falls to alpha) <= alpha
    under the null, whatever the looks and the stopping. ``reject`` is max_evalue >= 1/alpha,
    first reached at ``rejected_at`` reports. ``stop`` is the stopping rule's verdict ("evidence":
    the e-value passed 1/alpha; "maximum n": the planned maximum was reached; None: go on).
    """

    evalue: float
    max_evalue: float
    pvalue: float
    n: int
    alpha: float
    reject: bool
    rejected_at: int | None
    stop: str | None
    method: str
    path: tuple[tuple[int, float], ...] = field(repr=False)

    @property
    def guarantee(self) -> str:
        return (
            f"anytime-valid: under the null, P(the e-value ever reaches {1 / self.alpha:g}) "
            f"<= {self.alpha:g} and P(the p-value ever falls to u) <= u, at every look"
        )

    def summary(self) -> str:
        verdict = "reject" if self.reject else "no rejection yet"
        stop = f"; stop ({self.stop})" if self.stop else ""
        return (
            f"{self.method}: n = {self.n}, e-value = {self.evalue:.4g} "
            f"(max {self.max_evalue:.4g}), anytime p = {self.pvalue:.4g}, "
            f"{verdict} at alpha = {self.alpha:g}{stop}"
        )


class EProcess:
    """A running e-process over one or more streams of reports (one per group), updated from
    cumulative histograms at each look (``update``).

    Parameters
    ----------
    null : NullModel
        The null hypothesis (``nulls.simple``, ``nulls.homogeneous``, ``nulls.independent``).
    mechanisms : sequence of Mechanism
        One per stream; all with the null's k categories.
    alpha : float
        Level of the stopping rule and of ``reject``.
    max_n : int, optional
        The planned maximum number of reports (all streams): the rule stops there.
    """

    def __init__(self, null: NullModel, mechanisms: Sequence, alpha: float = 0.05, max_n=None):
        self.null = null
        self.mechanisms = [laws.check_mechanism(m, "sequential test") for m in mechanisms]
        for mech in self.mechanisms:
            if mech.k != null.k:
                raise InvalidInputError(f"the null has {null.k} categories, a stream has {mech.k}")
        self.alpha = check_alpha(alpha)
        if max_n is not None and (
            isinstance(max_n, bool) or not isinstance(max_n, numbers.Integral) or max_n < 1
        ):
            raise InvalidInputError(f"max_n must be a positive integer, got {max_n!r}")
        self.max_n = None if max_n is None else int(max_n)
        self._seen = [(0, np.zeros(m.statistic_size)) for m in self.mechanisms]
        self._batches: list[list[tuple[int, np.ndarray, np.ndarray]]] = [[] for _ in mechanisms]
        self._fit = null.start()
        #: Per stream, the log factors of its batches at the null point each tilt was chosen at.
        self._fixed = [0.0 for _ in mechanisms]
        #: Per randomized-response stream, the plug-in log-likelihood sum_b T_b . log(A p_alt,b).
        self._plug_in = [0.0 for _ in mechanisms]
        self._path: list[tuple[int, float]] = []
        self._max = 1.0
        self._rejected_at: int | None = None

    def update(self, looks: Sequence[Histogram]) -> SequentialResult:
        """Take the cumulative histogram of every stream at this look; return the result."""
        if len(looks) != len(self.mechanisms):
            raise InvalidInputError(f"expected {len(self.mechanisms)} histograms, got {len(looks)}")
        for i, (hist, mech) in enumerate(zip(looks, self.mechanisms, strict=True)):
            if not isinstance(hist, Histogram) or hist.mechanism != mech:
                raise InvalidInputError(f"stream {i}: expected a histogram of {mech.describe()}")
            if hist.n < self._seen[i][0]:
                raise InvalidInputError(f"stream {i}: n went down to {hist.n}")
        new: list[tuple[int, tuple[int, np.ndarray, np.ndarray]]] = []
        for i, hist in enumerate(looks):
            n_seen, seen = self._seen[i]
            if hist.n > n_seen:
                alt = _alternative(self.mechanisms[i], n_seen, seen, self._fit)
                new.append((i, (hist.n - n_seen, hist.values - seen, alt)))
                self._seen[i] = (hist.n, np.array(hist.values))
        for i, batch in new:
            self._batches[i].append(batch)
            mech = self.mechanisms[i]
            self._fixed[i] += _log_m(mech, [batch], self._fit)
            if mech.statistic_kind == "counts":
                self._plug_in[i] += float(batch[1] @ np.log(mech.offset + mech.slope * batch[2]))
        if not new:
            log_e = math.log(self._path[-1][1]) if self._path else 0.0
        elif self.null.p0 is not None:  # M_n(p0): each batch's factor is added once
            log_e = float(sum(self._fixed))
        else:
            self._fit, log_e = self.null.infimum(self._log_m, self._starts())
        return self._result(log_e)

    def _starts(self) -> list[np.ndarray]:
        """Where the infimum is searched from: the last minimiser and the pooled estimate."""
        pooled = np.zeros(self.null.k)
        for mech, (n, values) in zip(self.mechanisms, self._seen, strict=True):
            if n:
                pooled += n * project_simplex(debiased(values, n, mech))
        return [self._fit, 0.9 * pooled / pooled.sum() + 0.1 / self.null.k]

    def _log_m(self, p: np.ndarray) -> float:
        """log M_n(p) over every stream; for randomized response (kappa vanishes at these
        tilts) the plug-in log-likelihood minus the log-likelihood of p, in O(k)."""
        total = 0.0
        for i, (mech, batches) in enumerate(zip(self.mechanisms, self._batches, strict=True)):
            if mech.statistic_kind == "counts":
                seen = self._seen[i][1]
                total += self._plug_in[i] - float(seen @ np.log(mech.offset + mech.slope * p))
            elif batches:
                total += _log_m(mech, batches, p)
        return total

    def _result(self, log_e: float) -> SequentialResult:
        n = sum(seen[0] for seen in self._seen)
        evalue = math.exp(min(log_e, 700.0))
        self._path.append((n, evalue))
        self._max = max(self._max, evalue)
        reject = self._max >= 1 / self.alpha
        if reject and self._rejected_at is None:
            self._rejected_at = n
        stop = "evidence" if reject else None
        if stop is None and self.max_n is not None and n >= self.max_n:
            stop = "maximum n"
        return SequentialResult(
            evalue,
            self._max,
            min(1.0, 1 / self._max),
            n,
            self.alpha,
            reject,
            self._rejected_at,
            stop,
            f"sequential {self.null.name} (e-process)",
            tuple(self._path),
        )


def _log_m(mech, batches, p: np.ndarray) -> float:
    """log of one stream's factors exp(lam_b(p) . T_b - n_b kappa_p(lam_b(p))) over ``batches``."""
    sizes = np.array([b[0] for b in batches], dtype=float)
    sums = np.array([b[1] for b in batches])
    lam = tilts(mech, p, np.array([b[2] for b in batches]))
    log_p = np.log(np.clip(p, 1e-300, None))
    kappa = special.logsumexp(log_p + laws.log_conditional_mgf(mech, lam), axis=1)
    return float(np.sum(lam * sums) - sizes @ kappa)


def _alternative(mech, n: int, values: np.ndarray, fit: np.ndarray) -> np.ndarray:
    """The next batch's alternative: the stream's estimate so far on the simplex, mixed with
    ``PRIOR_REPORTS`` pseudo-reports per category of the null fit (the fit itself at n = 0)."""
    if n == 0:
        return fit
    prior = PRIOR_REPORTS * mech.k
    return (n * project_simplex(debiased(values, n, mech)) + prior * fit) / (n + prior)


def tilts(mech, p: np.ndarray, alts: np.ndarray) -> np.ndarray:
    """lam_b(p) for every batch (rows of ``alts``): from the null member p towards p_alt."""
    c0, c1 = float(mech.offset), float(mech.slope)
    if mech.statistic_kind == "counts":
        return np.log(c0 + c1 * alts) - np.log(c0 + c1 * p)
    shift = c1 * (alts - p)
    lam = shift @ np.linalg.pinv(mech.report_covariance(p))
    if laws.hoeffding_bound(mech):  # the optimum of t d . shift - t^2 (sum |d|)^2 / 8
        spread = np.abs(lam).sum(axis=1, keepdims=True) ** 2
        gain = np.sum(lam * shift, axis=1, keepdims=True)
        lam = lam * np.where(spread > 0, 4 * gain / np.where(spread > 0, spread, 1.0), 0.0)
    largest = np.abs(lam).max(axis=1, keepdims=True)
    limit = np.minimum(MAX_TILT, laws.tilt_limit(mech))
    return lam * np.minimum(1.0, limit / np.maximum(largest, 1e-300))
