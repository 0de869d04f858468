"""Run a preregistered family once on the confirmation side and produce the sealed record.

A test of a survey with a sampling design is the design-based (Rao-Scott) test of its design
data unless the plan opts out (``design = false``); the record names the design, or says the
test ignores it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np

from aggregator.confirm.plan import Plan
from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats import goodness_of_fit, holm, independence, two_sample
from aggregator.stats.result import TestResult
from aggregator.survey_file.analyses import Analysis
from aggregator.survey_file.design import IGNORES_DESIGN
from client.survey import SurveySpec

if TYPE_CHECKING:
    from aggregator.analysis.design_data import DesignData


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
    #: the design a design-based test rests on, or IGNORES_DESIGN for a test a plan opted out
    #: of its survey's design; None for a survey without one
    design: str | None = None

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        for name in ("groups", "design"):
            if out[name] is None:
                del out[name]
        if self.groups is not None:
            out["groups"] = list(self.groups)
        return out


def run_family(
    plan: Plan,
    survey: SurveySpec,
    histograms: Mapping[tuple[str, str], Histogram],
    seed: int = 0,
    designs: Mapping[str, DesignData] | None = None,
) -> dict:
    """The sealed record: the plan's hash and text, when it ran, and every test's outcome with
    Holm (or Bonferroni) adjusted p-values at the family's alpha. Every test must be runnable
    (a family with a test that cannot run is not a family: the caller waits for more data).
    ``designs``: each question's confirmation-side design data (all groups), which the
    design-based tests of a survey with a sampling design read."""
    if plan.survey_id != survey.id:
        raise InvalidInputError(f"the plan is for survey {plan.survey_id!r}, not {survey.id!r}")
    raw: list[TestResult] = []
    described: list[str | None] = []
    for analysis in plan.tests:
        found = [histograms.get((analysis.question_id, g)) for g in analysis.groups or ("",)]
        hists = [hist for hist in found if hist is not None and hist.n != 0]
        if len(hists) < len(found):
            raise InsufficientDataError(f"no confirmation reports for {analysis.question_id!r}")
        if analysis.design:
            data = designed_data(analysis, survey, histograms, designs)
            result = designed_test(analysis, data, plan.alpha, seed)
            described.append(data.description())
        else:
            result = _simple_test(analysis, survey, hists, plan.alpha, seed)
            described.append(None if survey.design is None else IGNORES_DESIGN)
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
            described[i],
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


def _simple_test(
    analysis: Analysis, survey: SurveySpec, hists: list[Histogram], alpha: float, seed: int
) -> TestResult:
    """The declared test of the histograms, reports taken as a simple random sample."""
    if analysis.test == "goodness_of_fit":
        return goodness_of_fit(hists[0], np.array(analysis.p0), alpha, rng=seed)
    if analysis.test == "two_sample":
        return two_sample(hists[0], hists[1], alpha, rng=seed)
    shape = survey.question(analysis.question_id).table_shape
    if shape is None:  # parse_analysis refuses such a plan
        raise InvalidInputError(f"{analysis.title}: independence needs two attributes")
    return independence(hists[0], shape, alpha, rng=seed)


def designed_data(
    analysis: Analysis,
    survey: SurveySpec,
    histograms: Mapping[tuple[str, str], Histogram],
    designs: Mapping[str, DesignData] | None,
) -> DesignData:
    """The design data a design-based test of ``analysis`` reads: the two groups it compares
    (two-sample), else the groups released as the pooled histogram is (those of a group label
    that reach ``min_batch_size``; run.pooled_as_released)."""
    from aggregator.analysis.design_data import DesignData

    data = (designs or {}).get(analysis.question_id)
    if data is None:
        raise InvalidInputError(
            f"{analysis.title}: the design-based test needs the question's design statistics"
        )
    if analysis.groups is not None:
        groups: tuple[str, ...] = analysis.groups
    elif survey.group_label is None:
        groups = ("",)
    else:
        groups = tuple(
            g
            for g in survey.group_label.values
            if histograms[analysis.question_id, g].n >= survey.min_batch_size
        )
    keys = tuple(stat for stat in data.keys if stat.group in groups)
    return DesignData(data.question, data.frame, keys, groups)


def designed_test(analysis: Analysis, data: DesignData, alpha: float, seed: int) -> TestResult:
    """The Rao-Scott test of ``analysis`` at ``alpha`` with the default design options (a
    two-sample test: homogeneity of its two groups as domains of one design)."""
    from aggregator.analysis.design_answers import design_test
    from aggregator.stats.design.options import (
        DEFAULT_CORRECTION,
        DEFAULT_REPLICATES,
        DEFAULT_VARIANCE,
    )

    kind = {"goodness_of_fit": "gof", "independence": "independence"}.get(
        analysis.test, "homogeneity"
    )
    p0 = np.array(analysis.p0) if analysis.p0 is not None else None
    options = (DEFAULT_CORRECTION, DEFAULT_VARIANCE, DEFAULT_REPLICATES, seed)
    return design_test(data, kind, p0, alpha, *options)
