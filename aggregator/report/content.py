"""What a survey report says, computed once and rendered by ``html`` or ``markdown``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import numpy as np
from scipy import stats as scipy_stats

from aggregator.confirm.labels import NOT_PREREGISTERED
from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.histogram import Histogram
from aggregator.presentation.numbers import reports
from aggregator.report.design import DesignSummary
from aggregator.report.groups import GroupColumn, group_columns
from aggregator.report.sealed import SealedFamily
from aggregator.report.sentences import result_sentence
from aggregator.report.sequential import SequentialSection
from aggregator.stats import (
    Estimate,
    TestResult,
    estimate,
    goodness_of_fit,
    independence,
    two_sample,
)
from aggregator.survey_file.analyses import EXPLORATORY, Analysis
from aggregator.survey_file.design import IGNORES_DESIGN
from client.budgeting import SurveyCost, survey_cost
from client.survey import QuestionSpec, SurveySpec


@dataclass(frozen=True)
class Marginal:
    """One attribute's marginal distribution of a multi-attribute question, with intervals."""

    attribute: str
    labels: list[str]
    frequencies: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray


@dataclass(frozen=True)
class DesignTestAnswer:
    """A declared test's design-based answer: the design it rests on and its result, or why it
    could not run."""

    design: str
    result: TestResult | None = None
    why: str = ""


@dataclass(frozen=True)
class TestSection:
    """A declared test and its outcome (None when the question is not released)."""

    analysis: Analysis
    result: TestResult | None
    sentence: str
    #: the design a design-based test rests on, or IGNORES_DESIGN for a test that opted out of
    #: its survey's design ('' for a survey without one)
    design: str = ""


@dataclass(frozen=True)
class QuestionSection:
    """Everything the report shows for one question."""

    question: QuestionSpec
    n: int
    min_batch_size: int
    estimate: Estimate | None  # None below the release threshold, or when ``withheld``
    marginals: tuple[Marginal, ...]
    tests: tuple[TestSection, ...]
    withheld: str = ""  # released, but the mechanism has no per-category estimate: why
    groups: tuple[GroupColumn, ...] = ()  # a pooled report's columns, one per public group
    design: DesignSummary | None = None  # the design-based estimate of a survey with a design

    @property
    def released(self) -> bool:
        return self.estimate is not None or bool(self.withheld)


@dataclass(frozen=True)
class SurveyReport:
    survey: SurveySpec
    questions: tuple[QuestionSection, ...]
    cost: SurveyCost  # what one device spends answering every question once
    confidence: float
    generated: str  # ISO 8601 UTC
    side: str = ""  # a split survey's side: "exploration" (labelled exploratory), "confirmation"
    group: str = ""  # the one group reported of a survey with a group label ('': all pooled)
    sealed: SealedFamily | None = None  # the confirmation side's sealed family, shown first
    #: The survey file's sequential analyses "as of n" (aggregator/report/sequential.py).
    sequential: tuple[SequentialSection, ...] = ()
    #: a survey with a sampling design reported as a simple random sample (--ignore-design)
    ignores_design: bool = False

    @property
    def design_note(self) -> str:
        """What the report says about the survey's sampling design (empty without one)."""
        if self.ignores_design:
            return IGNORES_DESIGN
        if self.survey.design is not None:
            return (
                "design-based: every estimate and test uses the survey's sampling design "
                "(weights, strata and clusters); the simple-random-sample estimate below each "
                "ignores it (docs/designs.md)"
            )
        return ""

    @property
    def side_note(self) -> str:
        """What the side means for the reader (empty for a survey that is not split)."""
        if self.side == "exploration":
            return EXPLORATORY
        if self.side == "confirmation":
            return (
                "confirmation side of a split survey, read after its results were sealed: the "
                "sealed confirmatory family comes first; every other estimate and test is "
                "labelled not preregistered"
            )
        return ""

    @property
    def result_label(self) -> str:
        """The label of every estimate and test the report shows outside the sealed family
        (empty unless the report reads the confirmation side)."""
        return NOT_PREREGISTERED if self.side == "confirmation" else ""

    @property
    def group_note(self) -> str:
        """Which groups the report covers (empty for a survey without a group label)."""
        label = self.survey.group_label
        if label is None:
            return ""
        if self.group:
            return f"{label.name} = {self.group}: this group's reports only"
        return f"all {label.name} groups pooled ({', '.join(label.values)})"


