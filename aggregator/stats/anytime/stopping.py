"""When a sequential goodness-of-fit test is expected to stop under a planned alternative: a
forecast of the stopping time's law, and a simulation of it (survey-design-and-monitoring spec
S.2; docs/planning.md "Sequential plans").

The forecast models log E_n, looked at every ``batch`` reports, as a Brownian motion: per report
it gains ``drift = E_p1[lam . Y] - kappa_p0(lam)``, the growth of the tilt the e-process would
use if it knew p1 (exact for randomized response: the KL divergence of the report laws), with
variance ``Var_p1(lam . Y)``. Learning p1 costs the plug-in a regret of ``(k - 1) / 2`` nats per
doubling of n, counted per look (the alternative is re-estimated once a look), and the first
batch bets nothing. P(stopped by n) is the first-passage law of such a motion over
log(1/alpha) (raised by Siegmund's 0.583 standard deviations of one batch for discrete looks),
frozen at n. The simulation runs the real e-process on paths drawn with the mechanism's exact
aggregate sampler; tests/planning/test_sequential_planning.py checks one against the other.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats.anytime import laws, nulls
from aggregator.stats.anytime.eprocess import PRIOR_REPORTS, EProcess, tilts
from aggregator.stats.validate import check_alpha, check_distribution
from client.mechanisms import Mechanism

#: Siegmund's correction for a boundary watched at discrete times: -zeta(1/2) / sqrt(2 pi).
LOOK_CORRECTION = 0.5826

#: The largest n a forecast searches (beyond: the effect is too small to plan a stop on).
LARGEST_N = 10**15


@dataclass(frozen=True)
class StoppingForecast:
    """The forecast law of the first look at which the e-process reaches 1/alpha (reports).

    ``mean``, ``median`` and ``quantile90`` are looks (multiples of ``batch``); ``quantile90``
    is the maximum n to plan for: 90% of studies will have stopped by then.
    """

    drift: float
    variance: float
    k: int
    batch: int
    alpha: float
    mean: int
    median: int
    quantile90: int

    def stopped_by(self, n: float) -> float:
        """P(the test has stopped by n reports), the model's first-passage probability."""
        return float(_stopped_by(np.array([float(n)]), self)[0])

    def to_dict(self) -> dict:
        return {
            "drift_per_report": self.drift,
            "look_every": self.batch,
            "mean": self.mean,
            "median": self.median,
            "quantile90": self.quantile90,
        }


@dataclass(frozen=True)
class SimulatedStopping:
    """Stopping times of the real e-process on simulated studies, looked at every ``batch``
    reports up to ``max_n``: ``times`` per path, None where a path never stopped."""

    batch: int
    max_n: int
    times: tuple[int | None, ...]

    @property
    def paths(self) -> int:
        return len(self.times)

    def stopped_by(self, n: float) -> float:
        """The fraction of paths stopped by n reports."""
        return sum(t is not None and t <= n for t in self.times) / self.paths

    @property
    def stopped(self) -> float:
        return self.stopped_by(self.max_n)

    def _capped(self) -> np.ndarray:  # a path that never stopped counts as max_n
        return np.array([self.max_n if t is None else t for t in self.times], dtype=float)

    @property
    def mean(self) -> float:
        return float(self._capped().mean())

    @property
    def median(self) -> float:
        return float(np.median(self._capped()))

    @property
    def quantile90(self) -> float:
        return float(np.quantile(self._capped(), 0.9))

    def to_dict(self) -> dict:
        return {
            "paths": self.paths,
            "look_every": self.batch,
            "max_n": self.max_n,
            "mean": self.mean,
            "median": self.median,
            "quantile90": self.quantile90,
            "stopped": self.stopped,
        }


def growth(mechanism: Mechanism, alternative: np.ndarray, null: np.ndarray) -> tuple[float, float]:
    """(drift, variance) per report of the log e-value under ``alternative`` with the tilt
    towards it: E_p1[lam . Y] - kappa_p0(lam) and Var_p1(lam . Y)."""
    lam = tilts(mechanism, null, alternative[None, :])[0]
    log_p = np.log(np.clip(null, 1e-300, None))
    kappa = float(special.logsumexp(log_p + laws.log_conditional_mgf(mechanism, lam)))
    drift = float(lam @ mechanism.report_mean(alternative)) - kappa
    variance = float(lam @ mechanism.report_covariance(alternative) @ lam)
    return drift, variance


