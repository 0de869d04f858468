"""Flip components / symmetric unary encoding (MFC, [Rogers2017] Alg. 20;
local-chi-square-tests spec §1.4): epsilon-LDP, k bits."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from decimal import MAX_EMAX, MIN_EMIN, ROUND_CEILING, Decimal, localcontext
from functools import cached_property

from client.mechanisms.base import (
    Mechanism,
    PureEpsilon,
    check_value,
    check_values,
)
from client.mechanisms.lazy_numpy import np
from client.mechanisms.secure_random import SYSTEM_RANDOM, SecureRandom
from client.mechanisms.support import bit_payload, unpack_bits

_PRECISION = 80


@dataclass(frozen=True)
class FlipComponents(PureEpsilon, Mechanism):
    """Send the one-hot vector of the answer with every bit flipped independently with
    probability s = 1 / (e^(eps/2) + 1).

    Privacy: two answers differ in two bits, each an (eps/2)-randomized response, so one report
    is epsilon-LDP. On devices every bit compares a uniform 64-bit integer with a flip threshold
    rounded *up* from the exact s (80-digit decimal), so each bit's likelihood ratio stays at most
    e^(eps/2) (``realized_epsilon <= epsilon``).

    Parameters
    ----------
    k, epsilon
        The number of categories and the privacy parameter of one report, each within the
        same bounds as for ``RandomizedResponse``.

    Attributes
    ----------
    flip_probability : float
        s, the probability that any one bit is flipped.
    cost : PrivacyCost
        ``PrivacyCost("pure", epsilon)``, what the device ledger charges.

    Raises
    ------
    ValueError
        ``k`` or ``epsilon`` out of range; an answer outside 0..k-1; from ``encode``/``decode``,
        a report that is not k bits (or non-zero padding).

    References
    ----------
    [Rogers2017] Alg. 20 (MFC) and Thm 8.2.10-8.2.11 (its projected statistic T_FC);
    [Gaboardi2018] (LocalBitFlip); local-chi-square-tests spec §1.4, §4.8.

    Examples
    --------
    >>> import numpy as np
    >>> from client.mechanisms import FlipComponents
    >>> fc = FlipComponents(k=4, epsilon=1.0)
    >>> round(fc.flip_probability, 4)
    0.3775
    >>> fc.realized_epsilon <= fc.epsilon
    True
    >>> report = fc.randomize(1)  # k bits, from the operating system's CSPRNG
    >>> report.shape, set(report.tolist()) <= {0, 1}
    ((4,), True)
    >>> fc.decode(fc.encode(np.array([0, 1, 0, 1]))).tolist()
    [0, 1, 0, 1]
    >>> reports = fc.simulate(np.array([0, 1, 2, 3]), np.random.default_rng(0))
    >>> fc.aggregate(reports).shape
    (4,)
    """

    name = "flip_components"
    statistic_kind = "bits"
    k: int
    epsilon: float

    @cached_property
    def flip_probability(self) -> float:
        """s = 1 / (e^(eps/2) + 1), computed as expit(-eps/2) without overflow or underflow."""
        t = np.exp(-self.epsilon / 2)
        return float(t / (1 + t))

    @cached_property
    def keep_ratio(self) -> float:
        """A = e^(eps/2), the likelihood ratio of one bit."""
        return float(np.exp(self.epsilon / 2))

    @property
    def offset(self) -> float:
        return self.flip_probability

    @property
    def slope(self) -> float:
        return float(np.tanh(self.epsilon / 4))  # 1 - 2s, stable for every epsilon

    @cached_property
    def _flip_threshold(self) -> int:
        """ceil(s * 2**64) + 1, capped at 2**63: flip iff a uniform 64-bit integer is below it."""
        with localcontext() as ctx:
            ctx.prec, ctx.Emax, ctx.Emin = _PRECISION, MAX_EMAX, MIN_EMIN
            s = 1 / ((Decimal(self.epsilon) / 2).exp() + 1)
            threshold = int((s * 2**64).to_integral_value(rounding=ROUND_CEILING))
        return min(threshold + 1, 2**63)

    @property
    def realized_epsilon(self) -> float:
        """2 ln((1 - s') / s') for the realised flip probability s' (<= epsilon)."""
        with localcontext() as ctx:
            ctx.prec, ctx.Emax, ctx.Emin = _PRECISION, MAX_EMAX, MIN_EMIN
            s = Decimal(self._flip_threshold) / 2**64
            return float(2 * ((1 - s) / s).ln())

    # --- device side -------------------------------------------------------------------------
    def randomize(self, value: int, source: SecureRandom = SYSTEM_RANDOM) -> np.ndarray:
        return np.array(self._secure_bits(value, source), dtype=np.uint8)

    def randomize_payload(self, value: int, source: SecureRandom = SYSTEM_RANDOM) -> bytes:
        return bit_payload(self._secure_bits(value, source))

    def _secure_bits(self, value: int, source: SecureRandom) -> list[int]:
        """The k bits: one uniform 64-bit integer per bit (u64le), flipped below the threshold."""
        value = check_value(value, self.k)
        threshold = self._flip_threshold
        uniforms = struct.unpack(f"<{self.k}Q", source.bytes(8 * self.k))
        bits = [int(uniform < threshold) for uniform in uniforms]
        bits[value] ^= 1
        return bits

    @property
    def payload_size(self) -> int:
        return (self.k + 7) // 8

    def encode(self, report: np.ndarray | int) -> bytes:
        bits = np.asarray(report)
        if bits.shape != (self.k,) or not np.isin(bits, (0, 1)).all():
            raise ValueError(f"a flip-components report is {self.k} bits")
        return np.packbits(bits.astype(np.uint8), bitorder="little").tobytes()

    def decode(self, payload: bytes) -> np.ndarray:
        if len(payload) != self.payload_size:
            raise ValueError(f"payload must be {self.payload_size} bytes, got {len(payload)}")
        bits = np.unpackbits(np.frombuffer(payload, dtype=np.uint8), bitorder="little")
        if bits[self.k :].any():
            raise ValueError("padding bits beyond k must be zero")
        return bits[: self.k]

    def decode_many(self, packed: np.ndarray) -> np.ndarray:
        """(m, payload_size) uint8 payloads -> (m, k) bits."""
        return unpack_bits(packed, self.k)

    def statistic_rows(self, decoded: np.ndarray) -> np.ndarray:
        return np.asarray(decoded).astype(np.int64)

    def statistic_sums(self, decoded: np.ndarray) -> np.ndarray:
        return np.asarray(decoded).sum(axis=0, dtype=np.int64)

    # --- studies ---------------------------------------------------------------------------------
    def simulate(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        values = check_values(values, self.k)
        bits = (rng.random((values.size, self.k)) < self.flip_probability).astype(np.uint8)
        bits[np.arange(values.size), values] ^= 1
        return bits

    def aggregate(self, reports: np.ndarray) -> np.ndarray:
        reports = np.asarray(reports)
        if reports.ndim != 2 or reports.shape[1] != self.k:
            raise ValueError(f"reports must have shape (n, {self.k})")
        return reports.sum(axis=0, dtype=np.int64).astype(np.float64)

    def simulate_histogram(
        self, n: int, p: np.ndarray, rng: np.random.Generator, size: int | None = None
    ) -> np.ndarray:
        p = np.asarray(p, dtype=float)
        counts = rng.multinomial(n, p / p.sum(), size=size)
        s = self.flip_probability
        kept = rng.binomial(counts, 1 - s)
        flipped_on = rng.binomial(n - counts, s)
        return (kept + flipped_on).astype(np.float64)

    def report_covariance(self, p: np.ndarray) -> np.ndarray:
        p = np.asarray(p, dtype=float)
        s = self.flip_probability
        return self.slope**2 * (np.diag(p) - np.outer(p, p)) + s * (1 - s) * np.eye(self.k)
