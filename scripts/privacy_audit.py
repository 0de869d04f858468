"""Empirical privacy audit of the on-device randomizers, in the style of LDP-Auditor: a
statistical lower bound on the epsilon each mechanism really provides, to set against the epsilon
it claims.

For neighbouring answers x, x' and an output event S, any epsilon-LDP randomizer M satisfies
P[M(x) in S] <= e^epsilon P[M(x') in S] (+ delta). Randomizing x and x' many times and bounding the
two probabilities with Clopper-Pearson intervals gives, with the stated confidence,

    eps_lower = ln((p_low - delta) / q_high)  <=  the true epsilon.

The pair (x, x') and the event S are chosen on a separate pilot sample (the candidate with the
highest pilot bound among a family of events suited to the output: a category, a pattern on two
bits, thresholds on one or two noisy coordinates), then measured on fresh randomizations, so the
choice does not bias the bound. Gaussian noise is rho-zCDP; it is audited as
(rho + 2 sqrt(rho ln(1/delta)), delta)-DP.

Randomization goes through each mechanism's real ``randomize`` (the secure integer samplers); only
the entropy comes from a seeded byte stream instead of ``os.urandom``, so an audit is reproducible.
tests/mechanisms/test_privacy_audit.py runs the audits in CI, including deliberately broken
randomizers that
the audit must catch. Print the table of docs/privacy-audit.md with::

    python scripts/privacy_audit.py [--trials 20000] [--additive-trials 8000]
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import permutations

import numpy as np
from scipy import stats

from client.cli.progress import track
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
from client.mechanisms.secure_random import SecureRandom

CONFIDENCE = 0.999
DELTA = 1e-5  # for the (epsilon, delta) reading of zCDP

Randomizer = Callable[[int, SecureRandom], np.ndarray | int]


class SeededSource(SecureRandom):
    """The secure samplers' interface over a seeded byte stream (reproducible audits)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self._stream = random.Random(seed)

    def bytes(self, count: int) -> bytes:
        return self._stream.randbytes(count)


