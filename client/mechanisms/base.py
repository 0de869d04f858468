"""What every local randomizer provides: parameters, privacy cost, secure and fast randomization,
a fixed-length wire encoding, and its channel (the law of a report given the true distribution).

The aggregator's estimators and tests only use the channel, so a mechanism is fully described by
``report_mean(p) = offset + slope * p`` and ``report_covariance(p)`` per report, plus an exact
sampler of the aggregate (``simulate_histogram``) for Monte Carlo nulls and studies.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal

from client.mechanisms.lazy_numpy import np
from client.mechanisms.secure_random import SYSTEM_RANDOM, SecureRandom


class ReportRangeError(ValueError):
    """A well-formed payload whose values lie outside what the mechanism can produce."""


@dataclass(frozen=True)
class PrivacyCost:
    """The cost one report charges to a device's ledger.

    ``kind == "pure"``: the report is ``epsilon``-LDP. ``kind == "zcdp"``: it is ``rho``-zCDP
    with respect to the device's whole record (rho-LzCDP).
    """

    kind: Literal["pure", "zcdp"]
    value: float

    def __post_init__(self) -> None:
        if self.kind not in ("pure", "zcdp"):
            raise ValueError(f"unknown privacy cost kind {self.kind!r}")
        if isinstance(self.value, bool) or not (
            isinstance(self.value, numbers.Real) and math.isfinite(self.value)
        ):
            raise ValueError(f"privacy cost must be a finite number, got {self.value!r}")
        if self.value <= 0:
            raise ValueError(f"privacy cost must be positive, got {self.value!r}")

    @property
    def epsilon(self) -> float | None:
        """The pure epsilon, or None for a zCDP cost."""
        return self.value if self.kind == "pure" else None

    @property
    def rho(self) -> float:
        """The zCDP cost: rho itself, or epsilon^2 / 2 for a pure report ([Bun2016])."""
        return self.value if self.kind == "zcdp" else self.value**2 / 2


def check_categories(k: object) -> int:
    """Validate a number of categories (an integer >= 2)."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise ValueError(f"k must be an integer >= 2, got {k!r}")
    count = int(k)  # numbers.Integral declares no ordering; its int is the same number
    if count < 2:
        raise ValueError(f"k must be an integer >= 2, got {k}")
    if count > 2**31:
        raise ValueError(f"k must be at most 2**31, got {k}")
    return count


def check_privacy_parameter(name: str, value: object) -> float:
    """Validate epsilon or rho: a finite, strictly positive real number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return value


def check_value(value: object, k: int) -> int:
    """Validate one true answer: an integer category index in 0..k-1."""
    if type(value) is int and 0 <= value < k:  # the common case, without the ABC check
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"value must be an integer category index, got {value!r}")
    index = int(value)  # numbers.Integral declares no ordering; its int is the same number
    if not 0 <= index < k:
        raise ValueError(f"value {value} is outside the categories 0..{k - 1}")
    return index


def check_packed(packed: object, payload_size: int) -> np.ndarray:
    """A (m, payload_size) contiguous uint8 matrix of payloads (``ValueError`` otherwise)."""
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    if packed.ndim != 2 or packed.shape[1] != payload_size:
        raise ValueError(f"payloads must be {payload_size} bytes")
    return packed


def check_values(values: object, k: int) -> np.ndarray:
    """Validate an array of true answers for ``simulate``."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError("values must be a one-dimensional array of category indices")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError("values must be integer category indices")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() >= k):
        raise ValueError(f"values must lie in 0..{k - 1}")
    return arr


class PureEpsilon:
    """The k categories and pure epsilon of an epsilon-LDP mechanism: their validation (the
    dataclass's ``__post_init__``), ``parameter`` and ``cost``. Each mechanism still declares the
    fields ``k`` and ``epsilon`` (dataclass fields come from dataclass bases only)."""

    k: int
    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "k", check_categories(self.k))
        object.__setattr__(self, "epsilon", check_privacy_parameter("epsilon", self.epsilon))

    @property
    def parameter(self) -> float:
        return self.epsilon

    @property
    def cost(self) -> PrivacyCost:
        return PrivacyCost("pure", self.epsilon)


