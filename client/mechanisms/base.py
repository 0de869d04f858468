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

import numpy as np

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
    if k < 2:
        raise ValueError(f"k must be an integer >= 2, got {k}")
    if k > 2**31:
        raise ValueError(f"k must be at most 2**31, got {k}")
    return int(k)


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
    if not 0 <= value < k:
        raise ValueError(f"value {value} is outside the categories 0..{k - 1}")
    return int(value)


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
