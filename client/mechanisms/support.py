"""Mechanisms read through support counts: every report supports a set of categories, and the
sufficient statistic is how many reports support each category.

For these mechanisms one report supports category j with probability ``offset + slope * p_j``
whatever the other answers, so each support count is exactly Binomial(n, offset + slope p_j): the
estimators de-bias it per category and the intervals are Clopper-Pearson on it, as for flip
components. The joint law of the k counts is the mechanism's own (``report_covariance``), and
``simulate_histogram`` draws it exactly for Monte Carlo nulls.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

from client.mechanisms.base import Mechanism, check_packed
from client.mechanisms.lazy_numpy import np


class SupportMechanism(Mechanism):
    """A mechanism whose aggregate is the per-category count of supporting reports."""

    statistic_kind = "support"
    statistic_expands = True

    @abstractmethod
    def support(self, reports: np.ndarray) -> np.ndarray:
        """0/1 matrix (m, k): which categories each of ``m`` reports supports."""

    @abstractmethod
    def decode_many(self, packed: np.ndarray) -> np.ndarray:
        """Decode a (m, payload_size) uint8 matrix of payloads at once, with ``decode``'s checks
        (``ValueError`` if malformed, ``ReportRangeError`` if out of range)."""

    def support_counts(self, reports: np.ndarray) -> np.ndarray:
        """The int64 support count of each category over a stack of reports."""
        return bit_sums(self.support(reports))

    def statistic_rows(self, decoded: np.ndarray) -> np.ndarray:
        return self.support(decoded).astype(np.int64)

    def statistic_sums(self, decoded: np.ndarray) -> np.ndarray:
        return self.support_counts(decoded)

    def aggregate(self, reports: np.ndarray) -> np.ndarray:
        return self.support_counts(reports).astype(np.float64)


class ExchangeableSupport(SupportMechanism):
    """A support mechanism whose pairs of categories are exchangeable: the chance that two
    categories are both supported depends only on whether the answer is one of them.

    Its report covariance is then a diagonal plus a rank-2 matrix in the span of 1 and p, which
    lets the aggregator evaluate the Pearson statistic's null law without an eigendecomposition
    (``aggregator/stats/low_rank_law.py``).
    """

    exchangeable_pairs = True

    @property
    @abstractmethod
    def pair_support(self) -> tuple[float, float]:
        """P(j and l both supported), j != l, when the answer is j or l, and when it is neither."""

    def report_covariance(self, p: np.ndarray) -> np.ndarray:
        p = np.asarray(p, dtype=float)
        mine, theirs = self.pair_support
        mean = self.report_mean(p)
        cov = theirs + (mine - theirs) * (p[:, None] + p[None, :]) - np.outer(mean, mean)
        np.fill_diagonal(cov, mean * (1 - mean))
        return cov


def as_exchangeable(mechanism: Mechanism) -> ExchangeableSupport:
    """``mechanism`` as the support mechanism its ``exchangeable_pairs`` flag names: the
    statistics choose the low-rank null law by the flag, then read ``pair_support`` through this.
    ``TypeError`` for another class: a mechanism without the flag, or one that sets it without
    the pair probabilities."""
    if not isinstance(mechanism, ExchangeableSupport):
        raise TypeError(f"{mechanism.describe()} has no exchangeable pairs of categories")
    return mechanism


def bit_sums(bits: np.ndarray) -> np.ndarray:
    """Column sums (int64) of a 0/1 matrix, adding 255 rows at a time in uint8 (no overflow):
    several times faster than a sum in int64."""
    bits = np.asarray(bits, dtype=np.uint8)
    rows, k = bits.shape
    full = rows - rows % 255
    blocks = np.add.reduce(bits[:full].reshape(-1, 255, k), axis=1, dtype=np.uint8)
    return blocks.sum(axis=0, dtype=np.int64) + bits[full:].sum(axis=0, dtype=np.int64)


def unpack_bits(packed: np.ndarray, k: int) -> np.ndarray:
    """Bits (m, k) of a (m, ceil(k/8)) uint8 matrix, least significant bit first; the padding
    bits above k must be zero (``ValueError``, as for another shape)."""
    bits = np.unpackbits(check_packed(packed, (k + 7) // 8), axis=1, bitorder="little")
    if bits[:, k:].any():
        raise ValueError("padding bits beyond k must be zero")
    return bits[:, :k]


def bit_payload(bits: Sequence[int]) -> bytes:
    """The little-endian bit packing of one report's 0/1 list, in pure Python (a device's
    ``randomize_payload``): the bytes ``pack_bits`` gives for the same bits."""
    digits = "".join("1" if bit else "0" for bit in reversed(bits))
    return int(digits, 2).to_bytes((len(bits) + 7) // 8, "little")


def pack_bits(bits: np.ndarray, k: int, name: str) -> bytes:
    """The little-endian bit packing of one k-bit report."""
    bits = np.asarray(bits)
    if bits.shape != (k,) or not np.isin(bits, (0, 1)).all():
        raise ValueError(f"a {name} report is {k} bits")
    return np.packbits(bits.astype(np.uint8), bitorder="little").tobytes()
