"""Additive-noise mechanisms on the one-hot vector: Gaussian (rho-zCDP) and Laplace (eps-LDP).

Reports live on the integer grid of step 1/g (g = 2**granularity_bits): a report is the integer
vector ``g * e_x + Z`` where Z is exact discrete noise in grid units, and its real value is that
vector divided by g. Because g is a power of two, sums of reports in real units are exact in
float64, so sharded aggregation is associative. Exact discrete noise means no floating-point
artefact ([Mironov2012]) can reveal the answer, and the statistics use the exact noise variance.
"""

from __future__ import annotations

import math
import struct
from abc import abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from client.mechanisms.base import (
    Mechanism,
    PrivacyCost,
    ReportRangeError,
    check_categories,
    check_packed,
    check_privacy_parameter,
    check_value,
    check_values,
)
from client.mechanisms.discrete_noise import (
    discrete_gaussian,
    discrete_gaussian_sum,
    discrete_gaussian_variance,
    discrete_laplace,
)
from client.mechanisms.lazy_numpy import np
from client.mechanisms.secure_random import SYSTEM_RANDOM, SecureRandom

if TYPE_CHECKING:
    from fractions import Fraction

DEFAULT_GRANULARITY_BITS = 10
#: The probability that an honest report falls outside the accepted range (``accepted_bound``),
#: bounded over its k coordinates: about one in a trillion reports.
HONEST_REJECTION = 2.0**-40


