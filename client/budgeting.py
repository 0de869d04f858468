"""What a survey costs one device, and the ledger budget that pays for it.

A device answering each question once spends the sum of the pure questions' epsilons (pointwise
bucket) and the sum of the Gaussian questions' rhos (zCDP bucket). The smallest ledger budget
that admits both is ``--pointwise`` = the epsilon sum and ``--budget`` = that plus the
(epsilon, delta) cost of the rho sum, ``rho + 2 sqrt(rho ln(1/delta))`` (the ledger's own
conversion, client/device/ledger.py), rounded up so the ledger's admission test passes.
A household answering the survey's household_shared questions once spends their epsilon (and
rho) sums per device of the household from its household cap (docs/households.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from client.survey import QuestionSpec

DEFAULT_DELTA = 1e-6  # ldp-client's default --delta


@dataclass(frozen=True)
class SurveyCost:
    """Per-device cost of answering each question once, and a budget that covers it."""

    epsilon: float  # sum over pure-LDP questions
    rho: float  # sum over zCDP (Gaussian) questions
    delta: float
    budget: float  # --budget
    pointwise: float  # --pointwise
    household_epsilon: float = 0.0  # sum over household_shared pure questions (group cost / d)
    household_rho: float = 0.0  # sum over household_shared zCDP questions

    @property
    def flags(self) -> str:
        """The ldp-client enrollment flags of this budget."""
        text = f"--budget {self.budget:g}"
        if self.rho:
            text += f" --pointwise {self.pointwise:g} --delta {self.delta:g}"
        return text

    def to_dict(self) -> dict[str, float | str]:
        return {
            "epsilon": self.epsilon,
            "rho": self.rho,
            "delta": self.delta,
            "budget": self.budget,
            "pointwise": self.pointwise,
            "flags": self.flags,
            "household_epsilon": self.household_epsilon,
            "household_rho": self.household_rho,
        }


def survey_cost(questions: Iterable[QuestionSpec], delta: float = DEFAULT_DELTA) -> SurveyCost:
    """The cost of answering every question once, and the smallest budget that pays it."""
    questions = list(questions)
    costs = [q.mechanism.cost for q in questions]
    epsilon = math.fsum(c.value for c in costs if c.kind == "pure")
    rho = math.fsum(c.value for c in costs if c.kind == "zcdp")
    shared = [q.mechanism.cost for q in questions if q.household_shared]
    household_epsilon = math.fsum(c.value for c in shared if c.kind == "pure")
    household_rho = math.fsum(c.value for c in shared if c.kind == "zcdp")
    pointwise = _round_up(epsilon)
    budget = pointwise
    if rho:
        budget = _round_up(pointwise + rho + 2 * math.sqrt(rho * math.log(1 / delta)))
    return SurveyCost(epsilon, rho, delta, budget, pointwise, household_epsilon, household_rho)


def _round_up(value: float, digits: int = 4) -> float:
    """``value`` rounded up to ``digits`` decimals (a budget printed must still cover it)."""
    scale = 10**digits
    return math.ceil(value * scale * (1 - 1e-12)) / scale
