"""Hadamard response (HR; Acharya, Sun, Zhang [Acharya2019HR]): epsilon-LDP, one index in [K],
decoded with a fast Walsh-Hadamard transform in O(n + K log K)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from decimal import MAX_EMAX, MIN_EMIN, ROUND_FLOOR, Decimal, localcontext
from functools import cached_property

from client.mechanisms.base import (
    PureEpsilon,
    ReportRangeError,
    check_value,
    check_values,
)
from client.mechanisms.lazy_numpy import np
from client.mechanisms.secure_random import SYSTEM_RANDOM, SecureRandom
from client.mechanisms.support import SupportMechanism

_PRECISION = 80
_U64 = 2**64


def fwht(values: np.ndarray) -> np.ndarray:
    """Walsh-Hadamard transform along the last axis (length a power of 2), Sylvester order:
    out[..., r] = sum_c (-1)^popcount(r & c) values[..., c]. Exact for integer input."""
    out = np.array(values, copy=True)
    size = out.shape[-1]
    lead = out.shape[:-1]
    h = 1
    while h < size:
        blocks = out.reshape(*lead, size // (2 * h), 2, h)
        low, high = blocks[..., 0, :], blocks[..., 1, :]
        out = np.stack((low + high, low - high), axis=-2).reshape(*lead, size)
        h *= 2
    return out


@dataclass(frozen=True)
class HadamardResponse(PureEpsilon, SupportMechanism):
    """Category j owns row r = j + 1 of the K x K Sylvester Hadamard matrix
    H[r, c] = (-1)^popcount(r & c), K the smallest power of 2 above k. The report is a column c:
    with probability e^eps / (e^eps + 1) uniform among the K/2 columns where H[r, c] = +1,
    otherwise uniform among the other K/2.

    Privacy: every column has probability 2 rho / K or 2 (1 - rho) / K, a ratio of at most
    e^eps. On devices the in-set decision compares a uniform 64-bit integer with a threshold
    rounded *down* from rho = e^eps / (e^eps + 1), so ``realized_epsilon <= epsilon``. A report
    supports category j when H[j + 1, c] = +1: probability rho if j is the answer and exactly
    1/2 otherwise (two distinct non-zero rows agree on half the columns).
    """

    name = "hadamard_response"
    k: int
    epsilon: float

    @cached_property
    def columns(self) -> int:
        """K: the smallest power of 2 strictly above k (row 0, all ones, is never used)."""
        return 1 << self.k.bit_length()

    @cached_property
    def keep_probability(self) -> float:
        """rho = e^eps / (e^eps + 1): the chance that the report lies in the answer's set."""
        t = np.exp(-self.epsilon)
        return float(1 / (1 + t))

    @property
    def offset(self) -> float:
        return 0.5

    @property
    def slope(self) -> float:
        return float(np.tanh(self.epsilon / 2) / 2)  # rho - 1/2

    @cached_property
    def _keep_threshold(self) -> int:
        """floor(rho * 2**64) - 1, at least 2**63: in the set iff a uniform 64-bit integer is
        below it."""
        with localcontext() as ctx:
            ctx.prec, ctx.Emax, ctx.Emin = _PRECISION, MAX_EMAX, MIN_EMIN
            rho = 1 / (1 + (-Decimal(self.epsilon)).exp())
            threshold = int((rho * _U64).to_integral_value(rounding=ROUND_FLOOR))
        return max(threshold - 1, _U64 // 2)

    @property
    def realized_epsilon(self) -> float:
        """ln(rho' / (1 - rho')) for the realised in-set probability rho' (<= epsilon)."""
        with localcontext() as ctx:
            ctx.prec, ctx.Emax, ctx.Emin = _PRECISION, MAX_EMAX, MIN_EMIN
            rho = Decimal(self._keep_threshold) / _U64
            return float((rho / (1 - rho)).ln())

    # --- device side -------------------------------------------------------------------------
    def randomize(self, value: int, source: SecureRandom = SYSTEM_RANDOM) -> int:
        value = check_value(value, self.k)
        row = value + 1
        width = self.columns.bit_length() - 1
        # One draw: the low 64 bits decide in-set or not, the high bits are a uniform column,
        # moved into the wanted half by flipping the row's lowest set bit (a bijection of the
        # two halves, so the column stays uniform within its half).
        draw = source.bits(64 + width)
        column, keep_draw = draw >> 64, draw & (_U64 - 1)
        wanted = 0 if keep_draw < self._keep_threshold else 1
        if (row & column).bit_count() % 2 != wanted:
            column ^= row & -row
        return column

    @property
    def payload_size(self) -> int:
        return 4

    def encode(self, report: np.ndarray | int) -> bytes:
        return struct.pack("<I", check_value(report, self.columns))

    def decode(self, payload: bytes) -> int:
        if len(payload) != self.payload_size:
            raise ValueError(f"payload must be {self.payload_size} bytes, got {len(payload)}")
        return int(self.decode_many(np.frombuffer(payload, dtype=np.uint8)[None, :])[0])

    def decode_many(self, packed: np.ndarray) -> np.ndarray:
        packed = np.ascontiguousarray(packed, dtype=np.uint8)
        if packed.ndim != 2 or packed.shape[1] != self.payload_size:
            raise ValueError(f"payloads must be {self.payload_size} bytes")
        columns = packed.view("<u4").reshape(-1).astype(np.int64)
        if columns.size and columns.max() >= self.columns:
            raise ReportRangeError(f"column {columns.max()} is outside 0..{self.columns - 1}")
        return columns

    def support(self, reports: np.ndarray) -> np.ndarray:
        columns = check_values(reports, self.columns)
        rows = np.arange(1, self.k + 1, dtype=np.int64)
        return (np.bitwise_count(columns[:, None] & rows[None, :]) % 2 == 0).astype(np.uint8)

    def support_counts(self, reports: np.ndarray) -> np.ndarray:
        """From the column counts by one fast Walsh-Hadamard transform: O(n + K log K)."""
        columns = check_values(reports, self.columns)
        return self.counts_support(np.bincount(columns, minlength=self.columns))

    def counts_support(self, column_counts: np.ndarray) -> np.ndarray:
        """Support counts (..., k) from column counts (..., K): (n + (H M)_{j+1}) / 2."""
        column_counts = np.asarray(column_counts, dtype=np.int64)
        transformed = fwht(column_counts)
        n = column_counts.sum(axis=-1, keepdims=True)
        return (n + transformed[..., 1 : self.k + 1]) // 2

    # --- studies ---------------------------------------------------------------------------------
    def simulate(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        rows = check_values(values, self.k) + 1
        columns = rng.integers(0, self.columns, size=rows.size)
        wanted = (rng.random(rows.size) >= self.keep_probability).astype(np.int64)
        mismatch = np.bitwise_count(rows & columns) % 2 != wanted
        return np.where(mismatch, columns ^ (rows & -rows), columns)

    def column_distribution(self, p: np.ndarray) -> np.ndarray:
        """The law of one report over the K columns: (1 + (2 rho - 1) (H p~)_c) / K."""
        padded = np.zeros(self.columns)
        padded[1 : self.k + 1] = np.asarray(p, dtype=float)
        law = (1 + 2 * self.slope * fwht(padded)) / self.columns
        return np.clip(law, 0.0, None)

    def simulate_histogram(
        self, n: int, p: np.ndarray, rng: np.random.Generator, size: int | None = None
    ) -> np.ndarray:
        p = np.asarray(p, dtype=float)
        law = self.column_distribution(p / p.sum())
        counts = rng.multinomial(n, law / law.sum(), size=size)
        return self.counts_support(counts).astype(np.float64)

    def report_covariance(self, p: np.ndarray) -> np.ndarray:
        """Of the support indicators Z_j = (1 + V_{j+1}) / 2, V_r = H[r, c]: since
        V_r V_s = V_{r xor s}, Cov(V_r, V_s) = t p_{(r xor s) - 1} - t^2 p_r p_s (r != s) and
        Var(V_r) = 1 - t^2 p_r^2, with t = 2 rho - 1 and p_{-1} = 0 beyond the categories."""
        p = np.asarray(p, dtype=float)
        t = 2 * self.slope
        rows = np.arange(1, self.k + 1)
        xor = rows[:, None] ^ rows[None, :]
        padded = np.zeros(self.columns)
        padded[1 : self.k + 1] = p
        cross = t * padded[xor]  # zero on the diagonal (xor = 0)
        return (np.eye(self.k) + cross - t**2 * np.outer(p, p)) / 4
