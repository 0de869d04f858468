"""Poisoning bounded: additive-noise reports are accepted only within a range an honest report
leaves with probability at most 2^-40 (from the exact discrete noise tails), which bounds what one
report, and a fraction f of malicious devices, can move an estimate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aggregator.histogram import Histogram
from aggregator.service.status import status_of
from aggregator.stats import estimate
from aggregator.store import ingest
from aggregator.store.checks import ReportRejectedError
from client.mechanisms import GaussianNoise, LaplaceNoise
from client.mechanisms.additive import HONEST_REJECTION
from client.survey import Attribute, build_question

MECHANISMS = [
    LaplaceNoise(4, epsilon=2.0),
    LaplaceNoise(4, epsilon=0.5),
    LaplaceNoise(16, epsilon=1.0, granularity_bits=4),
    GaussianNoise(4, rho=0.5),
    GaussianNoise(8, rho=2.0, granularity_bits=6),
    GaussianNoise(3, rho=0.1, granularity_bits=0),
]


@pytest.mark.parametrize("mech", MECHANISMS, ids=repr)
def test_the_bound_is_the_smallest_with_negligible_honest_rejection(mech):
    noise = mech.accepted_bound - mech.scale
    assert mech.k * mech.noise_tail(noise) <= HONEST_REJECTION
    assert mech.k * mech.noise_tail(noise - 1) > HONEST_REJECTION
    assert mech.accepted_bound < mech.scale + mech.noise_bound  # tighter than decoding


def exact_tail(pmf, bound: int, reach: int) -> float:
    """P(|Z| > bound) summed from the probability mass function over |z| <= reach."""
    z = np.arange(-reach, reach + 1)
    p = pmf(z)
    p /= p.sum()
    return float(p[np.abs(z) > bound].sum())


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_laplace_tail_is_exact(epsilon):
    mech = LaplaceNoise(2, epsilon=epsilon, granularity_bits=0)
    s = 2 / epsilon
    for bound in (0, 3, 10):
        exact = exact_tail(lambda z: np.exp(-np.abs(z) / s), bound, 4000)
        assert mech.noise_tail(bound) == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize("rho", [0.05, 0.5, 4.0])
def test_gaussian_tail_bounds_the_exact_discrete_tail(rho):
    mech = GaussianNoise(2, rho=rho, granularity_bits=0)
    sigma2 = 1 / rho
    for bound in (0, 1, 3, 8):
        exact = exact_tail(lambda z: np.exp(-(z.astype(float) ** 2) / (2 * sigma2)), bound, 400)
        assert exact <= mech.noise_tail(bound), (bound, exact)


def question_of(mech):
    attribute = Attribute("x", tuple(f"c{i}" for i in range(mech.k)))
    return build_question("q", "", [attribute], mech.name, mech.parameter, mech.granularity_bits)


@pytest.mark.parametrize("mech", MECHANISMS[:1] + MECHANISMS[3:4], ids=repr)
def test_reports_past_the_bound_are_out_of_range(mech):
    question = question_of(mech)
    limit = question.mechanism.accepted_bound
    edge = np.zeros(mech.k, dtype=np.int64)
    edge[0], edge[-1] = limit, -limit
    assert ingest.contribution(question, mech.encode(edge)).tolist() == edge.tolist()
    for sign in (1, -1):
        beyond = edge.copy()
        beyond[1] = sign * (limit + 1)
        with pytest.raises(ReportRejectedError) as error:
            ingest.contribution(question, mech.encode(beyond))
        assert status_of(error.value.reason).name == "OUT_OF_RANGE"
        packed = np.frombuffer(mech.encode(beyond), dtype=np.uint8).reshape(1, -1)
        with pytest.raises(ReportRejectedError):
            ingest.decode_payloads(question, packed)


def test_what_a_fraction_of_malicious_devices_can_shift():
    """n honest reports with p = 0.2 on category 0, then a fraction f of reports at the bound
    pushing category 0: the estimate moves by f * (w - p) at most, w = bound / g (the weight of
    one report, docs/threat-model.md), and by about that much."""
    mech = LaplaceNoise(4, epsilon=2.0)
    rng = np.random.default_rng(7)
    n, f = 20_000, 0.005
    p = np.array([0.2, 0.3, 0.3, 0.2])
    honest = mech.simulate(rng.choice(4, size=n, p=p), rng)
    bad = np.zeros((int(f * n), 4), dtype=np.int64)
    bad[:, 0] = mech.accepted_bound
    before = estimate(Histogram(mech, n, mech.aggregate(honest))).frequencies[0]
    mixed = np.vstack([honest, bad])
    after = estimate(Histogram(mech, len(mixed), mech.aggregate(mixed))).frequencies[0]
    weight = mech.accepted_bound / mech.scale
    shift = after - before
    assert shift <= f * weight + 1e-9
    assert shift == pytest.approx(f / (1 + f) * (weight - before), rel=0.01)
    assert math.isclose(weight, 30.1123046875)  # the figure docs/threat-model.md gives
