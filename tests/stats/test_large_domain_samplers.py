"""Issue 17 item 6: the aggregate samplers behind the Monte Carlo nulls of subset selection and
local hashing at large k are exact (subset selection's class sampler against the enumerated law
of a few reports and against per-report simulation; local hashing's incremental support sums
against the hash polynomials), and a fast subset of the large-k validation rows."""

from __future__ import annotations

import itertools
from math import comb

import numpy as np
import pytest
from scipy import stats

from aggregator.histogram import Histogram
from aggregator.stats import goodness_of_fit
from aggregator.stats.identity import u_statistic
from aggregator.stats.studies import zipf
from client.mechanisms import LocalHashing, SubsetSelection
from client.mechanisms.local_hashing import PRIME, hash_values, support_sums

ALPHA = 0.05


def subset_law(mech: SubsetSelection, p: np.ndarray, n: int) -> dict[tuple[int, ...], float]:
    """The exact law of the support counts of n reports (enumerating every d-subset)."""
    k, d, a = mech.k, mech.subset_size, mech.in_probability
    one: dict[tuple[int, ...], float] = {}
    for subset in itertools.combinations(range(k), d):
        inside, outside = a / comb(k - 1, d - 1), (1 - a) / comb(k - 1, d)
        chance = sum(p[x] * (inside if x in subset else outside) for x in range(k))
        one[tuple(int(j in subset) for j in range(k))] = chance
    law = {(0,) * k: 1.0}
    for _ in range(n):
        law_next: dict[tuple[int, ...], float] = {}
        for counts, chance in law.items():
            for bits, more in one.items():
                key = tuple(c + b for c, b in zip(counts, bits, strict=True))
                law_next[key] = law_next.get(key, 0.0) + chance * more
        law = law_next
    return law


def pooled_chisquare(observed: np.ndarray, expected: np.ndarray) -> float:
    """Pearson p-value with every cell expected below 5 pooled into one."""
    small = expected < 5
    obs = np.r_[observed[~small], observed[small].sum()]
    exp = np.r_[expected[~small], expected[small].sum()]
    keep = exp > 0
    return float(stats.chisquare(obs[keep], exp[keep]).pvalue)


@pytest.mark.parametrize(
    ("k", "epsilon", "n", "p"),
    [
        (6, 1.0, 2, [0.3, 0.0, 0.1, 0.25, 0.05, 0.3]),
        (7, 0.3, 3, [0.05, 0.2, 0.1, 0.3, 0.05, 0.1, 0.2]),
        (5, 2.0, 4, [0.4, 0.1, 0.2, 0.3, 0.0]),
    ],
)
def test_subset_class_sampler_has_the_exact_law(k, epsilon, n, p) -> None:
    """Every possible vector of support counts of n reports, drawn 60,000 times: a chi-square
    goodness of fit against the enumerated law (zero-probability answers included)."""
    mech, p = SubsetSelection(k, epsilon), np.array(p)
    law = subset_law(mech, p, n)
    draws = mech.simulate_histogram(n, p, np.random.default_rng(k), size=60_000).astype(int)
    index = {key: i for i, key in enumerate(law)}
    cells = np.array([index[tuple(v)] for v in draws.tolist()])  # KeyError: impossible vector
    observed = np.bincount(cells, minlength=len(law))
    expected = np.array(list(law.values())) * draws.shape[0]
    assert pooled_chisquare(observed, expected) > 1e-3


def test_subset_class_sampler_matches_per_report_simulation() -> None:
    """At k = 12, n = 300 (Zipf answers): chi-square homogeneity of the class sampler's and the
    per-report simulation's law of one support count and of the T2 statistic (deciles)."""
    mech, n, size = SubsetSelection(12, 1.0), 300, 4000
    p = zipf(12)
    rng = np.random.default_rng(7)
    fast = mech.simulate_histogram(n, p, rng, size=size)
    slow = np.array(
        [mech.simulate(rng.choice(12, size=n, p=p), rng).sum(axis=0) for _ in range(size)]
    )
    q0 = mech.report_mean(p)
    for fast_values, slow_values in (
        (fast[:, 0], slow[:, 0]),
        (u_statistic(fast, n, q0), u_statistic(slow, n, q0)),
    ):
        edges = np.quantile(np.r_[fast_values, slow_values], np.linspace(0, 1, 11)[1:-1])
        bins = (np.searchsorted(edges, v) for v in (fast_values, slow_values))
        table = [np.bincount(b, minlength=10) for b in bins]
        assert stats.chi2_contingency(np.array(table)).pvalue > 1e-3


def test_local_hashing_support_sums_equal_the_hash_polynomials() -> None:
    """The incremental sums equal the support counts of ``hash_values`` bit for bit, for g a
    power of two and not, extreme coefficients included."""
    rng = np.random.default_rng(3)
    for k, epsilon in ((50, 1.0), (300, 3.0), (700, 0.5)):
        g = LocalHashing(k, epsilon).buckets
        coefficients = rng.integers(0, PRIME, size=(600, 3), dtype=np.uint64)
        coefficients[0] = PRIME - 1
        coefficients[1] = 0
        reported = rng.integers(0, g, size=600)
        support = hash_values(coefficients, np.arange(k), g) == reported[:, None]
        expected = support.reshape(3, 200, k).sum(axis=1)
        np.testing.assert_array_equal(support_sums(coefficients, reported, k, g, 3), expected)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mech", "method", "calibration"),
    [
        (SubsetSelection(1024, 1.0), "pearson", "auto"),
        (SubsetSelection(1024, 1.0), "t2", "asymptotic"),
        (LocalHashing(1024, 1.0), "t2", "asymptotic"),
    ],
    ids=["ss pearson", "ss t2", "olh t2"],
)
def test_large_k_level(mech, method, calibration) -> None:
    """k = 1,024, Zipf null, n = 2,000: 150 null studies from the exact samplers, rejections in
    the 99.9% binomial band (the full grid is scripts/validate_large_domain.py and
    scripts/validate_tests.py --identity)."""
    p0, n, trials = zipf(1024), 2000, 150
    nulls = mech.simulate_histogram(n, p0, np.random.default_rng(11), size=trials)
    rejections = sum(
        goodness_of_fit(
            Histogram(mech, n, values), p0, ALPHA, method, calibration=calibration
        ).reject
        for values in nulls
    )
    low, high = stats.binom.interval(0.999, trials, ALPHA)
    assert low <= rejections <= high, rejections / trials
