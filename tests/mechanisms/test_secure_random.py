"""Statistical and structural tests of the on-device CSPRNG samplers (secure_random.py).

``SecureRandom`` reads ``os.urandom`` and cannot be seeded, so every statistical check uses a
cutoff whose false-failure probability is at most ~1e-7 per test: chi-square p-values must exceed
``P_MIN = 1e-7`` (with at least 50 expected draws per bin so the chi-square approximation holds
that far into the tail) and binomial z-scores must satisfy ``|z| < 5.5`` (two-sided 3.8e-8).
The reference laws are computed here from their definitions (brute-force normalised weights),
not from the code under test.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from client.mechanisms.secure_random import SYSTEM_RANDOM, SecureRandom

P_MIN = 1e-7
Z_MAX = 5.5
MIN_EXPECTED = 50


@pytest.fixture
def source() -> SecureRandom:
    return SecureRandom()


def draw(sampler: Callable[[], int], n: int) -> np.ndarray:
    return np.fromiter((sampler() for _ in range(n)), dtype=np.int64, count=n)


def assert_rate(successes: int, n: int, p: float) -> None:
    """Binomial z-test of ``successes`` out of ``n`` against probability ``p``."""
    if p in (0.0, 1.0):
        assert successes == n * p
        return
    z = (successes - n * p) / math.sqrt(n * p * (1 - p))
    assert abs(z) < Z_MAX, f"rate {successes / n:.5f} vs {p:.5f} (z = {z:.2f})"


def gof_pvalue(
    samples: np.ndarray, log_weight: Callable[[np.ndarray], np.ndarray], support
) -> float:
    """Pearson chi-square p-value of integer ``samples`` against the law P(z) ~ exp(log_weight(z))
    on ``support`` (a range wide enough that the mass outside it is negligible).

    Neighbouring values are merged into bins holding at least MIN_EXPECTED expected draws; the two
    end bins absorb the tails (samples are clipped to the support).
    """
    z = np.arange(support.start, support.stop)
    logw = log_weight(z.astype(np.float64))
    prob = np.exp(logw - logw.max())
    prob /= math.fsum(prob)
    expected = prob * samples.size
    observed = np.bincount(np.clip(samples, z[0], z[-1]) - z[0], minlength=z.size)
    bins_e, bins_o, acc_e, acc_o = [], [], 0.0, 0
    for e, o in zip(expected, observed, strict=True):
        acc_e, acc_o = acc_e + e, acc_o + o
        if acc_e >= MIN_EXPECTED:
            bins_e.append(acc_e)
            bins_o.append(acc_o)
            acc_e, acc_o = 0.0, 0
    bins_e[-1] += acc_e  # the right tail joins the last full bin
    bins_o[-1] += acc_o
    assert len(bins_e) >= 2, "not enough bins for a goodness-of-fit test"
    return float(stats.chisquare(bins_o, bins_e).pvalue)


def geometric_logw(t: int, s: int):
    return lambda y: np.where(y >= 0, -y * s / t, -np.inf)


def laplace_logw(scale: Fraction):
    return lambda z: -np.abs(z) / float(scale)


def gaussian_logw(sigma2: Fraction):
    return lambda z: -(z**2) / (2 * float(sigma2))


def test_gof_helper_accepts_the_right_law_and_rejects_a_close_wrong_one():
    """The helper has power: numpy draws of a discrete Laplace of scale 3/2 pass against scale
    3/2 and fail against scale 1.65 (seeded, so deterministic)."""
    rng = np.random.default_rng(20240601)
    r = math.exp(-1 / 1.5)
    samples = rng.geometric(1 - r, 15_000) - rng.geometric(1 - r, 15_000)
    support = range(-60, 61)
    assert gof_pvalue(samples, laplace_logw(Fraction(3, 2)), support) > P_MIN
    assert gof_pvalue(samples, laplace_logw(Fraction(165, 100)), support) < P_MIN


# --- raw bytes and bits ---------------------------------------------------------------------------


@pytest.mark.parametrize("count", [0, 1, 32, 4096, 4097, 10_000])
def test_bytes_length_and_freshness(source, count):
    first, second = source.bytes(count), source.bytes(count)
    assert isinstance(first, bytes)
    assert len(first) == len(second) == count
    if count >= 16:  # a repeat of >= 128 random bits is impossible in practice
        assert first != second


def test_bytes_are_never_handed_out_twice_across_threads(source):
    chunks: list[bytes] = []
    lock = threading.Lock()

    def work() -> None:
        local = [source.bytes(16) for _ in range(2000)]
        with lock:
            chunks.extend(local)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # interleave the threads as much as possible
    try:
        threads = [threading.Thread(target=work) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(old)
    assert len(chunks) == 16_000
    assert len(set(chunks)) == len(chunks)


@pytest.mark.parametrize("nbits", [3, 13, 67])
def test_bits_top_and_bottom_are_uniform(source, nbits):
    """Both the highest and the lowest three bits of bits(nbits) are uniform on 0..7, so the
    value covers the whole range [0, 2**nbits) (no misplaced shift)."""
    values = [source.bits(nbits) for _ in range(16_000)]
    assert all(0 <= v < 2**nbits for v in values)
    top = np.array([v >> (nbits - 3) for v in values])
    low = np.array([v & 7 for v in values])
    for part in (top, low):
        assert stats.chisquare(np.bincount(part, minlength=8)).pvalue > P_MIN


def test_below_is_uniform(source):
    values = draw(lambda: source.below(7), 60_000)
    assert values.min() == 0 and values.max() == 6
    assert stats.chisquare(np.bincount(values, minlength=7)).pvalue > P_MIN


def test_below_large_non_power_of_two_is_uniform(source):
    """below(3 * 2**64) (the randomized-response keep draw for k = 3): the high part
    value // 2**64 is uniform on 0..2 and so is value % 5 (no modulo or truncation bias)."""
    upper = 3 * 2**64
    values = [source.below(upper) for _ in range(30_000)]
    assert all(0 <= v < upper for v in values)
    high = np.array([v >> 64 for v in values])
    assert stats.chisquare(np.bincount(high, minlength=3)).pvalue > P_MIN
    mod5 = np.array([v % 5 for v in values])
    assert stats.chisquare(np.bincount(mod5, minlength=5)).pvalue > P_MIN


