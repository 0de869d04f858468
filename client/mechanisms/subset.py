"""Subset selection ([Ye2018]; the "k-subset" of [Wang2016]): epsilon-LDP, a set of
d of the k categories, the answer in it more often than chance."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import MAX_EMAX, MIN_EMIN, ROUND_CEILING, ROUND_FLOOR, Decimal, localcontext
from functools import cached_property

from client.mechanisms.base import (
    PureEpsilon,
    ReportRangeError,
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
_U64 = 2**64
_SIMULATION_CHUNK = 2**22  # reports x categories per simulated block


@dataclass(frozen=True)
class SubsetSelection(PureEpsilon, ExchangeableSupport):
    """Report a set S of d = ceil(k / (e^eps + 1)) categories (at least 1, at most k - 1): with
    probability a = d e^eps / (d e^eps + k - d) the answer and d - 1 others chosen uniformly,
    otherwise d categories chosen uniformly among the other k - 1.

    Privacy: every d-set containing the answer has probability e^eps / Z and every other d-set
    1 / Z, so the ratio is at most e^eps. On devices the in-set decision compares a uniform 64-bit
    integer with a threshold rounded *down* from a (80-digit decimal), so
    ``realized_epsilon <= epsilon``; the d others are drawn by a partial Fisher-Yates shuffle
    with exact uniform integers, and the work does not depend on the decision.
    """

    name = "subset_selection"
    k: int
    epsilon: float

    @cached_property
    def subset_size(self) -> int:
        """d = ceil(k / (e^eps + 1)) (80-digit decimal), clipped to 1..k-1."""
        with localcontext() as ctx:
            ctx.prec, ctx.Emax, ctx.Emin = _PRECISION, MAX_EMAX, MIN_EMIN
            d = int((self.k / (Decimal(self.epsilon).exp() + 1)).to_integral_value(ROUND_CEILING))
        return min(max(d, 1), self.k - 1)

    @property
    def support_size(self) -> int:
        """Every report supports exactly d categories."""
        return self.subset_size

    @cached_property
    def in_probability(self) -> float:
        """a = d / (d + (k - d) e^-eps): the chance that the answer is in the set."""
        d, k = self.subset_size, self.k
        return float(d / (d + (k - d) * np.exp(-self.epsilon)))

    @property
    def offset(self) -> float:
        """b = (d - a) / (k - 1): the chance that a category other than the answer is in S."""
        return (self.subset_size - self.in_probability) / (self.k - 1)

    @property
    def slope(self) -> float:
        """a - b = (a k - d) / (k - 1)."""
        return (self.in_probability * self.k - self.subset_size) / (self.k - 1)

    @cached_property
    def _in_threshold(self) -> int:
        """floor(a * 2**64) - 1: the answer is in S iff a uniform 64-bit integer is below it."""
        d, k = self.subset_size, self.k
        with localcontext() as ctx:
            ctx.prec, ctx.Emax, ctx.Emin = _PRECISION, MAX_EMAX, MIN_EMIN
            a = d / (d + (k - d) * (-Decimal(self.epsilon)).exp())
            threshold = int((a * _U64).to_integral_value(rounding=ROUND_FLOOR))
        return max(threshold - 1, 0)

    @property
    def realized_epsilon(self) -> float:
        """ln(a' (k - d) / ((1 - a') d)) for the realised in-set probability a' (<= epsilon)."""
        d, k = self.subset_size, self.k
        with localcontext() as ctx:
            ctx.prec, ctx.Emax, ctx.Emin = _PRECISION, MAX_EMAX, MIN_EMIN
            a = Decimal(self._in_threshold) / _U64
            return float((a * (k - d) / ((1 - a) * d)).ln())

    # --- device side -------------------------------------------------------------------------
    def randomize(self, value: int, source: SecureRandom = SYSTEM_RANDOM) -> np.ndarray:
        bits = np.zeros(self.k, dtype=np.uint8)
        bits[self._secure_subset(value, source)] = 1
        return bits

    def randomize_payload(self, value: int, source: SecureRandom = SYSTEM_RANDOM) -> bytes:
        bits = [0] * self.k
        for category in self._secure_subset(value, source):
            bits[category] = 1
        return bit_payload(bits)

    def _secure_subset(self, value: int, source: SecureRandom) -> list[int]:
        """The d categories of the report: the in-set draw (u64le), then d exact uniforms."""
        value = check_value(value, self.k)
        inside = source.bits(64) < self._in_threshold
        others, d = self.k - 1, self.subset_size
        moved: dict[int, int] = {}  # a partial Fisher-Yates shuffle of 0..k-2, stored sparsely
        chosen = []
        for i in range(d):
            j = i + source.below(others - i)
            pick = moved.get(j, j)
            moved[j] = moved.get(i, i)
            chosen.append(pick + (pick >= value))  # position -> category, skipping the answer
        if inside:
            chosen[-1] = value
        return chosen

    @property
    def payload_size(self) -> int:
        return (self.k + 7) // 8

    def encode(self, report: np.ndarray | int) -> bytes:
        bits = np.asarray(report)
        if bits.shape == (self.k,) and int(bits.sum()) != self.subset_size:
            raise ValueError(f"a subset-selection report has exactly {self.subset_size} bits set")
        return pack_bits(bits, self.k, self.name)

    def decode(self, payload: bytes) -> np.ndarray:
        if len(payload) != self.payload_size:
            raise ValueError(f"payload must be {self.payload_size} bytes, got {len(payload)}")
        return self.decode_many(np.frombuffer(payload, dtype=np.uint8)[None, :])[0]

    def decode_many(self, packed: np.ndarray) -> np.ndarray:
        bits = unpack_bits(packed, self.k)
        if (bits.sum(axis=1, dtype=np.int64) != self.subset_size).any():
            raise ReportRangeError(f"a report must have exactly {self.subset_size} categories")
        return bits

    def support(self, reports: np.ndarray) -> np.ndarray:
        reports = np.asarray(reports)
        if reports.ndim != 2 or reports.shape[1] != self.k:
            raise ValueError(f"reports must have shape (n, {self.k})")
        return reports

    # --- studies ---------------------------------------------------------------------------------
    def simulate(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The d smallest of k uniform keys, the answer's key forced first (in S) or last."""
        values = check_values(values, self.k)
        d = self.subset_size
        out = np.zeros((values.size, self.k), dtype=np.uint8)
        step = max(1, _SIMULATION_CHUNK // self.k)
        for start in range(0, values.size, step):
            x = values[start : start + step]
            keys = rng.random((x.size, self.k))
            inside = rng.random(x.size) < self.in_probability
            keys[np.arange(x.size), x] = np.where(inside, -1.0, 2.0)
            chosen = np.argpartition(keys, d - 1, axis=1)[:, :d]
            np.put_along_axis(out[start : start + step], chosen, 1, axis=1)
        return out

    def simulate_histogram(
        self, n: int, p: np.ndarray, rng: np.random.Generator, size: int | None = None
    ) -> np.ndarray:
        """Exact and independent of n: ``_class_sampler``, O(k x occupied classes) per draw,
        all draws at once."""
        p = np.asarray(p, dtype=float)
        p = p / p.sum()
        draws = 1 if size is None else size
        out = _class_sampler(self, n, p, rng, draws).astype(float)
        return out[0] if size is None else out

    @property
    def pair_support(self) -> tuple[float, float]:
        """P(j, l in S) is c1 = a (d - 1) / (k - 1) when the answer is j or l, else
        c2 = (a (d - 1)(d - 2) + (1 - a) d (d - 1)) / ((k - 1)(k - 2))."""
        k, d, a = self.k, self.subset_size, self.in_probability
        c1 = a * (d - 1) / (k - 1)
        c2 = (a * (d - 1) * (d - 2) + (1 - a) * d * (d - 1)) / ((k - 1) * (k - 2)) if k > 2 else 0
        return c1, c2


def _class_sampler(
    mech: SubsetSelection, n: int, p: np.ndarray, rng: np.random.Generator, draws: int
) -> np.ndarray:
    """Support counts (draws, k) of n reports with answers iid from p, category by category.

    A report is its answer x, whether x is in S (probability a) and the rest of S, a uniform
    r0-subset of the other k - 1 categories (r0 = d - 1 or d). Categories are visited in order
    l = 0..k-1. A report whose answer is still ahead (pending, x >= l) has so far included
    categories with chances that do not depend on x, so given its past x is l with probability
    p_l / (p_l + ... + p_{k-1}), independently of the past; the rest of its subset is a uniform
    r-subset of the k - l - 1 unvisited non-answers, so it includes l with probability
    r / (k - l - 1). A report whose answer was visited (done) includes l with probability
    r / (k - l) (a report whose answer is l does not draw l: it becomes done after the step).
    Reports are independent, so each class (state, r) moves by binomial draws.
    States: 0 pending with x in S, 1 pending with x not in S, 2 done; column c holds r = c - 1.
    """
    k, d = mech.k, mech.subset_size
    state = np.zeros((3, draws, d + 2), dtype=np.int64)
    inside = rng.binomial(n, mech.in_probability, size=draws)
    state[0, :, d] = inside  # r = d - 1
    state[1, :, d + 1] = n - inside  # r = d
    tail = np.cumsum(p[::-1])[::-1]
    share = np.divide(p, tail, out=np.zeros(k), where=tail > 0).clip(0.0, 1.0)
    counts = np.zeros((draws, k), dtype=np.int64)
    low, high = d, d + 1  # the occupied columns
    r = np.arange(-1, d + 1, dtype=float)
    for category in range(k):
        cols = slice(low, high + 1)
        own = rng.binomial(state[:2, :, cols], share[category])
        counts[:, category] = own[0].sum(axis=1)
        state[:2, :, cols] -= own
        pools = np.array([k - category - 1, k - category - 1, k - category], dtype=float)
        chance = (r[cols][None, :] / np.maximum(pools, 1.0)[:, None]).clip(0.0, 1.0)
        moved = rng.binomial(state[:, :, cols], chance[:, None, :])
        counts[:, category] += moved.sum(axis=(0, 2))
        state[:, :, cols] -= moved
        state[:, :, low - 1 : high] += moved
        state[2, :, cols] += own.sum(axis=0)  # answer l: l is not among its others
        low = max(low - 1, 1)
        while high > low and not state[:, :, high].any():
            high -= 1
        while low < high and not state[:, :, low].any():
            low += 1
    return counts
