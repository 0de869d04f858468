"""Privacy audits of every mechanism (issue 4, item 6), through the real secure randomize path.

* An empirical lower bound on epsilon (scripts/privacy_audit.py, LDP-Auditor style) never exceeds
  the claimed epsilon, and deliberately broken randomizers written here are caught by it.
* Every output coordinate is randomized: each flip-components bit flips with the claimed
  probability, each additive-noise coordinate carries noise of the claimed variance.
* The encoded report length never depends on the answer.
* The device ledger refuses the report that would overspend whatever the answer, and a refusal
  leaves nothing in the outbox.

Randomness comes from a seeded byte stream fed to the real samplers (``SeededSource``), so every
statistical check here is deterministic; the checks use 99.9% bands or stricter.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ServerThread
from scipy import stats

from client.device.ledger import Budget, BudgetExceeded
from client.device.repeats import AnsweredBefore
from client.device.reporter import Reporter
from client.device.transport import Transport
from client.mechanisms import (
    FlipComponents,
    GaussianNoise,
    HadamardResponse,
    LaplaceNoise,
    LocalHashing,
    Mechanism,
    OptimizedUnaryEncoding,
    PublicCoinBit,
    RandomizedResponse,
    SubsetSelection,
)
from client.mechanisms.local_hashing import hash_coefficients, hash_values_at
from client.mechanisms.secure_random import SYSTEM_RANDOM, SecureRandom
from protos.ldp.v1 import ldp_pb2

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "privacy_audit.py"
_spec = importlib.util.spec_from_file_location("privacy_audit", SCRIPT)
auditor = sys.modules["privacy_audit"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(auditor)

TRIALS, ADDITIVE_TRIALS, PILOT = 20000, 8000, 1500


# --- empirical epsilon ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def honest_results():
    return auditor.honest_audits(TRIALS, ADDITIVE_TRIALS, PILOT)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(9))
def test_audit_stays_within_the_claim(honest_results, index: int) -> None:
    result = honest_results[index]
    assert result.passed, f"{result.name}: eps_lower {result.eps_lower:.3f} > {result.claimed:.3f}"
    # The audit is sharp enough to mean something: pure mechanisms get close to their claim.
    floor = 1.0 if result.delta else 0.75 * result.claimed
    assert result.eps_lower > floor, result


def leaky_response(mech: RandomizedResponse):
    """Randomized response that sends the true answer unrandomized one time in five."""

    def randomize(value: int, source: SecureRandom) -> int:
        return value if source.below(5) == 0 else mech.randomize(value, source)

    return randomize


def unflipped_last_bit(mech: FlipComponents):
    """Unary encoding whose last bit is never flipped (the bit is the plain answer)."""

    def randomize(value: int, source: SecureRandom) -> np.ndarray:
        bits = mech.randomize(value, source)
        bits[-1] = int(value == mech.k - 1)
        return bits

    return randomize


def unnoised_last_coordinate(mech: GaussianNoise | LaplaceNoise):
    """Additive noise that forgets the last coordinate."""

    def randomize(value: int, source: SecureRandom) -> np.ndarray:
        report = mech.randomize(value, source)
        report[-1] = mech.scale * int(value == mech.k - 1)
        return report

    return randomize


def miscalibrated(mech: FlipComponents):
    """Flip probability computed for twice the claimed epsilon."""
    return FlipComponents(mech.k, 2 * mech.epsilon).randomize


def plain_answer_bit(mech: OptimizedUnaryEncoding):
    """Optimized unary encoding whose answer bit is always 1 (never randomized)."""

    def randomize(value: int, source: SecureRandom) -> np.ndarray:
        bits = mech.randomize(value, source)
        bits[value] = 1
        return bits

    return randomize


def hadamard_leaky_set(mech: HadamardResponse):
    """Hadamard response that moves half of its reports outside the answer's set back in."""

    def randomize(value: int, source: SecureRandom) -> int:
        column = mech.randomize(value, source)
        if source.below(2) == 0 and ((value + 1) & column).bit_count() % 2:
            column ^= (value + 1) & -(value + 1)
        return column

    return randomize


