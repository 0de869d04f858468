"""Optimized local hashing (OLH; Wang, Blocki, Li, Jha [Wang2017]): epsilon-LDP, a
public hash seed and one value in [g], g = ceil(e^eps) + 1, whatever k."""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass
from decimal import MAX_EMAX, MIN_EMIN, ROUND_CEILING, Decimal, localcontext
from functools import cached_property

from client.mechanisms.base import (
    PureEpsilon,
    ReportRangeError,
    check_value,
    check_values,
)
from client.mechanisms.lazy_numpy import np
from client.mechanisms.randomized_response import RandomizedResponse
from client.mechanisms.secure_random import SYSTEM_RANDOM, SecureRandom
from client.mechanisms.support import ExchangeableSupport

#: The field of the hash polynomials: the Mersenne prime 2^31 - 1.
PRIME = 2**31 - 1
HASH_DOMAIN = b"ldp-survey/olh/v1"
_BLOCK = 2**22  # reports x categories per block of support computation
_SUM_BLOCK = 2**20  # reports per block of simulated support sums


def hash_coefficients(seeds: np.ndarray) -> np.ndarray:
    """(m, 3) coefficients (c2, c1, c0) in [0, P) of each seed's polynomial: the first 24 bytes of
    SHA-256(HASH_DOMAIN || seed as 8 bytes little-endian), three u64le values, each mod P."""
    seeds = np.asarray(seeds).astype(np.uint64).reshape(-1)
    sha256, pack = hashlib.sha256, struct.Struct("<Q").pack
    digests = b"".join(sha256(HASH_DOMAIN + pack(seed)).digest()[:24] for seed in seeds.tolist())
    return np.frombuffer(digests, dtype="<u8").reshape(-1, 3) % np.uint64(PRIME)


def hash_values(coefficients: np.ndarray, categories: np.ndarray, g: int) -> np.ndarray:
    """h(x) = ((c2 x^2 + c1 x + c0) mod P) mod g for each row of coefficients (m, 3) and each
    category (c,): (m, c). All products stay below 2^63 (operands < 2^31)."""
    c = np.asarray(coefficients, dtype=np.uint64)
    x = np.asarray(categories, dtype=np.uint64)[None, :]
    square = (x * x) % PRIME
    value = (c[:, 0:1] * square) % PRIME
    value = (value + c[:, 1:2] * x) % PRIME
    value = (value + c[:, 2:3]) % PRIME
    return (value % np.uint64(g)).astype(np.int64)