def build_report(
    survey: SurveySpec,
    histograms: Mapping[str, Histogram],
    analyses: Sequence[Analysis] = (),
    confidence: float = 0.95,
    seed: int | None = 0,
    now: datetime | None = None,
    side: str = "",
    group: str = "",
    group_histograms: Mapping[tuple[str, str], Histogram] | None = None,
    sealed: Mapping | SealedFamily | None = None,
    designs: Mapping[str, DesignSummary] | None = None,
    design_tests: Mapping[Analysis, DesignTestAnswer] | None = None,
    ignores_design: bool = False,
) -> SurveyReport:
    """Estimate every question of ``survey`` from its histogram (a question without one has no
    reports yet) and run the declared ``analyses``; nothing is released below the survey's
    ``min_batch_size``. A two-sample analysis reads its two groups' histograms from
    ``group_histograms`` ((question id, group) -> histogram); a pooled report of a survey with a
    group label also shows a column per group for every question with any of them given (a
    group not given counts as empty). ``sealed`` is the confirmation side's sealed record
    (``confirm``'s JSON), shown as it was sealed. ``designs``: per question id the design-based
    estimate shown as the headline of a released question (a survey with a sampling design);
    ``design_tests``: each design-based declared test's answer (its caller ran it on the
    design data); a declared test of such a survey without one opted out (``design = false``)
    and says it ignores the design. ``seed`` fixes Monte Carlo and bootstrap draws, so a report
    is reproducible."""
    family = SealedFamily.from_record(sealed) if isinstance(sealed, Mapping) else sealed
    sections = []
    for question in survey.questions:
        hist = histograms.get(question.id, Histogram.empty(question.mechanism))
        declared = [a for a in analyses if a.question_id == question.id]
        groups = {
            g: (group_histograms or {}).get((question.id, g), Histogram.empty(question.mechanism))
            for a in declared
            for g in a.groups or ()
        }
        section = _section(survey, question, hist, declared, confidence, seed, groups)
        section = replace(
            section, tests=tuple(_designed(survey, t, design_tests or {}) for t in section.tests)
        )
        if section.estimate is not None and survey.group_label is not None and not group:
            given = group_histograms or {}
            if any((question.id, g) in given for g in survey.group_label.values):
                columns = group_columns(survey, question, given, section.min_batch_size, confidence)
                section = replace(section, groups=columns)
        if section.estimate is not None and question.id in (designs or {}):
            section = replace(section, design=(designs or {})[question.id])
        sections.append(section)
    stamp = (now or datetime.now(UTC)).isoformat(timespec="seconds")
    cost = survey_cost(survey.questions)
    return SurveyReport(
        survey,
        tuple(sections),
        cost,
        confidence,
        stamp,
        side,
        group,
        family,
        ignores_design=ignores_design,
    )


def _section(
    survey: SurveySpec,
    question: QuestionSpec,
    hist: Histogram,
    analyses: list[Analysis],
    confidence: float,
    seed: int | None,
    groups: Mapping[str, Histogram],
) -> QuestionSection:
    threshold = max(survey.min_batch_size, 1)
    if hist.n < threshold:
        why = f"not run: {reports(hist.n)}, results are released from {threshold}"
        tests = tuple(TestSection(a, None, why) for a in analyses)
        return QuestionSection(question, hist.n, threshold, None, (), tests)
    tests = tuple(_run(question, hist, a, seed, groups, threshold) for a in analyses)
    try:
        est = estimate(hist, confidence)
    except InvalidInputError as exc:  # public-coin reports: tests only (docs/mechanisms.md)
        if question.mechanism.statistic_kind != "groups":
            raise
        return QuestionSection(question, hist.n, threshold, None, (), tests, str(exc))
    return QuestionSection(question, hist.n, threshold, est, _marginals(question, est), tests)


def _designed(
    survey: SurveySpec, test: TestSection, answers: Mapping[Analysis, DesignTestAnswer]
) -> TestSection:
    """A declared test of a survey with a sampling design: its design-based answer (or why it
    did not run), or the simple one labelled as ignoring the design."""
    if survey.design is None:
        return test
    if not test.analysis.design:
        return replace(test, design=IGNORES_DESIGN)
    answer = answers.get(test.analysis)
    if answer is None:  # not released (the same reason), or its design data was not read
        if test.result is None:
            return test
        return TestSection(test.analysis, None, "not run: its design data was not read")
    if answer.result is None:
        return TestSection(test.analysis, None, f"not run: {answer.why}", answer.design)
    names = [attribute.name for attribute in survey.question(test.analysis.question_id).attributes]
    if test.analysis.test == "two_sample":
        names = list(test.analysis.groups or ())
    sentence = result_sentence(test.analysis.test, answer.result, names)
    return TestSection(test.analysis, answer.result, sentence, answer.design)


def _run(
    question: QuestionSpec,
    hist: Histogram,
    analysis: Analysis,
    seed: int | None,
    groups: Mapping[str, Histogram],
    threshold: int,
) -> TestSection:
    names = [attribute.name for attribute in question.attributes]
    try:
        if analysis.test == "goodness_of_fit":
            result = goodness_of_fit(hist, np.array(analysis.p0), analysis.alpha, rng=seed)
        elif analysis.test == "two_sample":
            names = list(analysis.groups or ())
            small = [g for g in names if groups[g].n < threshold]
            if small:
                why = f"{small[0]} has {reports(groups[small[0]].n)}"
                return TestSection(
                    analysis, None, f"not run: {why}, results are released from {threshold}"
                )
            first, second = (groups[g] for g in names)
            result = two_sample(first, second, analysis.alpha, rng=seed)
        else:
            shape = question.table_shape
            if shape is None:  # parse_analysis refuses such an analysis
                raise InvalidInputError(
                    f"question {question.id!r}: independence needs 2 attributes"
                )
            result = independence(hist, shape, analysis.alpha, rng=seed)
    except InsufficientDataError as exc:
        return TestSection(analysis, None, f"not run: {exc}")
    return TestSection(analysis, result, result_sentence(analysis.test, result, names))


def _marginals(question: QuestionSpec, est: Estimate) -> tuple[Marginal, ...]:
    """Each attribute's marginal: a linear map A of the joint estimate, with covariance A S A^T
    and normal intervals at the estimate's confidence."""
    if len(question.shape) < 2:
        return ()
    z = float(scipy_stats.norm.isf((1 - est.confidence) / 2))
    cells = np.arange(question.k).reshape(question.shape)
    marginals = []
    for axis, attribute in enumerate(question.attributes):
        A = np.zeros((question.shape[axis], question.k))
        for value in range(question.shape[axis]):
            A[value, np.take(cells, value, axis=axis).ravel()] = 1.0
        freqs = A @ est.frequencies
        se = np.sqrt(np.clip(np.diag(A @ est.covariance @ A.T), 0.0, None))
        labels = list(attribute.categories)
        marginals.append(Marginal(attribute.name, labels, freqs, freqs - z * se, freqs + z * se))
    return tuple(marginals)
