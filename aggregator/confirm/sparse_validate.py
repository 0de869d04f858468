"""SparseValidate (privacy-accounting spec §C.6, from [Dwork2015] Thm 27, implemented as printed
there): a reusable confirmation holdout that answers adaptively chosen tests with one bit each.

The analyst submits tests one at a time; the service runs query i at level beta_i on the holdout
and returns only reject / do not reject. It stops after ``m`` queries or after ``budget``
rejections. Query i falsely rejects with probability at most l_i * beta_i, where
l_i = sum_{j=0}^{min(i-1, B)} C(i, j); the default levels beta_i = alpha / (m * l_i) make the
family-wise error at most alpha.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aggregator.errors import InvalidInputError
from aggregator.stats.validate import check_alpha


def histories(i: int, budget: int) -> int:
    """l_i = sum_{j=0}^{min(i-1, B)} C(i, j): the (conservative) count of answer histories that
    can precede query i (privacy-accounting spec §C.6; [Dwork2015] Thm 27)."""
    return sum(math.comb(i, j) for j in range(min(i - 1, budget) + 1))


def level(i: int, m: int, budget: int, alpha: float) -> float:
    """beta_i = alpha / (m * l_i), the level query i is run at."""
    return alpha / (m * histories(i, budget))


class HoldoutClosedError(InvalidInputError):
    """The holdout has answered its m queries or reached its rejection budget."""


@dataclass
class SparseValidate:
    """The holdout's state: ``answered`` queries so far, ``rejections`` among them."""

    alpha: float
    m: int
    budget: int
    answered: int = 0
    rejections: int = 0

    def __post_init__(self) -> None:
        self.alpha = check_alpha(self.alpha)
        for name in ("m", "budget"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")
        if not 0 <= self.rejections <= self.answered <= self.m:
            raise InvalidInputError("inconsistent holdout state")

    @property
    def closed(self) -> bool:
        return self.answered >= self.m or self.rejections >= self.budget

    def next_level(self) -> float:
        """The level the next query will be run at."""
        if self.closed:
            raise HoldoutClosedError(self.closed_reason())
        return level(self.answered + 1, self.m, self.budget, self.alpha)

    def record(self, reject: bool) -> float:
        """Count the answer of the query just run at ``next_level()``; returns that level."""
        used = self.next_level()
        self.answered += 1
        self.rejections += int(bool(reject))
        return used

    def guarantee(self) -> str:
        """What the analyst may rely on, printed with every answer."""
        return (
            f"SparseValidate: query {self.answered} of at most {self.m}, "
            f"{self.rejections} of at most {self.budget} rejections; each query i is run at "
            f"level alpha / (m * l_i), so the chance of any false rejection over the whole "
            f"sequence is at most {self.alpha:g}"
        )

    def closed_reason(self) -> str:
        if self.rejections >= self.budget:
            return f"the holdout reached its budget of {self.budget} rejections and is closed"
        return f"the holdout has answered its {self.m} queries and is closed"

    def to_dict(self) -> dict:
        return {
            "alpha": self.alpha,
            "m": self.m,
            "budget": self.budget,
            "answered": self.answered,
            "rejections": self.rejections,
        }
