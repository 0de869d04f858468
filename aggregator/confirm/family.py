"""Run a preregistered family once on the confirmation side and produce the sealed record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from aggregator.confirm.plan import Plan
from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats import goodness_of_fit, holm, independence, two_sample
from client.survey import SurveySpec


@dataclass(frozen=True)
class FamilyResult:
    """One confirmatory test: its raw and multiplicity-adjusted p-value and the decision."""

    title: str
    question_id: str
    test: str
    n: int
    statistic: float
    pvalue: float
    adjusted: float
    reject: bool
    method: str
    groups: tuple[str, str] | None = None  # two-sample: the two groups compared

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        if self.groups is None:
            del out["groups"]
        else:
            out["groups"] = list(self.groups)
        return out


def run_family(
    plan: Plan,
    survey: SurveySpec,
    histograms: Mapping[tuple[str, str], Histogram],
    seed: int = 0,
) -> dict:
    """The sealed record: the plan's hash and text, when it ran, and every test's outcome with
    Holm (or Bonferroni) adjusted p-values at the family's alpha. Every test must be runnable
    (a family with a test that cannot run is not a family: the caller waits for more data)."""
    if plan.survey_id != survey.id:
        raise InvalidInputError(f"the plan is for survey {plan.survey_id!r}, not {survey.id!r}")
    raw = []
    for analysis in plan.tests:
        found = [histograms.get((analysis.question_id, g)) for g in analysis.groups or ("",)]
        hists = [hist for hist in found if hist is not None and hist.n != 0]
        if len(hists) < len(found):
            raise InsufficientDataError(f"no confirmation reports for {analysis.question_id!r}")
        hist = hists[0]
        if analysis.test == "goodness_of_fit":
            result = goodness_of_fit(hist, np.array(analysis.p0), plan.alpha, rng=seed)
        elif analysis.test == "two_sample":
            result = two_sample(hist, hists[1], plan.alpha, rng=seed)
        else:
            shape = survey.question(analysis.question_id).table_shape
            if shape is None:  # parse_analysis refuses such a plan
                raise InvalidInputError(f"{analysis.title}: independence needs two attributes")
            result = independence(hist, shape, plan.alpha, rng=seed)
        if result.inconclusive:
            raise InsufficientDataError(f"{analysis.title}: {result.reason}")
        raw.append(result)
    pvalues = np.array([result.pvalue for result in raw])
    if plan.multiplicity == "holm":
        adjusted = holm(pvalues, plan.alpha).adjusted
    else:
        adjusted = np.minimum(pvalues * len(pvalues), 1.0)
    results = [
        FamilyResult(
            analysis.title,
            analysis.question_id,
            analysis.test,
            result.n,
            float(result.statistic),
            float(result.pvalue),
            float(adjusted[i]),
            bool(adjusted[i] <= plan.alpha),
            result.method,
            analysis.groups,
        )
        for i, (analysis, result) in enumerate(zip(plan.tests, raw, strict=True))
    ]
    return {
        "survey": survey.id,
        "plan_sha256": plan.sha256,
        "plan": plan.text,
        "alpha": plan.alpha,
        "multiplicity": plan.multiplicity,
        "sealed_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "results": [r.to_dict() for r in results],
    }