def test_below_edge_cases(source):
    assert all(source.below(1) == 0 for _ in range(100))
    assert {source.below(2) for _ in range(200)} == {0, 1}
    for bad in (0, -1, -(2**70)):
        with pytest.raises(ValueError):
            source.below(bad)


# --- Bernoulli samplers ---------------------------------------------------------------------------


@pytest.mark.parametrize(("num", "den"), [(0, 5), (5, 5), (1, 3), (2, 7), (9, 10)])
def test_bernoulli_rate(source, num, den):
    n = 20_000
    hits = sum(source.bernoulli(num, den) for _ in range(n))
    assert_rate(hits, n, num / den)


@pytest.mark.parametrize(("num", "den"), [(0, 1), (3, 10), (1, 1), (5, 2), (7, 3)])
def test_bernoulli_exp_rate(source, num, den):
    """P(True) = exp(-gamma) for gamma = 0, 0.3, 1, 2.5, 7/3 (the last two loop over whole
    units, 7/3 leaving a remainder)."""
    n = 20_000
    hits = sum(source.bernoulli_exp(num, den) for _ in range(n))
    assert_rate(hits, n, math.exp(-num / den))


# --- integer laws ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("t", "s"), [(1, 1), (3, 1), (5, 2), (2, 7)])
def test_geometric_pmf(source, t, s):
    """P(y) = (1 - r) r^y on y >= 0 with r = exp(-s / t)."""
    samples = draw(lambda: source.geometric(t, s), 15_000)
    assert samples.min() >= 0
    support = range(0, 40 * t // s + 10)
    assert gof_pvalue(samples, geometric_logw(t, s), support) > P_MIN


@pytest.mark.slow
@pytest.mark.parametrize("scale", [Fraction(1, 3), Fraction(3, 2), Fraction(5)])
def test_discrete_laplace_pmf(source, scale):
    """P(z) proportional to exp(-|z| / scale) on the integers."""
    samples = draw(lambda: source.discrete_laplace(scale), 15_000)
    width = math.ceil(40 * scale) + 10
    assert gof_pvalue(samples, laplace_logw(scale), range(-width, width + 1)) > P_MIN


@pytest.mark.slow
@pytest.mark.parametrize("sigma2", [Fraction(1, 4), Fraction(2), Fraction(50)])
def test_discrete_gaussian_pmf(source, sigma2):
    """P(z) proportional to exp(-z^2 / (2 sigma2)) on the integers."""
    samples = draw(lambda: source.discrete_gaussian(sigma2), 15_000)
    width = math.ceil(12 * math.sqrt(sigma2)) + 10
    assert gof_pvalue(samples, gaussian_logw(sigma2), range(-width, width + 1)) > P_MIN


def test_discrete_gaussian_of_tiny_variance_is_almost_always_zero(source):
    """sigma2 = 1/100: P(z != 0) = 2 e^-50 / (1 + ...) ~ 4e-22, so 2,000 draws are all zero."""
    assert all(source.discrete_gaussian(Fraction(1, 100)) == 0 for _ in range(2000))


# --- fork safety ----------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
@pytest.mark.parametrize("shared", ["fresh", "system"])
def test_buffer_is_not_shared_across_fork(shared):
    """After fork, parent and child must not hand out the same buffered bytes: without the
    pid check both would return the next 32 bytes of the inherited buffer."""
    source = SecureRandom() if shared == "fresh" else SYSTEM_RANDOM
    source.bytes(1)  # make sure a buffer with unread bytes exists before forking
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        status = 1
        try:
            os.close(read_fd)
            os.write(write_fd, source.bytes(32) + source.bytes(32))
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    parent = [source.bytes(32), source.bytes(32)]
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    _, wait_status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0
    assert len(data) == 64
    child = [data[:32], data[32:]]
    assert parent[0] != child[0]
    assert parent[1] != child[1]
    assert len({*parent, *child}) == 4
