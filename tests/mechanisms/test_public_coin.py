"""RAPTOR-style public-coin one-bit reports (issue 17): validation, privacy cost, the public
subsets (re-derived here from docs/wire.md §3.9 alone), the secure randomizer against the
per-group channel, encodings, and the exact sampler of the group aggregates a grouped test reads."""

from __future__ import annotations

import hashlib
import math
import struct

import numpy as np
import pytest
from scipy import stats

from client.mechanisms import PublicCoinBit, ReportRangeError
from client.mechanisms.secure_random import SYSTEM_RANDOM


@pytest.mark.parametrize(
    "k, epsilon, seed, groups",
    [
        (1, 1.0, 0, 2),
        (4, 0.0, 0, 2),
        (4, 1.0, -1, 2),
        (4, 1.0, 2**64, 2),
        (4, 1.0, 0, 0),
        (4, 1.0, 0, 2**16 + 1),
        (4, 1.0, True, 2),
        (4, 1.0, 0, 2.0),
    ],
)
def test_bad_parameters_are_refused(k, epsilon, seed, groups) -> None:
    with pytest.raises(ValueError):
        PublicCoinBit(k, epsilon, public_seed=seed, groups=groups)


@pytest.mark.parametrize("epsilon", [0.01, 1.0, 8.0])
def test_cost_is_pure_epsilon_and_never_exceeded(epsilon: float) -> None:
    mech = PublicCoinBit(9, epsilon, public_seed=1, groups=4)
    assert mech.cost.kind == "pure" and mech.cost.epsilon == epsilon
    assert 0 <= mech.realized_epsilon <= epsilon
    assert mech.realized_epsilon == pytest.approx(epsilon, rel=1e-6)


def independent_subsets(k: int, seed: int, groups: int) -> list[set[int]]:
    """docs/wire.md §3.9, written without the project's code."""
    out = []
    for group in range(groups):
        keys = []
        for j in range(k):
            data = b"ldp-survey/raptor/v1" + seed.to_bytes(8, "little")
            data += group.to_bytes(4, "little") + j.to_bytes(4, "little")
            keys.append((int.from_bytes(hashlib.sha256(data).digest()[:8], "little"), j))
        out.append({j for _, j in sorted(keys)[: k // 2]})
    return out


@pytest.mark.parametrize("k, seed, groups", [(2, 0, 1), (7, 99, 5), (64, 2**64 - 1, 12)])
def test_public_subsets_are_the_documented_construction(k: int, seed: int, groups: int) -> None:
    mech = PublicCoinBit(k, 1.0, public_seed=seed, groups=groups)
    masks = mech.subset_masks
    assert masks.shape == (groups, k) and (masks.sum(axis=1) == k // 2).all()
    assert [set(np.flatnonzero(m).tolist()) for m in masks] == independent_subsets(k, seed, groups)
    assert not np.array_equal(masks, PublicCoinBit(k, 1.0, seed ^ 1, groups).subset_masks) or k == 2
    with pytest.raises(ValueError):
        masks[0, 0] = not masks[0, 0]  # read-only: the public subsets cannot drift


def test_secure_randomize_follows_the_per_group_channel() -> None:
    """Per group, the share of 1s from the real secure randomizer is mu_l = (1 - rho) +
    (2 rho - 1) 1{x in S_l} for a fixed answer x; groups are uniform. The secure source cannot
    be seeded, so the bands are 1 - 1e-7 (a false alarm once in ten million runs; at 1e-4 CI
    met one): a wrong channel still falls outside them by far at 8,000 reports."""
    mech = PublicCoinBit(6, 1.0, public_seed=3, groups=4)
    trials = 8000
    reports = np.array([mech.randomize(2, SYSTEM_RANDOM) for _ in range(trials)])
    sums, sizes = mech.group_statistics(reports)
    assert stats.chisquare(sizes).pvalue > 1e-7
    expected = mech.bit_probabilities(np.eye(6)[2])
    for s, n, mu in zip(sums, sizes, expected, strict=True):
        low, high = stats.binom.interval(1 - 1e-7 / 4, n, mu)
        assert low <= s <= high, (s, n, mu)


def test_encode_decode_and_malformed_payloads() -> None:
    mech = PublicCoinBit(10, 1.0, public_seed=5, groups=3)
    for report in (mech.randomize(x) for x in range(10)):
        payload = mech.encode(report)
        assert len(payload) == mech.payload_size
        np.testing.assert_array_equal(mech.decode(payload), report)
    assert mech.encode(np.array([2, 1])) == struct.pack("<I", 5)
    with pytest.raises(ReportRangeError):
        mech.decode(struct.pack("<I", 6))  # group 3 of 3
    with pytest.raises(ValueError):
        mech.decode(b"\x00")
    with pytest.raises(ValueError):
        mech.encode(np.array([0, 2]))


def test_exact_group_sampler_matches_simulation() -> None:
    """simulate_groups (binomials per group) and per-report simulate give the same law of the
    aggregates: means and variances of the bit sums agree within sampling error."""
    mech = PublicCoinBit(8, 1.0, public_seed=11, groups=5)
    rng = np.random.default_rng(4)
    p = rng.dirichlet(np.ones(8))
    n, reps = 400, 3000
    sums, sizes = mech.simulate_groups(n, p, rng, size=reps)
    assert (sizes.sum(axis=1) == n).all() and sums.shape == (reps, 5)
    direct = np.array(
        [
            mech.group_statistics(mech.simulate(rng.choice(8, size=n, p=p), rng))[0]
            for _ in range(reps)
        ]
    )
    se = np.sqrt((sums.var(axis=0) + direct.var(axis=0)) / reps)
    assert (np.abs(sums.mean(axis=0) - direct.mean(axis=0)) < 5 * se).all()
    mu = mech.bit_probabilities(p)
    assert np.allclose(sums.mean(axis=0), n / 5 * mu, atol=5 * math.sqrt(n) / reps**0.5)
