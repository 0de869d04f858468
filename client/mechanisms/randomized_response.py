"""k-ary randomized response (MEXP, [Rogers2017] Alg. 17; local-chi-square-tests spec §1.3):
epsilon-LDP, one category per report."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from decimal import MAX_EMAX, MIN_EMIN, ROUND_FLOOR, Decimal, localcontext
from functools import cached_property

from client.mechanisms.base import (
    Mechanism,
    PureEpsilon,
    ReportRangeError,
    check_packed,
    check_value,
    check_values,
)
from client.mechanisms.lazy_numpy import np
from client.mechanisms.secure_random import SYSTEM_RANDOM, SecureRandom

_PRECISION = 80  # decimal digits for the keep threshold; far beyond the 2**-64 grid


@dataclass(frozen=True)
class RandomizedResponse(PureEpsilon, Mechanism):
    """Report the true category with probability e^eps / (e^eps + k - 1), otherwise a category
    drawn uniformly from the k - 1 others.

    Privacy: the ratio of output probabilities across inputs is at most e^eps, so one report is
    epsilon-LDP. On devices the keep decision compares a uniform integer below ``k * 2**64`` with
    a threshold rounded down from the exact probability (80-digit decimal), so the realised
    ratio never exceeds e^eps (``realized_epsilon <= epsilon``).

    Parameters
    ----------
    k : int
        Number of categories, 2 <= k <= 2**31.
    epsilon : float
        Privacy parameter of one report, positive and finite.

    Attributes
    ----------
    a0, a1 : float
        The channel: a category is reported with probability ``a0 + a1 * p`` (``offset`` and
        ``slope``).
    cost : PrivacyCost
        ``PrivacyCost("pure", epsilon)``, what the device ledger charges.

    Raises
    ------
    ValueError
        ``k`` or ``epsilon`` out of range; from ``randomize``, ``simulate`` and ``encode``, an
        answer outside 0..k-1.
    ReportRangeError
        From ``decode``, a payload naming a category outside 0..k-1.

    References
    ----------
    [Rogers2017] Alg. 17 (MEXP) and Alg. 18 (LocalGOF); [Gaboardi2018]; local-chi-square-tests
    spec §1.3, §4.5; docs/wire.md for the sampler and the encoding.

    Examples
    --------
    >>> import numpy as np
    >>> from client.mechanisms import RandomizedResponse
    >>> rr = RandomizedResponse(k=4, epsilon=1.0)
    >>> round(rr.a0 + rr.a1, 4)  # the probability of reporting the true answer
    0.4754
    >>> rr.realized_epsilon <= rr.epsilon
    True
    >>> rr.randomize(2) in range(4)  # one report, from the operating system's CSPRNG
    True
    >>> rr.decode(rr.encode(3))
    3
    >>> reports = rr.simulate(np.array([0, 1, 2, 3, 3]), np.random.default_rng(0))
    >>> int(rr.aggregate(reports).sum())
    5
    >>> rr.report_mean([1.0, 0.0, 0.0, 0.0]).round(4).tolist()
    [0.4754, 0.1749, 0.1749, 0.1749]
    """

    name = "randomized_response"
    statistic_kind = "counts"
    k: int
    epsilon: float

    @cached_property
    def a0(self) -> float:
        """Probability of reporting one specific other category: 1 / (e^eps + k - 1)."""
        t = np.exp(-self.epsilon)
        return float(t / (1 + (self.k - 1) * t))

    @cached_property
    def a1(self) -> float:
        """Signal slope (e^eps - 1) / (e^eps + k - 1); p_report = a0 + a1 * p."""
        t = np.exp(-self.epsilon)
        return float(-np.expm1(-self.epsilon) / (1 + (self.k - 1) * t))

    @property
    def offset(self) -> float:
        return self.a0

    @property
    def slope(self) -> float:
        return self.a1

    @cached_property
    def _keep_threshold(self) -> int:
        """floor(P(keep) * k * 2**64): keep iff a uniform integer below k * 2**64 is below it."""
        with localcontext() as ctx:
            ctx.prec, ctx.Emax, ctx.Emin = _PRECISION, MAX_EMAX, MIN_EMIN
            t = (-Decimal(self.epsilon)).exp()
            keep = 1 / (1 + (self.k - 1) * t)
            scaled = keep * self.k * 2**64
            threshold = int(scaled.to_integral_value(rounding=ROUND_FLOOR))
        # Safety margin against the last decimal digit, never below uniform (k * 2**64 / k).
        return max(threshold - 1, 2**64)

    @property
    def realized_epsilon(self) -> float:
        """ln of the realised likelihood ratio of the secure sampler (<= epsilon)."""
        with localcontext() as ctx:
            ctx.prec, ctx.Emax, ctx.Emin = _PRECISION, MAX_EMAX, MIN_EMIN
            keep = Decimal(self._keep_threshold) / (self.k * 2**64)
            return float((keep * (self.k - 1) / (1 - keep)).ln())

    @cached_property
    def _draw_range(self) -> int:
        """(k - 1) * k * 2**64: one uniform draw below it decides keep-or-lie and the lie."""
        return (self.k - 1) * self.k * 2**64

    # --- device side -------------------------------------------------------------------------
    def randomize(self, value: int, source: SecureRandom = SYSTEM_RANDOM) -> int:
        value = check_value(value, self.k)
        # A uniform draw on the product grid splits into two independent uniforms: the remainder
        # (below k * 2**64) decides keep-or-lie, the quotient (below k - 1) picks the lie. One
        # read of the CSPRNG per report, and the running time does not reveal whether it lied.
        other, keep_draw = divmod(source.below(self._draw_range), self.k * 2**64)
        if keep_draw < self._keep_threshold:
            return value
        return other + (other >= value)

    @property
    def payload_size(self) -> int:
        return 4

    def encode(self, report: np.ndarray | int) -> bytes:
        return struct.pack("<I", check_value(report, self.k))

    def decode(self, payload: bytes) -> int:
        if len(payload) != self.payload_size:
            raise ValueError(f"payload must be {self.payload_size} bytes, got {len(payload)}")
        (index,) = struct.unpack("<I", payload)
        if index >= self.k:
            raise ReportRangeError(f"category {index} is outside 0..{self.k - 1}")
        return index

    def decode_many(self, packed: np.ndarray) -> np.ndarray:
        """(m, 4) uint8 payloads -> the (m,) reported categories."""
        index = check_packed(packed, self.payload_size).view("<u4").reshape(-1)
        if index.size and index.max() >= self.k:
            raise ReportRangeError(f"category {index.max()} is outside 0..{self.k - 1}")
        return index

    def statistic_rows(self, decoded: np.ndarray) -> np.ndarray:
        """The one-hot row of each reported category."""
        decoded = np.asarray(decoded).reshape(-1)
        rows = np.zeros((decoded.size, self.k), dtype=np.int64)
        rows[np.arange(decoded.size), decoded] = 1
        return rows

    def statistic_sums(self, decoded: np.ndarray) -> np.ndarray:
        return np.bincount(decoded, minlength=self.k).astype(np.int64)

    def check_statistic(self, values: np.ndarray, n: int) -> None:
        super().check_statistic(values, n)
        if values.sum() != n:
            raise ValueError(f"randomized-response counts must sum to n={n}, got {values.sum():g}")

    def channel_matrix(self) -> np.ndarray:
        """W (k x k), W[y, x] = P(report y | answer x): a0 + a1 I."""
        return self.a0 + self.a1 * np.eye(self.k)

    # --- studies ---------------------------------------------------------------------------------
    def simulate(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        values = check_values(values, self.k)
        keep = rng.random(values.size) < self.a0 + self.a1
        other = rng.integers(0, self.k - 1, size=values.size)
        other += other >= values
        return np.where(keep, values, other)

    def aggregate(self, reports: np.ndarray) -> np.ndarray:
        reports = check_values(reports, self.k)
        return np.bincount(reports, minlength=self.k).astype(np.float64)

    def simulate_histogram(
        self, n: int, p: np.ndarray, rng: np.random.Generator, size: int | None = None
    ) -> np.ndarray:
        p_report = self.report_mean(p)
        return rng.multinomial(n, p_report / p_report.sum(), size=size).astype(np.float64)

    def report_covariance(self, p: np.ndarray) -> np.ndarray:
        q = self.report_mean(p)
        return np.diag(q) - np.outer(q, q)
