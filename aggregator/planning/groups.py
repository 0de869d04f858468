"""Planning a comparison of groups: the power of a two- or k-sample homogeneity test with n reports
per group, or the n per group that a target power needs, for one mechanism or ranked over all.

The figures are ``k_sample_power``'s (asymptotic; at G = 2 it is ``two_sample_power``), validated
against simulation in tests/stats/test_k_sample.py. Group sizes follow an allocation: group g gets
``n * allocation[g]`` reports (equal groups by default). With a survey design the groups are
compared by the design-based homogeneity test under its design effect (``stats.design_power``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from aggregator.errors import InvalidInputError
from aggregator.stats.design.power import DesignEffect, plan_k_sample
from aggregator.stats.k_sample import k_sample_power
from aggregator.stats.validate import check_alpha, check_distribution
from client.mechanisms import (
    FlipComponents,
    HadamardResponse,
    LaplaceNoise,
    LocalHashing,
    Mechanism,
    OptimizedUnaryEncoding,
    RandomizedResponse,
    SubsetSelection,
)

#: The mechanisms ranked when none is named: every pure epsilon-LDP family with k categories.
FAMILIES = (
    RandomizedResponse,
    FlipComponents,
    LaplaceNoise,
    OptimizedUnaryEncoding,
    HadamardResponse,
    SubsetSelection,
    LocalHashing,
)
MAX_N_PER_GROUP = 10**9  # beyond this no study is plannable: "not reachable"


@dataclass(frozen=True)
class GroupPlanRow:
    """One mechanism's figure: the group sizes and the power they give (None: the target is
    not reachable below MAX_N_PER_GROUP per group)."""

    mechanism: Mechanism
    sizes: tuple[int, ...] | None
    power: float
    deff: float | None = None  # with a design: the reports' design effect applied
    note: str = ""

    def to_dict(self) -> dict:
        out = {
            "mechanism": self.mechanism.describe(),
            "sizes": None if self.sizes is None else list(self.sizes),
            "power": self.power,
        }
        return out if self.deff is None else {**out, "deff": self.deff, "note": self.note}


@dataclass(frozen=True)
class GroupPlan:
    """A planned homogeneity test of ``len(distributions)`` groups; rows best first."""

    distributions: np.ndarray  # (G, k)
    allocation: tuple[float, ...]
    alpha: float
    target_power: float | None
    rows: tuple[GroupPlanRow, ...]
    design: DesignEffect | None = None

    def to_dict(self) -> dict:
        return {
            **({} if self.design is None else {"design": self.design.to_dict()}),
            "test": "two-sample" if len(self.allocation) == 2 else "k-sample",
            "groups": len(self.allocation),
            "alpha": self.alpha,
            "target_power": self.target_power,
            "allocation": list(self.allocation),
            "distributions": np.round(self.distributions, 12).tolist(),
            "rows": [row.to_dict() for row in self.rows],
        }

    def summary(self) -> str:
        groups = len(self.allocation)
        test = "two-sample" if groups == 2 else f"k-sample ({groups} groups)"
        goal = (
            f"reports per group needed for power {self.target_power:g}"
            if self.target_power is not None
            else "power with the planned group sizes"
        )
        lines = [f"{test} homogeneity at alpha = {self.alpha:g}: {goal}"]
        if self.design is not None:
            lines.append(f"  survey design: {self.design.header()}")
        width = max(len(row.mechanism.describe()) for row in self.rows)
        for row in self.rows:
            sizes = (
                "not reachable" if row.sizes is None else " + ".join(f"{n:,}" for n in row.sizes)
            )
            note = f"  ({row.note})" if row.note else ""
            lines.append(
                f"  {row.mechanism.describe():<{width}}  n = {sizes}  power = {row.power:.3f}"
                + note
            )
        return "\n".join(lines)


def plan_groups(
    *,
    distributions: Sequence[Sequence[float]],
    epsilon: float | None = None,
    mechanisms: Sequence[Mechanism] | None = None,
    n: int | None = None,
    target_power: float | None = None,
    allocation: Sequence[float] | None = None,
    alpha: float = 0.05,
    design: DesignEffect | None = None,
    design_df: int | None = None,
) -> GroupPlan:
    """Power with ``n`` reports per unit of allocation, or the n per unit for ``target_power``
    (exactly one), for ``mechanisms`` or, when None, every family of FAMILIES at ``epsilon``;
    best first. With ``design``, the design-based homogeneity test under that design effect
    (F with ``design_df`` = PSUs - strata, else chi-square)."""
    if (n is None) == (target_power is None):
        raise InvalidInputError("give either n (power at n) or a target power (n needed)")
    if len(distributions) < 2:
        raise InvalidInputError("a comparison needs the distributions of two or more groups")
    k = len(distributions[0])
    ps = np.stack(
        [
            check_distribution(p, k, f"distribution of group {g + 1}")
            for g, p in enumerate(distributions)
        ]
    )
    if np.allclose(ps, ps[0]):
        raise InvalidInputError("the groups' distributions are equal: there is nothing to detect")
    shares = _allocation(allocation, len(ps))
    alpha = check_alpha(alpha)
    if mechanisms is None:
        if epsilon is None or not epsilon > 0:
            raise InvalidInputError("give epsilon > 0 to rank the mechanisms")
        mechanisms = [family(k, epsilon) for family in FAMILIES]
    rows = []
    for mechanism in mechanisms:
        if design is None:
            power_at = _srs_power(mechanism, ps, shares, alpha)
            deff, note = None, ""
        else:
            planned = plan_k_sample(mechanism, ps, shares, design)
            deff, note = planned.deff, design.describe(planned.share)
            power_at = _design_power(planned, shares, alpha, design_df)
        if target_power is None:
            assert n is not None
            sizes = _sizes(n, shares)
            rows.append(GroupPlanRow(mechanism, sizes, power_at(n), deff, note))
        else:
            row = _needed(mechanism, power_at, target_power, shares, alpha)
            rows.append(GroupPlanRow(mechanism, row.sizes, row.power, deff, note))
    if target_power is None:
        rows.sort(key=lambda r: -r.power)
    else:
        rows.sort(key=lambda r: math.inf if r.sizes is None else sum(r.sizes))
    return GroupPlan(ps, shares, alpha, target_power, tuple(rows), design)


def _allocation(allocation: Sequence[float] | None, groups: int) -> tuple[float, ...]:
    if allocation is None:
        return (1.0,) * groups
    values = tuple(float(a) for a in allocation)
    if len(values) != groups or not all(math.isfinite(a) and a > 0 for a in values):
        raise InvalidInputError(f"the allocation must be {groups} positive numbers, one a group")
    return values


def _sizes(n: int, shares: tuple[float, ...]) -> tuple[int, ...]:
    return tuple(max(1, math.ceil(n * a)) for a in shares)


def _srs_power(mechanism, ps, shares, alpha: float) -> Callable[[int], float]:
    """Power of ``k_sample`` with n reports per unit of allocation."""
    return lambda n: k_sample_power(mechanism, ps, _sizes(n, shares), alpha)


def _design_power(planned, shares, alpha: float, design_df: int | None) -> Callable[[int], float]:
    """Power of the design-based homogeneity test with n reports per unit of allocation."""
    return lambda n: planned.power(sum(_sizes(n, shares)), alpha, design_df)


def _needed(
    mechanism, power_at: Callable[[int], float], target: float, shares, alpha: float
) -> GroupPlanRow:
    """The smallest n (per unit of allocation) whose power reaches ``target``: doubling, then
    bisection (the power grows with n)."""
    if not 0 < target < 1:
        raise InvalidInputError(f"target power must be in (0, 1), got {target!r}")
    if target <= alpha:
        raise InvalidInputError(f"target power {target:g} is not above alpha = {alpha:g}")

    high = 2
    while power_at(high) < target:
        if high >= MAX_N_PER_GROUP:
            return GroupPlanRow(mechanism, None, power_at(high))
        high = min(2 * high, MAX_N_PER_GROUP)
    low = high // 2
    while high - low > 1:
        middle = (low + high) // 2
        if power_at(middle) >= target:
            high = middle
        else:
            low = middle
    return GroupPlanRow(mechanism, _sizes(high, shares), power_at(high))