RR, FC = RandomizedResponse(4, 1.0), FlipComponents(4, 1.0)
OUE, HR = OptimizedUnaryEncoding(4, 1.0), HadamardResponse(4, 1.0)
SS, OLH = SubsetSelection(4, 1.0), LocalHashing(4, 1.0)
COIN = PublicCoinBit(4, 1.0, public_seed=7, groups=3)


def coin_truthful_sometimes(mech: PublicCoinBit):
    """Public-coin bit that sends the true membership bit unflipped one time in three."""

    def randomize(value: int, source: SecureRandom) -> np.ndarray:
        report = mech.randomize(value, source)
        if source.below(3) == 0:
            report[1] = int(mech.subset_masks[report[0], value])
        return report

    return randomize


def hashing_leaks_sometimes(mech: LocalHashing):
    """Local hashing that sends the plain hashed answer one time in three."""

    def randomize(value: int, source: SecureRandom) -> np.ndarray:
        report = mech.randomize(value, source)
        if source.below(3) == 0:
            coefficients = hash_coefficients(report[:1])
            report[1] = hash_values_at(coefficients, [value], mech.buckets)[0]
        return report

    return randomize


def subset_answer_always_in(mech: SubsetSelection):
    """Subset selection that always puts the answer in the set."""

    def randomize(value: int, source: SecureRandom) -> np.ndarray:
        bits = mech.randomize(value, source)
        if not bits[value]:
            bits[np.flatnonzero(bits)[0]] = 0
            bits[value] = 1
        return bits

    return randomize


def hashing_inner_for(mech: LocalHashing, epsilon: float):
    """Local hashing whose randomized response on [g] is built for another epsilon."""
    inner = RandomizedResponse(mech.buckets, epsilon)

    def randomize(value: int, source: SecureRandom) -> np.ndarray:
        report = mech.randomize(value, source)
        hashed = hash_values_at(hash_coefficients(report[:1]), [value], mech.buckets)[0]
        report[1] = inner.randomize(int(hashed), source)
        return report

    return randomize