class Mechanism(ABC):
    """A local randomizer for one categorical question with ``k`` categories."""

    #: Stable wire name of the mechanism.
    name: ClassVar[str]
    k: int

    @property
    @abstractmethod
    def cost(self) -> PrivacyCost:
        """Privacy cost of one report, derived from the parameters actually used."""

    @property
    @abstractmethod
    def parameter(self) -> float:
        """The privacy parameter the mechanism was built with (epsilon or rho)."""

    # --- device side -------------------------------------------------------------------------
    @abstractmethod
    def randomize(self, value: int, source: SecureRandom = SYSTEM_RANDOM) -> np.ndarray | int:
        """Randomize one true answer with the secure random source."""

    def randomize_payload(self, value: int, source: SecureRandom = SYSTEM_RANDOM) -> bytes:
        """Randomize one true answer and encode it: the bytes a device sends. Pure Python, so a
        device never loads numpy; the same draws from ``source``, and the same bytes, as
        ``encode(randomize(value, source))``. This default suits a mechanism whose report is
        one integer; a mechanism with vector reports overrides it."""
        return self.encode(self.randomize(value, source))

    @abstractmethod
    def encode(self, report: np.ndarray | int) -> bytes:
        """Serialize one report; the length is ``payload_size`` whatever the answer."""

    @abstractmethod
    def decode(self, payload: bytes) -> np.ndarray | int:
        """Parse and range-check one payload: ``ValueError`` if malformed, ``ReportRangeError``
        if a value is outside what the mechanism can produce."""

    @property
    @abstractmethod
    def payload_size(self) -> int:
        """Length in bytes of every encoded report."""

    # --- aggregator side: bulk decoding and the integer sufficient statistic ---------------------
    # The store keeps each report's integer statistic row and their exact int64 sums; these
    # methods are all it knows of a mechanism (``aggregator/store/ingest.py`` maps
    # ``ReportRangeError`` to OUT_OF_RANGE and any other ``ValueError`` to MALFORMED).

    #: Whether one report's statistic row can be far wider than its payload (support counts,
    #: public-coin groups): the store caps the report-by-cell rows one upload may expand into.
    statistic_expands: ClassVar[bool] = False

    def decode_many(self, packed: np.ndarray) -> np.ndarray:
        """Decode a (m, payload_size) uint8 matrix of payloads at once, with ``decode``'s checks
        (``ValueError`` if malformed, ``ReportRangeError`` if out of range): the stack of
        reports that ``statistic_rows`` and ``statistic_sums`` read."""
        packed = check_packed(packed, self.payload_size)
        return np.asarray([self.decode(row.tobytes()) for row in packed])

    def check_accepted(self, decoded: np.ndarray) -> None:
        """``ReportRangeError`` for decoded reports the aggregator refuses although the mechanism
        can produce them (too improbable for an honest device). None by default."""
        return

    @abstractmethod
    def statistic_rows(self, decoded: np.ndarray) -> np.ndarray:
        """(m, statistic_size) int64: each decoded report's contribution to the statistic."""

    def statistic_sums(self, decoded: np.ndarray) -> np.ndarray:
        """The int64 sums (statistic_size,) of the decoded reports' rows. Exact: raises
        ``OverflowError`` rather than wrap."""
        return self.statistic_rows(decoded).sum(axis=0, dtype=np.int64)

    def statistic_values(self, sums: np.ndarray) -> np.ndarray:
        """The histogram's values (float64) from stored integer sums: the sums themselves, or
        in real units for a mechanism whose reports live on a grid."""
        return np.asarray(sums, dtype=np.float64)

    @property
    def report_bound(self) -> float | None:
        """The largest magnitude a coordinate of one decoded report can have, in the units of
        ``statistic_values``, for a mechanism whose ``check_statistic`` accepts any finite
        values (additive noise: 1 + noise_bound / g); None where it bounds them itself."""
        return None

    def check_statistic(self, values: np.ndarray, n: int) -> None:
        """``ValueError`` unless ``values`` can be the statistic of ``n`` reports: counts of 0/1
        cells, so integers in 0..n (mechanisms with real-valued reports override it)."""
        if not np.array_equal(values, np.round(values)):
            raise ValueError(f"{self.name} values must be integers")
        if values.min() < 0 or values.max() > n:
            raise ValueError(f"{self.name} values must lie in 0..n")

    # --- how the aggregator's statistics read the mechanism --------------------------------------
    #: What the sufficient statistic is; the estimators and tests choose their algorithm by it:
    #: "counts" (one category per report: multinomial counts), "bits" (k bits per report, summed:
    #: ``n Cov(p_hat) = Diag p - p p^T + b I``), "noise" (the one-hot vector plus additive noise,
    #: in real units, the same covariance form), "support" (per-category counts of supporting
    #: reports, ``SupportMechanism``), "groups" (per-group report counts and bit sums: no
    #: per-category channel).
    statistic_kind: ClassVar[str]

    #: Whether pairs of categories are exchangeable (``ExchangeableSupport``): the support
    #: statistic's null law is then low-rank.
    exchangeable_pairs: ClassVar[bool] = False

    @property
    def support_size(self) -> int | None:
        """How many categories every report supports, when that number is fixed (None when it
        varies from report to report, or the reports are not read through support)."""
        return None

    #: The excess kurtosis of one coordinate's noise that the aggregator's normal approximations
    #: correct for (Cornish-Fisher); 0 where the noise is taken as normal.
    noise_excess_kurtosis: ClassVar[float] = 0.0

    #: Why the aggregator always simulates the null of a test on this mechanism, or None when it
    #: simulates only where the chi-square law's validity diagnostics fail.
    simulated_null: ClassVar[str | None] = None

    # --- studies and benchmarks ----------------------------------------------------------------
    @abstractmethod
    def simulate(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Randomize many answers at once with numpy (same law as ``randomize``)."""

    @property
    def statistic_size(self) -> int:
        """Length of the sufficient statistic: k, unless the mechanism's reports are summarised
        otherwise (public-coin one-bit reports: 2L per-group counts)."""
        return self.k

    @abstractmethod
    def aggregate(self, reports: np.ndarray) -> np.ndarray:
        """Sufficient statistic (length ``statistic_size``, float64) of a stack of reports."""

    @abstractmethod
    def simulate_histogram(
        self, n: int, p: np.ndarray, rng: np.random.Generator, size: int | None = None
    ) -> np.ndarray:
        """Draw the sufficient statistic of ``n`` reports from answers iid ~ ``p``.

        Returns shape (s,) or (size, s), s = ``statistic_size``. Exact for every mechanism
        except the Gaussian one, whose aggregate is drawn from the normal law with the exact
        per-report variance.
        """

    # --- channel ---------------------------------------------------------------------------------
    @property
    @abstractmethod
    def offset(self) -> float:
        """``c0`` in E[report] = c0 + c1 * p."""

    @property
    @abstractmethod
    def slope(self) -> float:
        """``c1`` in E[report] = c0 + c1 * p."""

    def report_mean(self, p: np.ndarray) -> np.ndarray:
        """Expected report vector given the true distribution p."""
        return self.offset + self.slope * np.asarray(p, dtype=float)

    @abstractmethod
    def report_covariance(self, p: np.ndarray) -> np.ndarray:
        """Covariance matrix (k x k) of one report vector given p."""

    def describe(self) -> str:
        """One-line human description."""
        label = "epsilon" if self.cost.kind == "pure" else "rho"
        return f"{self.name}(k={self.k}, {label}={self.parameter:g})"