def clopper_pearson(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    """Exact two-sided binomial interval for the success probability."""
    tail = (1 - confidence) / 2
    low = stats.beta.ppf(tail, successes, trials - successes + 1) if successes else 0.0
    high = (
        stats.beta.ppf(1 - tail, successes + 1, trials - successes) if successes < trials else 1.0
    )
    return float(low), float(high)


def epsilon_lower_bound(
    hits_x: int, hits_other: int, trials: int, confidence: float, delta: float
) -> float:
    """ln((p_low - delta) / q_high), or -inf when p_low <= delta."""
    p_low, _ = clopper_pearson(hits_x, trials, confidence)
    _, q_high = clopper_pearson(hits_other, trials, confidence)
    return math.log((p_low - delta) / q_high) if p_low > delta else -math.inf


@dataclass(frozen=True)
class Event:
    """An output event: a name, and a test over a stack of outputs (n, width) -> bool (n,)."""

    name: str
    test: Callable[[np.ndarray], np.ndarray]


def events_for(mech: Mechanism) -> list[Event]:
    """Candidate distinguishing events for the mechanism's output."""
    k = mech.k
    if isinstance(mech, RandomizedResponse):
        return [Event(f"Y = {j}", lambda y, j=j: y[:, 0] == j) for j in range(k)]
    if isinstance(mech, PublicCoinBit):
        return [
            Event(f"G = {g}, b = {b}", lambda y, g=g, b=b: (y[:, 0] == g) & (y[:, 1] == b))
            for g in range(mech.groups)
            for b in (0, 1)
        ]
    if isinstance(mech, LocalHashing):  # supports i (the hashed value is h(i)), and not j
        return [
            Event(f"S{i}, not S{j}", lambda y, i=i, j=j: _supports(mech, y, i, j))
            for i, j in permutations(range(k), 2)
        ]
    if isinstance(mech, HadamardResponse):
        return [Event(f"Y = {c}", lambda y, c=c: y[:, 0] == c) for c in range(mech.columns)]
    if isinstance(mech, FlipComponents | OptimizedUnaryEncoding | SubsetSelection):
        out = [
            Event(f"b{i} = {a}", lambda y, i=i, a=a: y[:, i] == a) for i in range(k) for a in (0, 1)
        ]
        out += [
            Event(
                f"b{i} = {a}, b{j} = {b}",
                lambda y, i=i, j=j, a=a, b=b: (y[:, i] == a) & (y[:, j] == b),
            )
            for i, j in permutations(range(k), 2)
            for a in (0, 1)
            for b in (0, 1)
        ]
        return out
    g = mech.scale  # type: ignore[attr-defined]
    highs, lows = (0.5, 1.0, 1.5, 2.0, 3.0), (-2.0, -1.0, -0.5, 0.0, 0.5)
    out = [
        Event(f"Y{i} >= {a}g", lambda y, i=i, t=a * g: y[:, i] >= t)
        for i in range(k)
        for a in highs
    ]
    out += [
        Event(f"Y{i} <= {b}g", lambda y, i=i, t=b * g: y[:, i] <= t) for i in range(k) for b in lows
    ]
    out += [
        Event(
            f"Y{i} >= {a}g, Y{j} <= {b}g",
            lambda y, i=i, j=j, s=a * g, t=b * g: (y[:, i] >= s) & (y[:, j] <= t),
        )
        for i, j in permutations(range(k), 2)
        for a in highs
        for b in lows
    ]
    return out


def _supports(mech: LocalHashing, reports: np.ndarray, i: int, j: int) -> np.ndarray:
    support = mech.support(reports).astype(bool)
    return support[:, i] & ~support[:, j]


def sample(randomize: Randomizer, value: int, trials: int, source: SecureRandom) -> np.ndarray:
    """``trials`` randomizations of ``value`` as an integer array (trials, width)."""
    rows = [
        np.atleast_1d(np.asarray(randomize(value, source), dtype=np.int64)) for _ in range(trials)
    ]
    return np.stack(rows)


@dataclass(frozen=True)
class AuditResult:
    name: str
    claimed: float
    eps_lower: float
    delta: float
    pair: tuple[int, int]
    event: str
    trials: int

    @property
    def passed(self) -> bool:
        return self.eps_lower <= self.claimed


def audit(
    name: str,
    mech: Mechanism,
    claimed: float,
    *,
    randomize: Randomizer | None = None,
    trials: int,
    pilot: int,
    seed: int,
    delta: float = 0.0,
    confidence: float = CONFIDENCE,
) -> AuditResult:
    """Lower-bound the epsilon of ``randomize`` (default: the mechanism's own) for ``mech``'s
    output space: choose (x, x', S) on a pilot sample, measure on fresh randomizations."""
    randomize = randomize or mech.randomize
    source = SeededSource(seed)
    events = events_for(mech)
    pilots = [sample(randomize, x, pilot, source) for x in range(mech.k)]
    hits = np.array([[int(e.test(p).sum()) for p in pilots] for e in events])  # (events, k)
    best = max(
        ((e, x, other) for e in range(len(events)) for x, other in permutations(range(mech.k), 2)),
        key=lambda c: epsilon_lower_bound(
            hits[c[0], c[1]], hits[c[0], c[2]], pilot, confidence, delta
        ),
    )
    event, x, other = events[best[0]], best[1], best[2]
    hits_x = int(event.test(sample(randomize, x, trials, source)).sum())
    hits_other = int(event.test(sample(randomize, other, trials, source)).sum())
    bound = epsilon_lower_bound(hits_x, hits_other, trials, confidence, delta)
    return AuditResult(name, claimed, bound, delta, (x, other), event.name, trials)


def zcdp_epsilon(rho: float, delta: float) -> float:
    """The (epsilon, delta)-DP implied by rho-zCDP (Bun-Steinke Prop. 1.3)."""
    return rho + 2 * math.sqrt(rho * math.log(1 / delta))


def honest_audits(
    trials: int, additive_trials: int, pilot: int = 1500, quiet: bool = True
) -> list[AuditResult]:
    """Every shipped mechanism at the parameters of the docs table (a bar on a terminal unless
    ``quiet``)."""
    rr, fc = RandomizedResponse(4, 1.0), FlipComponents(4, 1.0)
    lap, gauss = LaplaceNoise(3, 1.0), GaussianNoise(3, 0.5)
    oue, hr = OptimizedUnaryEncoding(4, 1.0), HadamardResponse(4, 1.0)
    ss, olh = SubsetSelection(4, 1.0), LocalHashing(4, 1.0)
    coin = PublicCoinBit(4, 1.0, public_seed=7, groups=3)
    settings = [
        (rr, rr.epsilon, trials, 1, 0.0),
        (fc, fc.epsilon, trials, 2, 0.0),
        (lap, lap.epsilon, additive_trials, 3, 0.0),
        (gauss, zcdp_epsilon(gauss.rho, DELTA), additive_trials, 4, DELTA),
        (oue, oue.epsilon, trials, 5, 0.0),
        (hr, hr.epsilon, trials, 6, 0.0),
        (ss, ss.epsilon, trials, 7, 0.0),
        (olh, olh.epsilon, trials, 8, 0.0),
        (coin, coin.epsilon, trials, 9, 0.0),
    ]
    return [
        audit(mech.describe(), mech, claimed, trials=n, pilot=pilot, seed=seed, delta=delta)
        for mech, claimed, n, seed, delta in track(
            settings, "audit", unit="mechanisms", quiet=quiet
        )
    ]


def table(results: Sequence[AuditResult]) -> str:
    """The markdown table of docs/privacy-audit.md."""
    lines = [
        "| mechanism | claimed ε | δ | ε lower bound | x, x' | event | trials per input |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.claimed:.3f} | {r.delta:g} | {r.eps_lower:.3f} | {r.pair[0]}, "
            f"{r.pair[1]} | {r.event} | {r.trials} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20000, help="per input, pure mechanisms")
    parser.add_argument("--additive-trials", type=int, default=8000, help="per input, noise")
    args = parser.parse_args()
    print(table(honest_audits(args.trials, args.additive_trials, quiet=False)))


if __name__ == "__main__":
    main()
