"""The design-based parts of a report of a survey with a sampling design: each released
question's design-based estimate (the report's headline) and each declared test's Rao-Scott
answer, from the store's design data (--db) or the server's Analyst (--server), so both read
the same (docs/designs.md, docs/reports.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.remote import RemoteError
from aggregator.report.content import DesignTestAnswer
from aggregator.report.design import DesignSummary
from aggregator.stats.design.options import (
    DEFAULT_CORRECTION,
    DEFAULT_REPLICATES,
    DEFAULT_VARIANCE,
)

if TYPE_CHECKING:
    from aggregator.analysis.design_data import DesignData
    from aggregator.analysis.survey_data import SurveyData
    from aggregator.remote import RemoteAnalyst
    from aggregator.survey_file.analyses import Analysis

#: A declared test's kind among the design tests.
KINDS = {"goodness_of_fit": "gof", "independence": "independence", "two_sample": "homogeneity"}


def stored_design_answers(
    data: SurveyData, analyses: Sequence[Analysis], confidence: float, seed: int
) -> tuple[dict[str, DesignSummary], dict[Analysis, DesignTestAnswer]]:
    """The design-based estimates and tests of a survey read with its design data (--db)."""
    from aggregator.analysis.design_answers import design_estimate_answer, design_test
    from aggregator.analysis.design_data import DesignData
    from aggregator.stats.design.raking import RakingError

    estimates: dict[str, DesignSummary] = {}
    tests: dict[Analysis, DesignTestAnswer] = {}
    for question_id, item in data.items():
        design = item.stored_design
        if design is None or not item.released or item.withheld:
            continue
        description = design.description()
        options = (DEFAULT_VARIANCE, DEFAULT_REPLICATES, seed)
        try:
            answer = design_estimate_answer(design, *options, confidence)
            estimates[question_id] = DesignSummary.of(answer)
        except (InsufficientDataError, InvalidInputError, RakingError) as exc:
            estimates[question_id] = DesignSummary(description, why=str(exc))
        for analysis in analyses:
            if analysis.question_id != question_id or not analysis.design:
                continue
            tested: DesignData = design
            if analysis.groups is not None:
                keys = tuple(stat for stat in design.keys if stat.group in analysis.groups)
                tested = DesignData(design.question, design.frame, keys, analysis.groups)
            p0 = None if analysis.p0 is None else np.array(analysis.p0)
            kind = KINDS[analysis.test]
            try:
                result = design_test(tested, kind, p0, analysis.alpha, DEFAULT_CORRECTION, *options)
            except (InsufficientDataError, InvalidInputError) as exc:
                tests[analysis] = DesignTestAnswer(tested.description(), why=str(exc))
            else:
                tests[analysis] = DesignTestAnswer(tested.description(), result)
    return estimates, tests


def served_design_answers(
    analyst: RemoteAnalyst,
    data: SurveyData,
    analyses: Sequence[Analysis],
    confidence: float,
) -> tuple[dict[str, DesignSummary], dict[Analysis, DesignTestAnswer]]:
    """The same, answered by the server's Analyst from its released design rows."""
    survey = data.survey
    side = data.side or None
    group = data.group or None
    estimates: dict[str, DesignSummary] = {}
    tests: dict[Analysis, DesignTestAnswer] = {}
    for question_id, item in data.items():
        if not item.released or item.withheld:
            continue
        try:
            answer = analyst.design_estimate(
                survey.id, question_id, confidence, side=side, group=group
            )
            estimates[question_id] = DesignSummary.of(answer)
        except RemoteError as exc:
            estimates[question_id] = DesignSummary("the server's design rows", why=str(exc))
        for analysis in analyses:
            if analysis.question_id != question_id or not analysis.design:
                continue
            try:
                design, result = analyst.design_test(
                    survey.id,
                    question_id,
                    KINDS[analysis.test],
                    analysis.p0,
                    analysis.alpha,
                    side=side,
                    group=None if analysis.groups else group,
                    groups=analysis.groups,
                )
            except RemoteError as exc:
                tests[analysis] = DesignTestAnswer("the server's design rows", why=str(exc))
            else:
                tests[analysis] = DesignTestAnswer(design, result)
    return estimates, tests
