"""Optimized unary encoding (OUE; Wang, Blocki, Li, Jha [Wang2017]): epsilon-LDP,
k bits, the lowest-variance unary encoding for frequency estimation."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from decimal import MAX_EMAX, MIN_EMIN, ROUND_CEILING, Decimal, localcontext
from functools import cached_property

from client.mechanisms.base import (
    PureEpsilon,
    check_value,
    check_values,
)
from client.mechanisms.lazy_numpy import np
from client.mechanisms.secure_random import SYSTEM_RANDOM, SecureRandom
from client.mechanisms.support import (
    ExchangeableSupport,
    bit_payload,
    pack_bits,
    unpack_bits,
)

_PRECISION = 80
_HALF = 2**63


@dataclass(frozen=True)
class OptimizedUnaryEncoding(PureEpsilon, ExchangeableSupport):
    """Send k bits: the answer's bit is 1 with probability 1/2, every other bit is 1 with
    probability q = 1 / (e^eps + 1), all independently.

    Privacy: two answers differ in two bits, and the likelihood ratio of a report is at most
    (1/2) / q * (1 - q) / (1/2) = e^eps. On devices each bit compares a uniform 64-bit integer
    with 2^63 (the answer's bit, exactly 1/2) or with a threshold rounded *up* from q (80-digit
    decimal), so ``realized_epsilon <= epsilon``. A category's support count is its bit sum.
    """

    name = "optimized_unary"
    k: int
    epsilon: float

    @cached_property
    def set_probability(self) -> float:
        """q = 1 / (e^eps + 1): the chance that a bit other than the answer's is 1."""
        t = np.exp(-self.epsilon)
        return float(t / (1 + t))

    @property
    def offset(self) -> float:
        return self.set_probability

    @property
    def slope(self) -> float:
        return float(np.tanh(self.epsilon / 2) / 2)  # 1/2 - q, stable for every epsilon

    @cached_property
    def _set_threshold(self) -> int:
        """ceil(q * 2**64) + 1, capped at 2**63: a bit is 1 iff a uniform 64-bit integer is
        below it."""
        with localcontext() as ctx:
            ctx.prec, ctx.Emax, ctx.Emin = _PRECISION, MAX_EMAX, MIN_EMIN
            q = 1 / (Decimal(self.epsilon).exp() + 1)
            threshold = int((q * 2**64).to_integral_value(rounding=ROUND_CEILING))
        return min(threshold + 1, _HALF)

    @property
    def realized_epsilon(self) -> float:
        """ln((1 - q') / q') for the realised probability q' (<= epsilon)."""
        with localcontext() as ctx:
            ctx.prec, ctx.Emax, ctx.Emin = _PRECISION, MAX_EMAX, MIN_EMIN
            q = Decimal(self._set_threshold) / 2**64
            return float(((1 - q) / q).ln())

    # --- device side -------------------------------------------------------------------------
    def randomize(self, value: int, source: SecureRandom = SYSTEM_RANDOM) -> np.ndarray:
        return np.array(self._secure_bits(value, source), dtype=np.uint8)

    def randomize_payload(self, value: int, source: SecureRandom = SYSTEM_RANDOM) -> bytes:
        return bit_payload(self._secure_bits(value, source))

    def _secure_bits(self, value: int, source: SecureRandom) -> list[int]:
        """The k bits: one uniform 64-bit integer per bit (u64le), set below the threshold (2^63
        for the answer's own bit)."""
        value = check_value(value, self.k)
        threshold = self._set_threshold
        uniforms = struct.unpack(f"<{self.k}Q", source.bytes(8 * self.k))
        bits = [int(uniform < threshold) for uniform in uniforms]
        bits[value] = int(uniforms[value] < _HALF)
        return bits

    @property
    def payload_size(self) -> int:
        return (self.k + 7) // 8

    def encode(self, report: np.ndarray | int) -> bytes:
        return pack_bits(report, self.k, self.name)  # type: ignore[arg-type]

    def decode(self, payload: bytes) -> np.ndarray:
        if len(payload) != self.payload_size:
            raise ValueError(f"payload must be {self.payload_size} bytes, got {len(payload)}")
        return self.decode_many(np.frombuffer(payload, dtype=np.uint8)[None, :])[0]

    def decode_many(self, packed: np.ndarray) -> np.ndarray:
        return unpack_bits(packed, self.k)

    def support(self, reports: np.ndarray) -> np.ndarray:
        reports = np.asarray(reports)
        if reports.ndim != 2 or reports.shape[1] != self.k:
            raise ValueError(f"reports must have shape (n, {self.k})")
        return reports

    # --- studies ---------------------------------------------------------------------------------
    def simulate(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        values = check_values(values, self.k)
        bits = (rng.random((values.size, self.k)) < self.set_probability).astype(np.uint8)
        bits[np.arange(values.size), values] = rng.random(values.size) < 0.5
        return bits

    def simulate_histogram(
        self, n: int, p: np.ndarray, rng: np.random.Generator, size: int | None = None
    ) -> np.ndarray:
        p = np.asarray(p, dtype=float)
        counts = rng.multinomial(n, p / p.sum(), size=size)
        own = rng.binomial(counts, 0.5)
        others = rng.binomial(n - counts, self.set_probability)
        return (own + others).astype(np.float64)

    @property
    def pair_support(self) -> tuple[float, float]:
        """The bits are independent given the answer (its own is 1 with probability 1/2, the
        others q), so the report covariance is q (1 - q) I + c1^2 (2 Diag p - p p^T)."""
        q = self.set_probability
        return q / 2, q * q
