"""RAPTOR-style public-coin one-bit reports ([Acharya2019Test]): epsilon-LDP, one bit per device
about a public random half of the categories.

Before collection the survey fixes a public seed and a number of groups L; group l's subset
S_l (floor(k/2) categories) is derived from the seed by a documented SHA-256 construction, so
every device and the aggregator agree bit for bit. A device joins a uniformly random group and
sends 1{x in S_l} through binary randomized response. The sufficient statistic is the per-group
group sizes and bit sums, not a per-category vector: ``statistic_size`` is 2L and the
statistic is ``[n_1 .. n_L, B_1 .. B_L]`` (reports, then ones, per group), what the grouped
chi-square test (T3, large-domain spec §3) reads. The reports are not linear in p per category, so
there is no ``offset``/``slope``: ``report_mean`` and ``report_covariance`` are those of the 2L
statistic.
"""

from __future__ import annotations

import hashlib
import numbers
import struct
from dataclasses import dataclass
from decimal import MAX_EMAX, MIN_EMIN, ROUND_FLOOR, Decimal, localcontext
from functools import cached_property

from client.mechanisms.base import (
    Mechanism,
    PureEpsilon,
    ReportRangeError,
    check_value,
    check_values,
)
from client.mechanisms.lazy_numpy import np
from client.mechanisms.secure_random import SYSTEM_RANDOM, SecureRandom

SUBSET_DOMAIN = b"ldp-survey/raptor/v1"
MAX_GROUPS = 2**16
_U64 = 2**64


def public_subsets(k: int, seed: int, groups: int) -> np.ndarray:
    """(groups, k) boolean masks: group l's subset is the floor(k/2) categories j with the
    smallest (key, j), key = the first 8 bytes, u64le, of
    SHA-256(SUBSET_DOMAIN || seed u64le || l u32le || j u32le)."""
    half = k // 2
    masks = np.zeros((groups, k), dtype=bool)
    prefix = SUBSET_DOMAIN + struct.pack("<Q", seed)
    for group in range(groups):
        head = prefix + struct.pack("<I", group)
        digests = b"".join(
            hashlib.sha256(head + struct.pack("<I", j)).digest()[:8] for j in range(k)
        )
        keys = np.frombuffer(digests, dtype="<u8")
        order = np.lexsort((np.arange(k), keys))  # by key, ties by category
        masks[group, order[:half]] = True
    return masks


def in_public_subset(k: int, seed: int, group: int, value: int) -> bool:
    """Whether category ``value`` is in group ``group``'s subset, in pure Python (a device's
    ``randomize_payload``): its (key, category) is among the floor(k/2) smallest, the
    construction of ``public_subsets``, so O(k) hashes and no table."""
    head = SUBSET_DOMAIN + struct.pack("<QI", seed, group)
    sha256, pack = hashlib.sha256, struct.Struct("<I").pack

    def key(j: int) -> int:
        return int.from_bytes(sha256(head + pack(j)).digest()[:8], "little")

    own = (key(value), value)
    below = sum(1 for j in range(k) if (key(j), j) < own)
    return below < k // 2


class NotLinearError(ValueError):
    """Asked for a per-category linear channel (offset, slope) that one-bit reports lack."""


