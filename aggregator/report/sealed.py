"""The sealed confirmatory family as a report shows it: read from the record ``confirm`` sealed
(plan hash, multiplicity, every test's n, statistic, p, adjusted p and decision), never
recomputed, so the report and ``confirm`` print the same numbers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aggregator.errors import InvalidInputError


@dataclass(frozen=True)
class SealedTest:
    """One test of the sealed family, as sealed."""

    title: str
    question_id: str
    n: int
    statistic: float
    pvalue: float
    adjusted: float
    reject: bool

    @property
    def decision(self) -> str:
        return "reject H0" if self.reject else "do not reject H0"


@dataclass(frozen=True)
class SealedFamily:
    """The sealed record of a split survey's preregistered plan."""

    plan_sha256: str
    sealed_at: str
    multiplicity: str  # "holm" or "bonferroni"
    alpha: float
    tests: tuple[SealedTest, ...]

    @classmethod
    def from_record(cls, record: Mapping) -> SealedFamily:
        """The family from the sealed record (``confirm --json`` without ``already``); a record
        that lacks a field is InvalidInputError naming it."""
        try:
            tests = tuple(
                SealedTest(
                    str(r["title"]),
                    str(r["question_id"]),
                    int(r["n"]),
                    float(r["statistic"]),
                    float(r["pvalue"]),
                    float(r["adjusted"]),
                    bool(r["reject"]),
                )
                for r in record["results"]
            )
            return cls(
                str(record["plan_sha256"]),
                str(record["sealed_at"]),
                str(record["multiplicity"]),
                float(record["alpha"]),
                tests,
            )
        except KeyError as exc:
            raise InvalidInputError(f"a sealed record without its {exc.args[0]!r}") from None

    @property
    def adjustment(self) -> str:
        """The multiplicity rule in words."""
        name = {"holm": "Holm", "bonferroni": "Bonferroni"}.get(self.multiplicity)
        return f"{name or self.multiplicity} adjusted"