@dataclass(frozen=True)
class LocalHashing(PureEpsilon, ExchangeableSupport):
    """A device draws a fresh 64-bit seed, hashes its answer into [g] with the seed's degree-2
    polynomial over GF(2^31 - 1) (a 3-wise independent family), and sends the seed with the
    hashed value randomized by g-ary randomized response.

    Privacy: the seed does not depend on the answer, and given the seed the value is
    epsilon-LDP randomized response on [g] (the project's ``RandomizedResponse`` sampler, with its
    rounding, so ``realized_epsilon <= epsilon``). A report (s, y) supports category j when
    h_s(j) = y. With the coefficients uniform, the hashes of distinct categories are independent
    and uniform on GF(P); reduced mod g they collide with probability kappa = sum_r (c_r / P)^2
    (pairs) and kappa3 = sum_r (c_r / P)^3 (triples), c_r the residues of GF(P) that are r mod g,
    and the channel is exact in these constants.
    """

    name = "local_hashing"
    k: int
    epsilon: float

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.k > PRIME:
            raise ValueError(f"local hashing needs k <= 2**31 - 1, got {self.k}")
        # e^eps above PRIME first, in floats: the exact g of a huge epsilon is a huge integer.
        if self.epsilon > math.log(PRIME) or self.buckets > PRIME:
            raise ValueError(f"epsilon {self.epsilon} is too large for local hashing (g > 2**31)")

    @cached_property
    def buckets(self) -> int:
        """g = ceil(e^eps) + 1 (80-digit decimal)."""
        with localcontext() as ctx:
            ctx.prec, ctx.Emax, ctx.Emin = 80, MAX_EMAX, MIN_EMIN
            return int(Decimal(self.epsilon).exp().to_integral_value(ROUND_CEILING)) + 1

    @cached_property
    def inner(self) -> RandomizedResponse:
        """The randomized response on [g] applied to the hashed answer."""
        return RandomizedResponse(self.buckets, self.epsilon)

    @cached_property
    def collisions(self) -> tuple[float, float]:
        """(kappa, kappa3): P(two / three distinct categories share a hash value)."""
        g = self.buckets
        low, extra = divmod(PRIME, g)  # `extra` residues occur low + 1 times, the others low
        counts = np.array([low + 1, low], dtype=float) / PRIME
        weights = np.array([extra, g - extra], dtype=float)
        return float(weights @ counts**2), float(weights @ counts**3)

    @property
    def offset(self) -> float:
        kappa = self.collisions[0]
        return kappa * (self.inner.a0 + self.inner.a1) + (1 - kappa) * self.inner.a0

    @property
    def slope(self) -> float:
        return (1 - self.collisions[0]) * self.inner.a1

    @property
    def realized_epsilon(self) -> float:
        return self.inner.realized_epsilon

    # --- device side -------------------------------------------------------------------------
    def randomize(self, value: int, source: SecureRandom = SYSTEM_RANDOM) -> np.ndarray:
        return np.array(self._secure_report(value, source), dtype=np.uint64)

    def randomize_payload(self, value: int, source: SecureRandom = SYSTEM_RANDOM) -> bytes:
        return struct.pack("<QI", *self._secure_report(value, source))

    def _secure_report(self, value: int, source: SecureRandom) -> tuple[int, int]:
        """(seed, randomized hashed value): the seed's 8 bytes (u64le), then the inner draw."""
        value = check_value(value, self.k)
        seed = int.from_bytes(source.bytes(8), "little")
        digest = hashlib.sha256(HASH_DOMAIN + struct.pack("<Q", seed)).digest()
        c2, c1, c0 = (v % PRIME for v in struct.unpack("<3Q", digest[:24]))
        hashed = ((c2 * (value * value % PRIME) + c1 * value + c0) % PRIME) % self.buckets
        return seed, self.inner.randomize(hashed, source)

    @property
    def payload_size(self) -> int:
        return 12

    def encode(self, report: np.ndarray | int) -> bytes:
        seed, hashed = (int(v) for v in np.asarray(report, dtype=np.uint64).reshape(2))
        return struct.pack("<QI", seed, check_value(hashed, self.buckets))

    def decode(self, payload: bytes) -> np.ndarray:
        if len(payload) != self.payload_size:
            raise ValueError(f"payload must be {self.payload_size} bytes, got {len(payload)}")
        return self.decode_many(np.frombuffer(payload, dtype=np.uint8)[None, :])[0]

    def decode_many(self, packed: np.ndarray) -> np.ndarray:
        packed = np.ascontiguousarray(packed, dtype=np.uint8)
        if packed.ndim != 2 or packed.shape[1] != self.payload_size:
            raise ValueError(f"payloads must be {self.payload_size} bytes")
        seeds = packed[:, :8].copy().view("<u8").reshape(-1)
        values = packed[:, 8:].copy().view("<u4").reshape(-1).astype(np.uint64)
        if values.size and values.max() >= self.buckets:
            raise ReportRangeError(f"hashed value {values.max()} is outside 0..{self.buckets - 1}")
        return np.stack([seeds, values], axis=1)

    def support(self, reports: np.ndarray) -> np.ndarray:
        """h_s(j) == y for every report (s, y) and category j: O(m k)."""
        return self._support(reports, hash_coefficients(self._checked(reports)[:, 0]))

    def _checked(self, reports: np.ndarray) -> np.ndarray:
        reports = np.asarray(reports).astype(np.uint64)
        if reports.ndim != 2 or reports.shape[1] != 2:
            raise ValueError("local-hashing reports have shape (n, 2): seed, hashed value")
        return reports

    def _support(self, reports: np.ndarray, coefficients: np.ndarray) -> np.ndarray:
        reports = self._checked(reports)
        categories = np.arange(self.k)
        out = np.empty((reports.shape[0], self.k), dtype=np.uint8)
        step = max(1, _BLOCK // self.k)
        for start in range(0, reports.shape[0], step):
            block = slice(start, start + step)
            hashed = hash_values(coefficients[block], categories, self.buckets)
            out[block] = hashed == reports[block, 1:2].astype(np.int64)
        return out

    # --- studies ---------------------------------------------------------------------------------
    def simulate(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        values = check_values(values, self.k)
        seeds = rng.integers(0, 2**64, size=values.size, dtype=np.uint64)
        coefficients = hash_coefficients(seeds)
        hashed = hash_values_at(coefficients, values, self.buckets)
        return np.stack([seeds, self.inner.simulate(hashed, rng).astype(np.uint64)], axis=1)

    def simulate_histogram(
        self, n: int, p: np.ndarray, rng: np.random.Generator, size: int | None = None
    ) -> np.ndarray:
        """Exact under uniform coefficients (drawn directly, not through seeds): every report is
        hashed at every category (O(n k) per draw, ``support_sums``), several draws per block."""
        p = np.asarray(p, dtype=float)
        p = p / p.sum()
        draws = np.zeros((1 if size is None else size, self.k))
        per_block = max(1, _SUM_BLOCK // max(n, 1))
        for start in range(0, draws.shape[0], per_block):
            block = min(per_block, draws.shape[0] - start)
            coefficients = rng.integers(0, PRIME, size=(block * n, 3), dtype=np.uint64)
            values = rng.choice(self.k, size=block * n, p=p)
            hashed = hash_values_at(coefficients, values, self.buckets)
            reported = self.inner.simulate(hashed, rng)
            sums = support_sums(coefficients, reported, self.k, self.buckets, block)
            draws[start : start + block] = sums
        return draws[0] if size is None else draws

    @property
    def pair_support(self) -> tuple[float, float]:
        """P(j and l supported) is kappa * keep when the answer is j or l, else
        kappa3 * keep + (kappa - kappa3) * a0 (keep, a0: the inner randomized response)."""
        kappa, kappa3 = self.collisions
        keep, other = self.inner.a0 + self.inner.a1, self.inner.a0
        return kappa * keep, kappa3 * keep + (kappa - kappa3) * other


def hash_values_at(coefficients: np.ndarray, values: np.ndarray, g: int) -> np.ndarray:
    """h_i(values_i) for each row i: the hashed answers (m,)."""
    c = np.asarray(coefficients, dtype=np.uint64)
    x = np.asarray(values, dtype=np.uint64)
    value = (c[:, 0] * ((x * x) % PRIME)) % PRIME
    value = (value + c[:, 1] * x) % PRIME
    value = (value + c[:, 2]) % PRIME
    return (value % np.uint64(g)).astype(np.int64)


def support_sums(
    coefficients: np.ndarray, reported: np.ndarray, k: int, g: int, groups: int = 1
) -> np.ndarray:
    """Support counts (groups, k) of reports (coefficients (m, 3), reported values (m,)) split
    into ``groups`` equal consecutive groups, without the (m, k) matrix: h(x + 1) = h(x) + D(x)
    and D(x + 1) = D(x) + 2 c2 (mod P), D(0) = c2 + c1, so each category costs a few uint32
    additions per report (a sum of two residues is below 2^32; ``min(v, v - P)`` wraps it back)
    instead of a polynomial with three reductions mod P. Equal to ``hash_values``."""
    c = np.asarray(coefficients, dtype=np.uint64)
    reported = np.asarray(reported).astype(np.uint32)
    prime = np.uint32(PRIME)
    hashed = c[:, 2].astype(np.uint32)
    step = ((c[:, 0] + c[:, 1]) % PRIME).astype(np.uint32)
    curve = ((2 * c[:, 0]) % PRIME).astype(np.uint32)
    out = np.empty((groups, k), dtype=np.int64)
    residue, spare = np.empty_like(hashed), np.empty_like(hashed)
    mask = g - 1 if g & (g - 1) == 0 else None  # g a power of two: a mask, not a division
    for x in range(k):
        if mask is None:
            np.remainder(hashed, np.uint32(g), out=residue)
        else:
            np.bitwise_and(hashed, np.uint32(mask), out=residue)
        out[:, x] = np.count_nonzero((residue == reported).reshape(groups, -1), axis=1)
        for value, increment in ((hashed, step), (step, curve)):
            value += increment
            np.subtract(value, prime, out=spare)
            np.minimum(value, spare, out=value)
    return out