@dataclass(frozen=True)
class _AdditiveNoise(Mechanism):
    """Shared machinery: one-hot vector on the grid plus iid discrete noise per coordinate."""

    statistic_kind = "noise"
    k: int
    granularity_bits: int = field(default=DEFAULT_GRANULARITY_BITS, kw_only=True)

    def _check_common(self) -> None:
        object.__setattr__(self, "k", check_categories(self.k))
        bits = self.granularity_bits
        if isinstance(bits, bool) or not isinstance(bits, int) or not 0 <= bits <= 20:
            raise ValueError(f"granularity_bits must be an integer in 0..20, got {bits!r}")

    @property
    def scale(self) -> int:
        """g: grid points per unit; a report's real value is its integer vector / g."""
        return 2**self.granularity_bits

    @property
    def offset(self) -> float:
        return 0.0

    @property
    def slope(self) -> float:
        return 1.0

    @property
    @abstractmethod
    def noise_variance(self) -> float:
        """Exact variance, in real units, of the noise on one coordinate of one report."""

    @abstractmethod
    def _secure_noise(self, source: SecureRandom) -> int:
        """One exact noise draw in grid units from the secure source."""

    @abstractmethod
    def _numpy_noise(self, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        """Noise draws in grid units with numpy (same law as ``_secure_noise``)."""

    @abstractmethod
    def _noise_sum(self, n: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        """The sum of n iid noise draws, in real units, for every entry of ``shape``."""

    # --- device side -------------------------------------------------------------------------
    def randomize(self, value: int, source: SecureRandom = SYSTEM_RANDOM) -> np.ndarray:
        return np.array(self._secure_grid(value, source), dtype=np.int64)

    def randomize_payload(self, value: int, source: SecureRandom = SYSTEM_RANDOM) -> bytes:
        return struct.pack(f"<{self.k}q", *self._secure_grid(value, source))

    def _secure_grid(self, value: int, source: SecureRandom) -> list[int]:
        """The k grid values: one exact noise draw per coordinate, in order, plus g at the
        answer."""
        value = check_value(value, self.k)
        report = [self._secure_noise(source) for _ in range(self.k)]
        report[value] += self.scale
        return report

    @property
    def payload_size(self) -> int:
        return 8 * self.k

    def encode(self, report: np.ndarray | int) -> bytes:
        grid = np.asarray(report)
        if grid.shape != (self.k,) or not np.issubdtype(grid.dtype, np.integer):
            raise ValueError(f"an additive-noise report is {self.k} integer grid values")
        return grid.astype("<i8").tobytes()

    @property
    @abstractmethod
    def noise_bound(self) -> int:
        """Grid magnitude the noise exceeds with probability below 1e-26: larger values are
        rejected as impossible (they can only come from a faulty or malicious device)."""

    @property
    def report_bound(self) -> float:
        """Decoding refuses a coordinate beyond g + noise_bound grid units: 1 + noise_bound / g
        in real units."""
        return 1 + self.noise_bound / self.scale

    def decode(self, payload: bytes) -> np.ndarray:
        if len(payload) != self.payload_size:
            raise ValueError(f"payload must be {self.payload_size} bytes, got {len(payload)}")
        grid = np.frombuffer(payload, dtype="<i8").astype(np.int64)
        limit = self.scale + self.noise_bound
        if grid.max() > limit or grid.min() < -limit:
            raise ReportRangeError("a coordinate is outside the range the noise can produce")
        return grid

    def decode_many(self, packed: np.ndarray) -> np.ndarray:
        """(m, 8k) uint8 payloads -> (m, k) grid values, with ``decode``'s range."""
        grid = check_packed(packed, self.payload_size).view("<i8")
        limit = self.scale + self.noise_bound
        if grid.size and (grid.max() > limit or grid.min() < -limit):
            raise ReportRangeError("a coordinate is outside the range the noise can produce")
        return grid

    @abstractmethod
    def noise_tail(self, bound: int) -> float:
        """An upper bound on P(|Z| > bound) for one coordinate's noise Z (grid units)."""

    @cached_property
    def accepted_bound(self) -> int:
        """The largest grid magnitude the aggregator accepts in a coordinate: g plus the
        smallest noise bound b with k * P(|Z| > b) <= HONEST_REJECTION (see
        docs/threat-model.md for the weight this leaves one report). Never above the decoding
        range."""
        target = HONEST_REJECTION / self.k
        low, high = 0, self.noise_bound  # noise_tail(noise_bound) is far below target
        while low < high:  # the smallest b with noise_tail(b) <= target (the tail decreases in b)
            middle = (low + high) // 2
            if self.noise_tail(middle) <= target:
                high = middle
            else:
                low = middle + 1
        return self.scale + low

    def check_accepted(self, decoded: np.ndarray) -> None:
        limit = self.accepted_bound
        if decoded.size and (decoded.max() > limit or decoded.min() < -limit):
            raise ReportRangeError(
                f"a coordinate is outside the accepted range (|value| <= {limit} grid units)"
            )

    def statistic_rows(self, decoded: np.ndarray) -> np.ndarray:
        return np.asarray(decoded).astype(np.int64)

    def statistic_sums(self, decoded: np.ndarray) -> np.ndarray:
        """Exact: ``OverflowError`` when the sum of accepted reports could leave int64."""
        if float(self.accepted_bound) * len(decoded) >= 2.0**62:
            raise OverflowError(f"sums of {len(decoded)} reports may overflow int64")
        return np.asarray(decoded).sum(axis=0, dtype=np.int64)

    def statistic_values(self, sums: np.ndarray) -> np.ndarray:
        """In real units: the grid sums divided by g (exact, g a power of two)."""
        return np.asarray(sums, dtype=np.float64) / self.scale

    def check_statistic(self, values: np.ndarray, n: int) -> None:
        """Real-valued sums: any finite values."""

    def to_real(self, report: np.ndarray) -> np.ndarray:
        """The real-valued report vector e_x + noise."""
        return np.asarray(report, dtype=np.float64) / self.scale

    # --- studies ---------------------------------------------------------------------------------
    def simulate(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        values = check_values(values, self.k)
        reports = self._numpy_noise((values.size, self.k), rng)
        reports[np.arange(values.size), values] += self.scale
        return reports

    def aggregate(self, reports: np.ndarray) -> np.ndarray:
        reports = np.asarray(reports)
        if reports.ndim != 2 or reports.shape[1] != self.k:
            raise ValueError(f"reports must have shape (n, {self.k})")
        if reports.size and not np.issubdtype(reports.dtype, np.integer):
            raise ValueError("additive-noise reports are integer grid vectors (see to_real)")
        return reports.sum(axis=0, dtype=np.int64).astype(np.float64) / self.scale

    def simulate_histogram(
        self, n: int, p: np.ndarray, rng: np.random.Generator, size: int | None = None
    ) -> np.ndarray:
        p = np.asarray(p, dtype=float)
        counts = rng.multinomial(n, p / p.sum(), size=size).astype(np.float64)
        return counts + self._noise_sum(n, counts.shape, rng)

    def report_covariance(self, p: np.ndarray) -> np.ndarray:
        p = np.asarray(p, dtype=float)
        return np.diag(p) - np.outer(p, p) + self.noise_variance * np.eye(self.k)


@dataclass(frozen=True)
class GaussianNoise(_AdditiveNoise):
    """One-hot vector plus discrete Gaussian noise N_Z(0, g^2 / rho) per coordinate (grid units).

    Privacy: changing the answer moves exactly two coordinates by g. A one-dimensional discrete
    Gaussian with shift g and variance parameter g^2/rho has Renyi divergence at most
    alpha * rho / 2 at every order alpha ([Canonne2020] Prop. 5/Thm. 4, the same
    bound as the continuous Gaussian), and the coordinates are independent, so one report is
    exactly rho-zCDP (rho-LzCDP). The noise variance is slightly below 1/rho; the statistics use
    the exact value ``noise_variance``.

    Parameters
    ----------
    k : int
        The number of categories (from 2 up to 2**31).
    rho : float
        The zCDP parameter of one report (> 0); the noise variance is close to 1 / rho.
    granularity_bits : int, default 10 (keyword only)
        Reports live on the grid of step 1 / 2**granularity_bits; 0..20.

    Attributes
    ----------
    noise_variance : float
        Exact variance of the noise on one coordinate, in real units.
    cost : PrivacyCost
        ``PrivacyCost("zcdp", rho)``, what the device ledger charges.

    Raises
    ------
    ValueError
        ``k``, ``rho`` or ``granularity_bits`` out of range; an answer outside 0..k-1; from
        ``encode``, a report that is not k integers.
    ReportRangeError
        From ``decode``, a coordinate the noise cannot produce.

    References
    ----------
    [Canonne2020] (the discrete Gaussian and its sampler); [Bun2016] (zCDP); [Rogers2017]
    Ch. 2.2 and Ch. 8 (the local Gaussian tests); local-chi-square-tests spec §1.1;
    [Mironov2012] for why the noise is exact and discrete.

    Examples
    --------
    >>> import numpy as np
    >>> from client.mechanisms import GaussianNoise
    >>> gauss = GaussianNoise(k=4, rho=0.5)
    >>> gauss.cost
    PrivacyCost(kind='zcdp', value=0.5)
    >>> round(gauss.noise_variance, 4)
    2.0
    >>> report = gauss.randomize(0)  # integers on the 1/1024 grid, from the OS CSPRNG
    >>> report.shape, report.dtype
    ((4,), dtype('int64'))
    >>> reports = gauss.simulate(np.array([0, 1, 2, 3]), np.random.default_rng(0))
    >>> gauss.aggregate(reports).shape  # coordinate sums in real units
    (4,)
    """

    name = "gaussian"
    rho: float

    def __post_init__(self) -> None:
        self._check_common()
        object.__setattr__(self, "rho", check_privacy_parameter("rho", self.rho))

    @property
    def parameter(self) -> float:
        return self.rho

    @property
    def cost(self) -> PrivacyCost:
        return PrivacyCost("zcdp", self.rho)

    @cached_property
    def _sigma2_grid(self) -> Fraction:
        from fractions import Fraction  # lazily: only a randomized answer needs it

        return Fraction(self.scale**2) / Fraction(self.rho)

    @cached_property
    def noise_variance(self) -> float:
        return discrete_gaussian_variance(float(self._sigma2_grid)) / self.scale**2

    @cached_property
    def noise_bound(self) -> int:
        """12 standard deviations: P(|Z| > bound) < 2 exp(-72)."""
        return math.isqrt(int(144 * self._sigma2_grid)) + 1

    def noise_tail(self, bound: int) -> float:
        """The discrete Gaussian's normalizer is at least sigma sqrt(2 pi) (Poisson summation)
        and its tail sum at most the integral from b, so P(|Z| > b) <= erfc(b / (sigma sqrt 2)),
        sigma^2 = g^2 / rho."""
        sigma = self.scale / math.sqrt(self.rho)
        return math.erfc(bound / (sigma * math.sqrt(2)))

    def _secure_noise(self, source: SecureRandom) -> int:
        return source.discrete_gaussian(self._sigma2_grid)

    def _numpy_noise(self, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        size = int(np.prod(shape))
        return discrete_gaussian(float(self._sigma2_grid), size, rng).reshape(shape)

    def _noise_sum(self, n: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        """Exact: the lattice law of a sum of n discrete Gaussians (see ``discrete_noise``)."""
        return discrete_gaussian_sum(n, float(self._sigma2_grid), shape, rng) / self.scale


@dataclass(frozen=True)
class LaplaceNoise(_AdditiveNoise):
    """One-hot vector plus discrete Laplace noise, P(z) ~ exp(-|z| eps / (2g)) per coordinate.

    Privacy: changing the answer moves the grid vector by 2g in L1 norm, and the discrete Laplace
    of scale 2g/eps is exactly eps-DP for integer shifts of L1 size 2g, so one report is
    epsilon-LDP. Exact variance per coordinate: 2r/(1-r)^2 / g^2 with r = exp(-eps/(2g)),
    which tends to the continuous 8/eps^2 as g grows.

    Parameters
    ----------
    epsilon : float
        Privacy parameter of one report, positive and finite.
    k, granularity_bits
        As for ``GaussianNoise``.

    Attributes
    ----------
    noise_variance, cost
        As for ``GaussianNoise``; the cost is ``PrivacyCost("pure", epsilon)``.

    Raises
    ------
    ValueError, ReportRangeError
        As for ``GaussianNoise``, with ``epsilon`` in the place of ``rho``.

    References
    ----------
    [Rogers2017] Ch. 8 Sec. 8.2.2 and Alg. 16 (the local Laplace test, calibrated by Monte
    Carlo); local-chi-square-tests spec §1.2, §4.4; [Canonne2020] (the discrete Laplace sampler);
    [Mironov2012].

    Examples
    --------
    >>> from client.mechanisms import LaplaceNoise
    >>> laplace = LaplaceNoise(k=4, epsilon=1.0)
    >>> round(laplace.noise_variance, 4)  # close to 8 / epsilon^2
    8.0
    >>> laplace.cost.kind, laplace.cost.value
    ('pure', 1.0)
    >>> laplace.randomize(3).shape  # integers on the 1/1024 grid, from the OS CSPRNG
    (4,)
    >>> import numpy as np
    >>> reports = laplace.simulate(np.array([0, 0, 1]), np.random.default_rng(0))
    >>> laplace.aggregate(reports).shape
    (4,)
    """

    name = "laplace"
    noise_excess_kurtosis = 3.0  # the continuous Laplace's; a sum of n has 3 / n
    simulated_null = "Laplace noise: its null is always simulated"
    epsilon: float

    def __post_init__(self) -> None:
        self._check_common()
        object.__setattr__(self, "epsilon", check_privacy_parameter("epsilon", self.epsilon))

    @property
    def parameter(self) -> float:
        return self.epsilon

    @property
    def cost(self) -> PrivacyCost:
        return PrivacyCost("pure", self.epsilon)

    @cached_property
    def _scale_grid(self) -> Fraction:
        from fractions import Fraction  # lazily: only a randomized answer needs it

        return Fraction(2 * self.scale) / Fraction(self.epsilon)

    @cached_property
    def _ratio(self) -> float:
        """r = exp(-1 / scale_grid), the geometric ratio of the discrete Laplace."""
        return math.exp(-self.epsilon / (2 * self.scale))

    @cached_property
    def noise_variance(self) -> float:
        one_minus_r = -math.expm1(-self.epsilon / (2 * self.scale))
        return 2 * self._ratio / one_minus_r**2 / self.scale**2

    @cached_property
    def noise_bound(self) -> int:
        """60 scale units: P(|Z| > bound) < 2 exp(-60)."""
        return math.ceil(60 * self._scale_grid) + 1

    def noise_tail(self, bound: int) -> float:
        """Exactly: P(Z = z) = (1 - r)/(1 + r) r^|z| with r = exp(-1/s), s = 2g/eps, so
        P(|Z| > b) = 2 r^(b+1) / (1 + r)."""
        log_r = -self.epsilon / (2 * self.scale)
        return 2 * math.exp((bound + 1) * log_r) / (1 + math.exp(log_r))

    def _secure_noise(self, source: SecureRandom) -> int:
        return source.discrete_laplace(self._scale_grid)

    def _numpy_noise(self, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        size = int(np.prod(shape))
        return discrete_laplace(float(self._scale_grid), size, rng).reshape(shape)

    def _noise_sum(self, n: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        """Exact: a sum of n discrete Laplaces is a difference of two negative binomials."""
        if n == 0:
            return np.zeros(shape)
        success = -math.expm1(-self.epsilon / (2 * self.scale))
        grid = rng.negative_binomial(n, success, size=shape) - rng.negative_binomial(
            n, success, size=shape
        )
        return grid / self.scale