@dataclass(frozen=True)
class PublicCoinBit(PureEpsilon, Mechanism):
    """One bit about the answer's membership in the public subset of the device's group, kept
    with probability rho = e^eps / (e^eps + 1).

    Privacy: the group does not depend on the answer, and given it the bit is binary randomized
    response: a likelihood ratio of at most e^eps. On devices the keep decision compares a
    uniform 64-bit integer with a threshold rounded *down* from rho (80-digit decimal), so
    ``realized_epsilon <= epsilon``.
    """

    name = "public_coin_bit"
    statistic_kind = "groups"
    statistic_expands = True
    k: int
    epsilon: float
    public_seed: int
    groups: int

    def __post_init__(self) -> None:
        super().__post_init__()
        seed, groups = self.public_seed, self.groups
        if (
            isinstance(seed, bool)
            or not isinstance(seed, numbers.Integral)
            or not (0 <= seed < _U64)
        ):
            raise ValueError(f"public_seed must be an integer in 0..2**64-1, got {seed!r}")
        if (
            isinstance(groups, bool)
            or not isinstance(groups, numbers.Integral)
            or not (1 <= groups <= MAX_GROUPS)
        ):
            raise ValueError(f"groups must be an integer in 1..{MAX_GROUPS}, got {groups!r}")
        object.__setattr__(self, "public_seed", int(seed))
        object.__setattr__(self, "groups", int(groups))

    def describe(self) -> str:
        return f"{self.name}(k={self.k}, epsilon={self.epsilon:g}, groups={self.groups})"

    @cached_property
    def subset_masks(self) -> np.ndarray:
        """(L, k) booleans: the public subsets S_1..S_L (read-only)."""
        masks = public_subsets(self.k, self.public_seed, self.groups)
        masks.setflags(write=False)
        return masks

    @cached_property
    def keep_probability(self) -> float:
        """rho = e^eps / (e^eps + 1)."""
        return float(1 / (1 + np.exp(-self.epsilon)))

    @cached_property
    def _keep_threshold(self) -> int:
        """floor(rho * 2**64) - 1, at least 2**63."""
        with localcontext() as ctx:
            ctx.prec, ctx.Emax, ctx.Emin = 80, MAX_EMAX, MIN_EMIN
            rho = 1 / (1 + (-Decimal(self.epsilon)).exp())
            threshold = int((rho * _U64).to_integral_value(rounding=ROUND_FLOOR))
        return max(threshold - 1, _U64 // 2)

    @property
    def realized_epsilon(self) -> float:
        with localcontext() as ctx:
            ctx.prec, ctx.Emax, ctx.Emin = 80, MAX_EMAX, MIN_EMIN
            rho = Decimal(self._keep_threshold) / _U64
            return float((rho / (1 - rho)).ln())

    # --- device side -------------------------------------------------------------------------
    def randomize(self, value: int, source: SecureRandom = SYSTEM_RANDOM) -> np.ndarray:
        """(group, bit): a uniform group, then 1{value in S_group}, flipped unless kept."""
        return np.array(self._secure_report(value, source), dtype=np.int64)

    def randomize_payload(self, value: int, source: SecureRandom = SYSTEM_RANDOM) -> bytes:
        group, bit = self._secure_report(value, source)
        return struct.pack("<I", 2 * group + bit)

    def _secure_report(self, value: int, source: SecureRandom) -> tuple[int, int]:
        value = check_value(value, self.k)
        group = source.below(self.groups)
        keep = source.bits(64) < self._keep_threshold
        inside = in_public_subset(self.k, self.public_seed, group, value)
        return group, int(inside == keep)

    @property
    def payload_size(self) -> int:
        return 4

    def encode(self, report: np.ndarray | int) -> bytes:
        group, bit = (int(v) for v in np.asarray(report).reshape(2))
        if not (0 <= group < self.groups and bit in (0, 1)):
            raise ValueError(f"a report is (group < {self.groups}, bit in 0/1)")
        return struct.pack("<I", 2 * group + bit)

    def decode(self, payload: bytes) -> np.ndarray:
        if len(payload) != self.payload_size:
            raise ValueError(f"payload must be {self.payload_size} bytes, got {len(payload)}")
        return self.decode_many(np.frombuffer(payload, dtype=np.uint8)[None, :])[0]

    def decode_many(self, packed: np.ndarray) -> np.ndarray:
        """(m, 4) uint8 payloads -> (m, 2) reports (group, bit); OUT_OF_RANGE-style
        ``ReportRangeError`` for a group >= L."""
        packed = np.ascontiguousarray(packed, dtype=np.uint8)
        if packed.ndim != 2 or packed.shape[1] != self.payload_size:
            raise ValueError(f"payloads must be {self.payload_size} bytes")
        words = packed.view("<u4").reshape(-1).astype(np.int64)
        if words.size and words.max() >= 2 * self.groups:
            raise ReportRangeError(f"group {words.max() // 2} is outside 0..{self.groups - 1}")
        return np.stack([words // 2, words % 2], axis=1)

    # --- aggregates and studies ----------------------------------------------------------------
    @property
    def statistic_size(self) -> int:
        """2L: every group's report count, then every group's sum of bits."""
        return 2 * self.groups

    def statistic_rows(self, reports: np.ndarray) -> np.ndarray:
        """(m, 2L) int64 0/1 rows: each report's contribution to the statistic."""
        reports = np.asarray(reports, dtype=np.int64).reshape(-1, 2)
        rows = np.zeros((reports.shape[0], self.statistic_size), dtype=np.int64)
        index = np.arange(reports.shape[0])
        rows[index, reports[:, 0]] = 1
        rows[index, self.groups + reports[:, 0]] = reports[:, 1]
        return rows

    def statistic_sums(self, decoded: np.ndarray) -> np.ndarray:
        sums, sizes = self.group_statistics(decoded)
        return np.concatenate([sizes, sums])

    def check_statistic(self, values: np.ndarray, n: int) -> None:
        super().check_statistic(values, n)
        sizes, sums = np.split(values, 2)
        if sizes.sum() != n or (sums > sizes).any():
            raise ValueError(f"public-coin group sizes must sum to n={n} and bound their bit sums")

    def aggregate(self, reports: np.ndarray) -> np.ndarray:
        sums, sizes = self.group_statistics(reports)
        return np.concatenate([sizes, sums]).astype(np.float64)

    def simulate_histogram(
        self, n: int, p: np.ndarray, rng: np.random.Generator, size: int | None = None
    ) -> np.ndarray:
        sums, sizes = self.simulate_groups(n, p, rng, size)
        return np.concatenate([sizes, sums], axis=-1).astype(np.float64)

    @property
    def offset(self) -> float:
        raise NotLinearError("public_coin_bit reports are per group, not per category")

    @property
    def slope(self) -> float:
        raise NotLinearError("public_coin_bit reports are per group, not per category")

    def report_mean(self, p: np.ndarray) -> np.ndarray:
        """Expected contribution of one report to the statistic: (1/L, mu_l / L)."""
        share = np.full(self.groups, 1 / self.groups)
        return np.concatenate([share, share * self.bit_probabilities(p)])

    def report_covariance(self, p: np.ndarray) -> np.ndarray:
        """Covariance (2L x 2L) of one report's contribution: its second moments are
        E[size_l size_m] = E[size_l bit_m] = delta_lm / L, E[bit_l bit_m] = delta_lm mu_l / L."""
        mean = self.report_mean(p)
        L = self.groups
        second = np.zeros((2 * L, 2 * L))
        second[:L, :L] = np.diag(mean[:L])
        for block in ((slice(0, L), slice(L, None)), (slice(L, None), slice(0, L))):
            second[block] = np.diag(mean[L:])
        second[L:, L:] = np.diag(mean[L:])
        return second - np.outer(mean, mean)

    def group_statistics(self, reports: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bit_sums, group_sizes), each int64 of length L: the sufficient statistic."""
        reports = np.asarray(reports, dtype=np.int64)
        if reports.ndim != 2 or reports.shape[1] != 2:
            raise ValueError("reports have shape (n, 2): group, bit")
        groups, bits = reports[:, 0], reports[:, 1]
        sizes = np.bincount(groups, minlength=self.groups)
        sums = np.bincount(groups, weights=bits, minlength=self.groups).astype(np.int64)
        return sums, sizes

    def bit_probabilities(self, p: np.ndarray) -> np.ndarray:
        """mu_l = (1 - rho) + (2 rho - 1) p(S_l): the chance of a 1 in group l under p."""
        rho = self.keep_probability
        mass = self.subset_masks.astype(float) @ np.asarray(p, dtype=float)
        return (1 - rho) + (2 * rho - 1) * mass

    def simulate(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        values = check_values(values, self.k)
        groups = rng.integers(0, self.groups, size=values.size)
        keep = rng.random(values.size) < self.keep_probability
        inside = self.subset_masks[groups, values]
        return np.stack([groups, (inside == keep).astype(np.int64)], axis=1)

    def simulate_groups(
        self, n: int, p: np.ndarray, rng: np.random.Generator, size: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Exact draws of (bit_sums, group_sizes) from n reports with answers iid ~ p: group
        sizes Multinomial(n, 1/L), then B_l ~ Binomial(n_l, mu_l)."""
        p = np.asarray(p, dtype=float)
        sizes = rng.multinomial(n, np.full(self.groups, 1 / self.groups), size=size)
        sums = rng.binomial(sizes, self.bit_probabilities(p / p.sum()))
        return sums.astype(np.int64), sizes.astype(np.int64)


def as_public_coin(mechanism: Mechanism) -> PublicCoinBit:
    """``mechanism`` as the public-coin mechanism its ``statistic_kind`` "groups" names: the
    statistics choose their algorithm by the kind, then read the groups (``groups``,
    ``bit_probabilities``) through this. ``TypeError`` for another class: a mechanism of any
    other kind, or one that claims the kind without the groups."""
    if not isinstance(mechanism, PublicCoinBit):
        raise TypeError(f"{mechanism.describe()} is not a public-coin one-bit mechanism")
    return mechanism