LAP, GAUSS = LaplaceNoise(3, 1.0), GaussianNoise(3, 0.5)
GAUSS_EPSILON = auditor.zcdp_epsilon(GAUSS.rho, auditor.DELTA)
BROKEN = {
    "leaky randomized response": (RR, RR.epsilon, leaky_response(RR), TRIALS, 0.0),
    "unflipped last bit": (FC, FC.epsilon, unflipped_last_bit(FC), TRIALS, 0.0),
    "flip for 2 epsilon": (FC, FC.epsilon, miscalibrated(FC), TRIALS, 0.0),
    "unary, plain answer bit": (OUE, OUE.epsilon, plain_answer_bit(OUE), TRIALS, 0.0),
    "unary for 2 epsilon": (OUE, OUE.epsilon, OptimizedUnaryEncoding(4, 2.0).randomize, TRIALS, 0),
    "hadamard, leaky set": (HR, HR.epsilon, hadamard_leaky_set(HR), TRIALS, 0.0),
    "hadamard for 2 epsilon": (HR, HR.epsilon, HadamardResponse(4, 2.0).randomize, TRIALS, 0),
    "subset, answer always in": (SS, SS.epsilon, subset_answer_always_in(SS), TRIALS, 0.0),
    "subset for 3 epsilon": (SS, SS.epsilon, SubsetSelection(4, 3.0).randomize, TRIALS, 0.0),
    "hashing, plain value 1 in 3": (OLH, OLH.epsilon, hashing_leaks_sometimes(OLH), TRIALS, 0.0),
    "hashing for 3 epsilon": (OLH, OLH.epsilon, hashing_inner_for(OLH, 3.0), TRIALS, 0.0),
    "coin, true bit 1 in 3": (COIN, COIN.epsilon, coin_truthful_sometimes(COIN), TRIALS, 0.0),
    "coin for 3 epsilon": (
        COIN,
        COIN.epsilon,
        PublicCoinBit(4, 3.0, public_seed=7, groups=3).randomize,
        TRIALS,
        0.0,
    ),
    "laplace, last coordinate unnoised": (
        LAP,
        LAP.epsilon,
        unnoised_last_coordinate(LAP),
        ADDITIVE_TRIALS,
        0.0,
    ),
    "gaussian, last coordinate unnoised": (
        GAUSS,
        GAUSS_EPSILON,
        unnoised_last_coordinate(GAUSS),
        ADDITIVE_TRIALS,
        auditor.DELTA,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_audit_catches_a_broken_randomizer(name: str) -> None:
    mech, claimed, randomize, trials, delta = BROKEN[name]
    result = auditor.audit(
        name, mech, claimed, randomize=randomize, trials=trials, pilot=PILOT, seed=11, delta=delta
    )
    assert not result.passed, f"{name} passed the audit: {result}"


def test_clopper_pearson_matches_its_definition() -> None:
    low, high = auditor.clopper_pearson(30, 100, 0.95)
    assert stats.binom.sf(29, 100, low) == pytest.approx(0.025, rel=1e-6)
    assert stats.binom.cdf(30, 100, high) == pytest.approx(0.025, rel=1e-6)
    assert auditor.clopper_pearson(0, 50, 0.99)[0] == 0.0
    assert auditor.clopper_pearson(50, 50, 0.99)[1] == 1.0


# --- every output coordinate is randomized ---------------------------------------------------


def flip_counts(mech: FlipComponents, randomize, trials: int, seed: int) -> np.ndarray:
    """flips[x, i]: how often bit i differed from the one-hot answer x, over ``trials`` each."""
    source = auditor.SeededSource(seed)
    flips = np.zeros((mech.k, mech.k), dtype=np.int64)
    for x in range(mech.k):
        bits = auditor.sample(randomize, x, trials, source)
        flips[x] = (bits != np.eye(mech.k, dtype=np.int64)[x]).sum(axis=0)
    return flips


def within_flip_band(mech: FlipComponents, flips: np.ndarray, trials: int) -> np.ndarray:
    """Per (answer, bit): inside the Bonferroni-corrected 99.9% binomial band of Bin(n, s)?"""
    level = 1 - 0.001 / flips.size
    low, high = stats.binom.interval(level, trials, mech.flip_probability)
    return (flips >= low) & (flips <= high)


@pytest.mark.slow
@pytest.mark.parametrize("mech", [FlipComponents(9, 0.5), FlipComponents(9, 4.0)])
def test_every_bit_flips_with_the_claimed_probability(mech: FlipComponents) -> None:
    trials = 3000
    flips = flip_counts(mech, mech.randomize, trials, seed=5)
    assert within_flip_band(mech, flips, trials).all(), flips / trials
    broken = flip_counts(mech, unflipped_last_bit(mech), trials, seed=5)
    assert not within_flip_band(mech, broken, trials)[:, -1].any()


def noise_per_coordinate(mech, randomize, trials: int, seed: int) -> np.ndarray:
    """Noise (grid units) of every coordinate: reports minus the scaled one-hot answer."""
    source = auditor.SeededSource(seed)
    rows = []
    for x in range(mech.k):
        rows.append(auditor.sample(randomize, x, trials, source) - mech.scale * np.eye(mech.k)[x])
    return np.concatenate(rows)


def noise_matches(mech, noise: np.ndarray) -> np.ndarray:
    """Per coordinate: mean within 5 standard errors of 0 and variance within 20% of the claim
    (over 5 standard errors of the sample variance for these laws and sizes)."""
    claimed = mech.noise_variance * mech.scale**2
    n = noise.shape[0]
    mean_ok = np.abs(noise.mean(axis=0)) < 5 * np.sqrt(claimed / n)
    variance_ok = np.abs(noise.var(axis=0) / claimed - 1) < 0.2
    return mean_ok & variance_ok


@pytest.mark.slow
@pytest.mark.parametrize(
    "mech", [GaussianNoise(3, 0.5), GaussianNoise(3, 2.0, granularity_bits=0), LaplaceNoise(3, 1.0)]
)
def test_every_coordinate_carries_noise(mech) -> None:
    noise = noise_per_coordinate(mech, mech.randomize, 1000, seed=6)
    assert noise_matches(mech, noise).all(), noise.var(axis=0) / (
        mech.noise_variance * mech.scale**2
    )
    broken = noise_per_coordinate(mech, unnoised_last_coordinate(mech), 1000, seed=6)
    assert not noise_matches(mech, broken)[-1]


@pytest.mark.parametrize("mech", [RandomizedResponse(4, 1.0), RandomizedResponse(3, 0.2)])
def test_randomized_response_follows_its_channel(mech: RandomizedResponse) -> None:
    source = auditor.SeededSource(7)
    for x in range(mech.k):
        reports = auditor.sample(mech.randomize, x, 4000, source)[:, 0]
        expected = np.full(mech.k, mech.a0)
        expected[x] += mech.a1
        observed = np.bincount(reports, minlength=mech.k)
        assert stats.chisquare(observed, 4000 * expected).pvalue > 1e-4


# --- report length -------------------------------------------------------------------------------

LENGTH_CASES: list[Mechanism] = [
    RandomizedResponse(2, 0.1),
    RandomizedResponse(5, 50.0),
    RandomizedResponse(300, 1.0),
    FlipComponents(2, 0.5),
    FlipComponents(8, 8.0),
    FlipComponents(9, 1.0),
    FlipComponents(17, 0.01),
    OptimizedUnaryEncoding(2, 0.5),
    OptimizedUnaryEncoding(9, 8.0),
    HadamardResponse(2, 0.5),
    HadamardResponse(300, 1.0),
    SubsetSelection(2, 0.5),
    SubsetSelection(300, 1.0),
    LocalHashing(2, 0.5),
    LocalHashing(300, 4.0),
    PublicCoinBit(2, 0.5, public_seed=0, groups=1),  # type: ignore[list-item]
    PublicCoinBit(300, 1.0, public_seed=2**64 - 1, groups=20),  # type: ignore[list-item]
    GaussianNoise(2, 0.01),
    GaussianNoise(4, 10.0, granularity_bits=0),
    GaussianNoise(3, 1.0, granularity_bits=20),
    LaplaceNoise(2, 0.05),
    LaplaceNoise(4, 5.0, granularity_bits=0),
    LaplaceNoise(3, 1.0, granularity_bits=20),
]


@pytest.mark.parametrize("mech", LENGTH_CASES, ids=lambda m: m.describe())
def test_report_length_does_not_depend_on_the_answer(mech: Mechanism) -> None:
    categories = range(mech.k) if mech.k <= 20 else [0, 1, mech.k // 2, mech.k - 1]
    payloads, wire = set(), set()
    for answer in categories:
        for _ in range(3):
            payload = mech.encode(mech.randomize(answer, SYSTEM_RANDOM))
            payloads.add(len(payload))
            report = ldp_pb2.Report(
                report_id=bytes(16), survey_id="s", question_id="q", payload=payload
            )
            wire.add(report.ByteSize())
    assert payloads == {mech.payload_size}
    assert len(wire) == 1


# --- the ledger's refusals -------------------------------------------------------------------

#: One question per wave (a device answers each question once): the spending history of the
#: refusal tests is answers to earlier waves, and the decision is on the last wave.
WAVES = 4
_WAVE = """
[[survey.question]]
id = "{name}{wave}"
categories = ["a", "b", "c", "d"]
mechanism = "{mechanism}"
{parameter}
"""
WAVES_TOML = '[[survey]]\nid = "s1"\n' + "".join(
    _WAVE.format(name=name, wave=wave, mechanism=mechanism, parameter=parameter)
    for name, mechanism, parameter in (
        ("rr", "randomized_response", "epsilon = 1.0"),
        ("gauss", "gaussian", "rho = 0.5"),
    )
    for wave in range(WAVES)
)
REFUSAL_CASES = {
    # question, budget, admitted reports: pure epsilon = 1 reports against epsilon_g = 2.5, and
    # rho = 0.5 Gaussian reports against the zCDP cap 1.35 of (10, 1e-6) with no pure bucket.
    "pure": ("rr", Budget(2.5), 2),
    "zcdp": ("gauss", Budget(10.0, pointwise=0.0), 2),
}


@pytest.fixture
def waves_server(tmp_path: Path):
    config = tmp_path / "waves.toml"
    config.write_text(WAVES_TOML)
    running = ServerThread(config, tmp_path / "waves.sqlite").start()
    yield running
    running.stop()


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(REFUSAL_CASES))
def test_refusal_depends_only_on_the_ledger_state(waves_server, tmp_path: Path, case: str) -> None:
    """Devices with the same spending history decide the same for every answer (and whatever
    they answered before); the refused report leaves no charge and nothing in the outbox."""
    name, budget, admitted = REFUSAL_CASES[case]
    last = f"{name}{WAVES - 1}"
    labels = waves_server.surveys["s1"].question(last).labels
    histories = [labels[:1] * 3, list(reversed(labels))[:3]]
    with Transport(waves_server.target) as transport:
        for spent in range(admitted + 2):
            decisions = set()
            for h, history in enumerate(histories):
                for answer in labels:
                    path = tmp_path / f"{spent}-{h}-{answer}.sqlite"
                    device = Reporter(transport, path, budget)
                    try:
                        for wave, past in enumerate(history[:spent]):
                            with contextlib.suppress(BudgetExceeded):
                                device.answer("s1", f"{name}{wave}", past)
                        decisions.add(answer_or_refuse(device, last, answer))
                    finally:
                        device.close()
            assert decisions == {spent < admitted}, (spent, decisions)


def answer_or_refuse(device: Reporter, question_id: str, answer: str) -> bool:
    """Answer; on a refusal check that nothing was charged or queued. True if admitted."""
    charges, queued = len(device.ledger.charges()), len(device.outbox)
    try:
        device.answer("s1", question_id, answer)
    except BudgetExceeded:
        assert (len(device.ledger.charges()), len(device.outbox)) == (charges, queued)
        return False
    assert (len(device.ledger.charges()), len(device.outbox)) == (charges + 1, queued + 1)
    return True


def test_repeated_question_refusal_does_not_depend_on_the_answer(server, tmp_path: Path) -> None:
    """The default device refuses a second answer to a question whatever it is (changed or not),
    charging and queueing nothing: the server never receives a second report."""
    with Transport(server.target) as transport:
        for answer in ("a", "b"):
            device = Reporter(transport, tmp_path / f"{answer}.sqlite", Budget(5.0))
            try:
                device.answer("s1", "rr", "a")
                charges, queued = len(device.ledger.charges()), len(device.outbox)
                with pytest.raises(AnsweredBefore):
                    device.answer("s1", "rr", answer)
                assert (len(device.ledger.charges()), len(device.outbox)) == (charges, queued)
            finally:
                device.close()


def test_memoization_resends_the_first_report_whatever_the_answer(server, tmp_path: Path) -> None:
    """Memoization resends the first report for a changed answer as for an unchanged one: the
    server sees the same report id again either way, so the resend says nothing about the
    answer (the cost: a changed answer is not counted)."""
    with Transport(server.target) as transport:
        ids = {}
        for answer in ("a", "b"):
            device = Reporter(transport, tmp_path / f"m{answer}.sqlite", Budget(5.0), memoize=True)
            try:
                ids[answer] = (device.answer("s1", "rr", "a"), device.answer("s1", "rr", answer))
                assert len(device.ledger.charges()) == 1
            finally:
                device.close()
    assert ids["a"][0] == ids["a"][1] and ids["b"][0] == ids["b"][1]
