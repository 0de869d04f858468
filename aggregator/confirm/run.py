"""What the commands and the Analyst RPCs run on the confirmation side's histograms and design
data (which the store hands over from its sealing or holdout snapshot): the sealed record of a
plan, and one SparseValidate answer; design-based for a survey with a sampling design unless
the plan's test (or the holdout's caller) opts out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from aggregator.confirm.family import designed_data, designed_test, run_family
from aggregator.confirm.plan import Plan
from aggregator.confirm.sparse_validate import SparseValidate
from aggregator.errors import ConfirmationError, InsufficientDataError, InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats import goodness_of_fit, independence
from aggregator.stats.montecarlo import minimum_draws
from aggregator.survey_file.analyses import Analysis
from client.survey import SurveySpec

if TYPE_CHECKING:
    from aggregator.analysis.design_data import DesignData

#: Simulated calibrations at holdout level beta run at least this many times 1/beta draws.
HOLDOUT_DRAW_FACTOR = 4


#: What a holdout query may run (one histogram each).
HOLDOUT_TESTS = ("goodness_of_fit", "independence")


def _released(survey: SurveySpec, question_id: str, hist: Histogram, group: str = "") -> None:
    if hist.n < survey.min_batch_size:
        of = f" of {survey.group_label.name} {group}" if group and survey.group_label else ""
        raise InsufficientDataError(
            f"{survey.id}/{question_id} has {hist.n} confirmation-side reports{of}; results are "
            f"released from {survey.min_batch_size}"
        )


def sealed_record(
    plan: Plan,
    survey: SurveySpec,
    histograms: Mapping[tuple[str, str], Histogram],
    seed: int = 0,
    designs: Mapping[str, DesignData] | None = None,
) -> dict:
    """The record to seal: the family run once on the confirmation side (every tested
    question, and every compared group, must have reached the survey's minimum batch size);
    ``designs``: the questions' design data, for a survey with a sampling design."""
    histograms = pooled_as_released(survey, histograms)
    for analysis in plan.tests:
        for group in analysis.groups or ("",):
            _released(survey, analysis.question_id, histograms[analysis.question_id, group], group)
    return run_family(plan, survey, histograms, seed, designs)


def pooled_as_released(
    survey: SurveySpec, histograms: Mapping[tuple[str, str], Histogram]
) -> Mapping[tuple[str, str], Histogram]:
    """``histograms`` with each pooled histogram of a survey with a group label replaced by
    the sum of its groups that reach ``min_batch_size``, as the Analyst service releases it
    (docs/threat-model.md, "What is released"): pooled minus the groups released beside it
    never isolates a group below the threshold."""
    label = survey.group_label
    if label is None:
        return histograms
    out = dict(histograms)
    for question in survey.questions:
        parts = [histograms[question.id, group] for group in label.values]
        released = [hist for hist in parts if hist.n >= survey.min_batch_size]
        out[question.id, ""] = sum(released, Histogram.empty(question.mechanism))
    return out


def holdout_answer(
    held: dict,
    survey: SurveySpec,
    histograms: Mapping[tuple[str, str], Histogram],
    question_id: str,
    test: str,
    p0: Sequence[float] | np.ndarray | None = None,
    seed: int = 0,
    designs: Mapping[str, DesignData] | None = None,
    design: bool | None = None,
) -> tuple[dict, bool, float]:
    """Run one test at the holdout's next level: (new state, reject, level). A test that cannot
    run (too little data, inconclusive) raises and uses no query. ``design`` (None: whether the
    survey declares a sampling design): the design-based test of ``designs``."""
    validate = SparseValidate(**held)
    if validate.closed:
        raise ConfirmationError(f"survey {survey.id}: {validate.closed_reason()}")
    level = validate.next_level()
    try:
        question = survey.question(question_id)
    except KeyError:
        raise InvalidInputError(f"survey {survey.id!r} has no question {question_id!r}") from None
    hist = pooled_as_released(survey, histograms)[question_id, ""]
    _released(survey, question_id, hist)
    if test not in HOLDOUT_TESTS:
        raise InvalidInputError(f"test must be one of {', '.join(HOLDOUT_TESTS)}, got {test!r}")
    # A simulated p-value is at least 1/(draws + 1): enough draws that it can fall well below
    # the (small) level, where the calibration is simulated at all.
    draws = HOLDOUT_DRAW_FACTOR * minimum_draws(level)
    if test == "goodness_of_fit" and (p0 is None or len(p0) != question.k):
        raise InvalidInputError(f"goodness_of_fit needs p0 with {question.k} probabilities")
    shape = question.table_shape
    if test == "independence" and shape is None:
        raise InvalidInputError(f"question {question_id!r}: independence needs 2 attributes")
    if survey.design is not None if design is None else design:
        declared = None if p0 is None else tuple(float(p) for p in p0)
        analysis = Analysis(f"{test}: {question_id}", question_id, test, level, declared)
        data = designed_data(analysis, survey, pooled_as_released(survey, histograms), designs)
        result = designed_test(analysis, data, level, seed)
    elif test == "goodness_of_fit":
        null = np.asarray(p0, dtype=float)
        result = goodness_of_fit(hist, null, level, rng=seed, n_draws=max(999, draws))
    else:
        assert shape is not None
        result = independence(hist, shape, level, rng=seed, n_draws=max(199, draws))
    if result.inconclusive:
        raise InsufficientDataError(f"{question_id}: {result.reason}")
    validate.record(result.reject)
    return validate.to_dict(), bool(result.reject), level
