"""Cryptographically secure sampling primitives for on-device randomizers.

Every random bit used to randomize a real answer comes from the operating system's CSPRNG
(``os.urandom``), read in blocks for speed. All samplers use integer arithmetic only: the
Bernoulli, geometric, discrete Laplace and discrete Gaussian samplers follow Canonne, Kamath and
Steinke [Canonne2020], "The Discrete Gaussian for Differential Privacy", Algorithms 1-3, with
rational parameters, so no floating-point rounding can shape the output distribution.
"""

from __future__ import annotations

import math
import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the samplers read numerator and denominator only
    from fractions import Fraction

_BLOCK = 4096


class SecureRandom:
    """Buffered reader of ``os.urandom`` that hands out uniform integers.

    The buffer is discarded after ``fork()`` (checked through the process id), so a parent and
    child never reuse the same random bytes.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._pos = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def bytes(self, count: int) -> bytes:
        """Return ``count`` fresh random bytes (thread-safe; never handed out twice)."""
        if count > _BLOCK:
            return os.urandom(count)
        with self._lock:
            if self._pid != os.getpid():
                self._buffer, self._pos, self._pid = b"", 0, os.getpid()
            if self._pos + count > len(self._buffer):
                self._buffer, self._pos = os.urandom(_BLOCK), 0
            out = self._buffer[self._pos : self._pos + count]
            self._pos += count
            return out

    def bits(self, nbits: int) -> int:
        """Return a uniform integer in ``[0, 2**nbits)``."""
        nbytes = (nbits + 7) // 8
        value = int.from_bytes(self.bytes(nbytes), "little")
        return value >> (8 * nbytes - nbits)

    def below(self, upper: int) -> int:
        """Return a uniform integer in ``[0, upper)`` by rejection (no modulo bias)."""
        if upper <= 0:
            raise ValueError("upper must be positive")
        if upper == 1:
            return 0
        nbits = (upper - 1).bit_length()
        while True:
            value = self.bits(nbits)
            if value < upper:
                return value

    def bernoulli(self, num: int, den: int) -> bool:
        """Exact Bernoulli(num / den) for integers 0 <= num <= den."""
        return self.below(den) < num

    def bernoulli_exp(self, num: int, den: int) -> bool:
        """Exact Bernoulli(exp(-num / den)) for integers num >= 0, den > 0 ([Canonne2020] Alg 1)."""
        while num > den:
            if not self._bernoulli_exp_unit(1, 1):
                return False
            num -= den
        return self._bernoulli_exp_unit(num, den)

    def _bernoulli_exp_unit(self, num: int, den: int) -> bool:
        k = 1
        while self.below(den * k) < num:  # Bernoulli(gamma / k)
            k += 1
        return k % 2 == 1

    def geometric(self, t: int, s: int = 1) -> int:
        """Exact geometric on {0, 1, ...} with P(y) proportional to exp(-y * s / t).

        Draw X with P(x) ~ exp(-x / t) as ``U + t * V`` (U uniform below t, accepted with
        probability exp(-U / t); V counts Bernoulli(1/e) successes), then return
        ``floor(X / s)``. This is the inner loop of [Canonne2020] Algorithm 2.
        """
        while True:
            u = self.below(t)
            if self.bernoulli_exp(u, t):
                break
        v = 0
        while self.bernoulli_exp(1, 1):
            v += 1
        return (u + t * v) // s

    def discrete_laplace(self, scale: Fraction) -> int:
        """Exact discrete Laplace, P(z) proportional to exp(-|z| / scale), as a difference of
        two independent geometrics."""
        t, s = scale.numerator, scale.denominator
        return self.geometric(t, s) - self.geometric(t, s)

    def discrete_gaussian(self, sigma2: Fraction) -> int:
        """Exact discrete Gaussian N_Z(0, sigma2): P(z) proportional to exp(-z^2 / (2 sigma2)).

        [Canonne2020] Alg. 3: propose y from a discrete Laplace of integer scale
        t = floor(sigma) + 1 (drawn as a random sign times a geometric, rejecting the negative zero)
        and accept with probability exp(-(|y| - sigma2 / t)^2 / (2 sigma2)), all in integer
        arithmetic.
        """
        a, b = sigma2.numerator, sigma2.denominator
        t = _isqrt_fraction(sigma2) + 1
        accept_den = 2 * a * b * t * t
        while True:
            magnitude = self.geometric(t)
            negative = self.bits(1) == 1
            if negative and magnitude == 0:
                continue
            # (|y| - a/(b t))^2 / (2 a / b) = (|y| b t - a)^2 / (2 a b t^2)
            if self.bernoulli_exp((magnitude * b * t - a) ** 2, accept_den):
                return -magnitude if negative else magnitude


def _isqrt_fraction(value: Fraction) -> int:
    """floor(sqrt(value)) for a non-negative rational, exactly."""
    root = math.isqrt(value.numerator // value.denominator)
    while (root + 1) ** 2 * value.denominator <= value.numerator:
        root += 1
    return root


SYSTEM_RANDOM = SecureRandom()