def forecast_stopping(
    mechanism: Mechanism, alternative: object, null: object, alpha: float = 0.05, batch: int = 1
) -> StoppingForecast:
    """The forecast law of the sequential goodness-of-fit test's stopping time under
    ``alternative``, looked at every ``batch`` reports.

    Raises
    ------
    InvalidInputError
        Bad distributions, alpha or batch; public-coin reports; an alternative that satisfies
        the null or is too close to it to stop on within 10^15 reports.
    """
    laws.check_mechanism(mechanism, "stopping-time forecast")
    alpha = check_alpha(alpha)
    p1 = check_distribution(alternative, mechanism.k, "alternative")
    p0 = check_distribution(null, mechanism.k, "null")
    batch = check_batch(batch)
    drift, variance = growth(mechanism, p1, p0)
    if not drift > 0:
        raise InvalidInputError("the alternative satisfies the null: the e-process never stops")
    partial = StoppingForecast(drift, variance, mechanism.k, batch, alpha, 0, 0, 0)
    median = _quantile(partial, 0.5)
    high = _quantile(partial, 0.9)
    mean = _mean(partial, _quantile(partial, 1 - 1e-6))
    return StoppingForecast(drift, variance, mechanism.k, batch, alpha, mean, median, high)


def check_batch(batch: object) -> int:
    if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch < 1:
        raise InvalidInputError(f"the look interval must be a positive integer, got {batch!r}")
    return int(batch)


def _stopped_by(n: np.ndarray, f: StoppingForecast) -> np.ndarray:
    """P(tau <= n) of a Brownian motion with the path's mean and variance at n over the
    boundary, by the first-passage law of a constant-drift motion (0 before the second look)."""
    looks = np.floor(n / f.batch)
    betting = np.maximum(looks - 1, 0) * f.batch  # the first batch bets nothing
    offset = PRIOR_REPORTS * f.k / f.batch
    regret = (
        (f.k - 1)
        / 2
        * (special.digamma(np.maximum(looks, 1) + offset) - special.digamma(1 + offset))
    )
    mean = f.drift * betting - regret
    spread = np.sqrt(np.maximum(f.variance * betting, 1e-300))
    bound = math.log(1 / f.alpha) + LOOK_CORRECTION * math.sqrt(f.variance * f.batch)
    direct = stats.norm.cdf((mean - bound) / spread)
    reflected = np.exp(
        np.minimum(2 * mean * bound / spread**2 + stats.norm.logcdf((-mean - bound) / spread), 0)
    )
    return np.where(looks >= 2, np.clip(direct + reflected, 0.0, 1.0), 0.0)


def _quantile(f: StoppingForecast, q: float) -> int:
    """The first look (in reports) at which P(stopped) reaches q."""
    high = 2
    while _stopped_by(np.array([high * f.batch], dtype=float), f)[0] < q:
        high *= 2
        if high * f.batch > LARGEST_N:
            raise InvalidInputError("the effect is too small to stop on in 10^15 reports")
    low = high // 2
    while high - low > 1:
        mid = (low + high) // 2
        below = _stopped_by(np.array([mid * f.batch], dtype=float), f)[0] < q
        low, high = (mid, high) if below else (low, mid)
    return high * f.batch


def _mean(f: StoppingForecast, end: int) -> int:
    """E tau = sum over looks of batch P(tau > look), on a geometric grid of looks up to where
    P(tau > n) < 1e-6 (the sum is exact up to the grid's trapezoids)."""
    looks = np.unique(np.geomspace(1, max(end // f.batch, 2), 4000).astype(int))
    survival = 1 - _stopped_by(looks * float(f.batch), f)
    return round(f.batch * (1 + float(np.trapezoid(survival, looks))))


def simulate_stopping(
    mechanism: Mechanism,
    alternative: object,
    null: object,
    alpha: float = 0.05,
    *,
    paths: int = 100,
    batch: int = 100,
    max_n: int = 20_000,
    seed: int = 0,
) -> SimulatedStopping:
    """The goodness-of-fit e-process run on ``paths`` studies simulated under ``alternative``
    (the mechanism's exact aggregate sampler, seed ``seed``), looked at every ``batch`` reports
    up to ``max_n``. Costs paths x max_n / batch looks."""
    laws.check_mechanism(mechanism, "stopping-time simulation")
    p1 = check_distribution(alternative, mechanism.k, "alternative")
    p0 = check_distribution(null, mechanism.k, "null")
    batch = check_batch(batch)
    if isinstance(paths, bool) or not isinstance(paths, numbers.Integral) or paths < 1:
        raise InvalidInputError(f"paths must be a positive integer, got {paths!r}")
    looks = check_batch(max_n) // batch
    if looks < 1:
        raise InvalidInputError(f"max_n {max_n} is below one look of {batch} reports")
    rng = np.random.default_rng(seed)
    times: list[int | None] = []
    for _ in range(paths):
        process = EProcess(nulls.simple(p0, mechanism.k), [mechanism], alpha)
        draws = mechanism.simulate_histogram(batch, p1, rng, size=looks)
        stop = None
        for look, values in enumerate(np.cumsum(draws, axis=0), start=1):
            if process.update([Histogram(mechanism, look * batch, values)]).reject:
                stop = look * batch
                break
        times.append(stop)
    return SimulatedStopping(batch, looks * batch, tuple(times))
