"""The analyst's way in from Python: a survey file and a report store give, per question, its
histogram and labels, after the same checks as the command line (file kind, pinned
definitions), reading only."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.histogram import Histogram
from aggregator.store import ingest
from aggregator.store.sqlite import confirmations
from aggregator.store.sqlite.reader import StoreReader
from aggregator.survey_file.config import ConfigError, load_surveys
from client.survey import QuestionSpec, SurveyError, SurveySpec

if TYPE_CHECKING:
    from aggregator.analysis.design_data import DesignData

SIDES = {"exploration": 1, "confirmation": 2}  # ldp.v1.Side


def below_release(survey: SurveySpec, question: QuestionSpec, n: int, group: str) -> str:
    """Why a question with ``n`` reports (of ``group``) is not released, or '' if it is."""
    if n >= survey.min_batch_size:
        return ""
    of = f" of {survey.group_label.name} {group!r}" if survey.group_label and group else ""
    return (
        f"{survey.id}/{question.id} has {n} reports{of}; results are released from "
        f"{survey.min_batch_size} (min_batch_size)"
    )


@dataclass(frozen=True)
class QuestionData:
    """One question's stored data: its definition, histogram, labels and release state."""

    question: QuestionSpec
    stored: Histogram  # whatever its size: for callers that apply the release rule themselves
    released: bool  # n >= the survey's min_batch_size (what the CLI and the service release)
    withheld: str = ""  # set when reading for the analyst: why ``histogram`` is refused
    stored_design: DesignData | None = None  # read with its design (open_survey's default)
    #: read design-based (a survey with a sampling design, not opted out): ``estimate`` and the
    #: tests are design-based
    design_based: bool = False

    @property
    def design(self) -> DesignData:
        """The per design key statistics joined to the frame (``open_survey(..., design=True)``),
        or InsufficientDataError when ``withheld``."""
        if self.stored_design is None:
            raise InvalidInputError(
                f"{self.question.id}: no design data was read with it (a server's answers: "
                "RemoteAnalyst.design_estimate and design_test)"
            )
        if self.withheld:
            raise InsufficientDataError(self.withheld)
        return self.stored_design

    def estimate(self, confidence: float = 0.95, *, design: bool | None = None):
        """The question's estimate: for a survey with a sampling design the design-based one
        (a DesignEstimateAnswer; ``design=False``: aggregator.stats.estimate of the histogram,
        which ignores the design), else aggregator.stats.estimate."""
        if self._design_based(design):
            from aggregator.analysis.design_answers import design_estimate_answer
            from aggregator.stats.design.options import DEFAULT_REPLICATES, DEFAULT_VARIANCE

            data = self.design
            return design_estimate_answer(data, DEFAULT_VARIANCE, DEFAULT_REPLICATES, 0, confidence)
        from aggregator.stats import estimate

        return estimate(self.histogram, confidence)

    def goodness_of_fit(self, p0, alpha: float = 0.05, *, design: bool | None = None):
        """The goodness-of-fit test against ``p0``: the Rao-Scott test for a survey with a
        sampling design (``design=False``: the simple one, which ignores the design)."""
        import numpy as np

        if self._design_based(design):
            return self._design_test("gof", np.asarray(p0, dtype=float), alpha)
        from aggregator.stats import goodness_of_fit

        return goodness_of_fit(self.histogram, np.asarray(p0, dtype=float), alpha)

    def independence(self, alpha: float = 0.05, *, design: bool | None = None):
        """The independence test of a two-attribute question: Rao-Scott for a survey with a
        sampling design (``design=False``: the simple one, which ignores the design)."""
        if self._design_based(design):
            return self._design_test("independence", None, alpha)
        from aggregator.stats import independence

        return independence(self.histogram, alpha=alpha)

    def _design_test(self, kind: str, p0, alpha: float):
        from aggregator.analysis.design_answers import design_test
        from aggregator.stats.design.options import (
            DEFAULT_CORRECTION,
            DEFAULT_REPLICATES,
            DEFAULT_VARIANCE,
        )

        options = (DEFAULT_CORRECTION, DEFAULT_VARIANCE, DEFAULT_REPLICATES, 0)
        return design_test(self.design, kind, p0, alpha, *options)

    def _design_based(self, design: bool | None) -> bool:
        """``design`` (None: whether the survey declares one); InvalidInputError for
        design=True on a survey without one."""
        if design and not self.design_based:
            raise InvalidInputError(
                f"{self.question.id}: read without a sampling design (its survey declares "
                "none, or it was opened with design=False)"
            )
        return self.design_based if design is None else design

    @property
    def histogram(self) -> Histogram:
        """The histogram (it knows its question), or InsufficientDataError when ``withheld``."""
        if self.withheld:
            raise InsufficientDataError(self.withheld)
        return self.stored

    @property
    def labels(self) -> list[str]:
        """Category labels in the histogram's order ('a|b' for joint categories)."""
        return self.question.labels

    @property
    def n(self) -> int:
        return self.stored.n


@dataclass(frozen=True)
class SurveyData(Mapping[str, QuestionData]):
    """A survey's questions by id, each a :class:`QuestionData`."""

    survey: SurveySpec
    questions: Mapping[str, QuestionData]
    side: str = ""  # a split survey's side read: "exploration" or "confirmation"
    group: str = ""  # the one group read of a survey with a group label ('': all pooled)

    @property
    def exploratory(self) -> bool:
        """Read on the exploration side: to be labelled exploratory wherever it is shown."""
        return self.side == "exploration"

    def __getitem__(self, question_id: str) -> QuestionData:
        try:
            return self.questions[question_id]
        except KeyError:
            known = ", ".join(self.questions)
            raise KeyError(
                f"survey {self.survey.id} has no question {question_id!r} ({known})"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.questions)

    def __len__(self) -> int:
        return len(self.questions)


def open_survey(
    config: str | os.PathLike[str],
    db: str | os.PathLike[str],
    survey: str | None = None,
    side: str | None = None,
    group: str | None = None,
    *,
    withhold: bool = False,
    design: bool | None = None,
) -> SurveyData:
    """Every question of ``survey`` (optional when the file defines one survey) with its
    histogram, read only from the store ``db``. Raises ConfigError for an invalid file or an
    unknown survey, FileKindError for a file that is not a report store and
    DefinitionChangedError when the file changes a question the store has reports of.
    A split survey is read on one ``side`` ("exploration", the default, or "confirmation",
    which raises ConfirmationError until its confirmatory results are sealed). A survey with a
    group label is read for one ``group`` (each question released from min_batch_size reports
    of that group; ConfigError for a value the label does not list), or with every group pooled
    (None). With ``withhold``, the histogram of a question below min_batch_size raises
    InsufficientDataError with the command line's message. A survey with a sampling design is
    read with its design (``design`` None, the default, or True; True for a survey without one
    is a ConfigError): each question also carries its per design key statistics joined to the
    frame (``QuestionData.design``: cells for design_estimate and the design tests), and its
    ``estimate``, ``goodness_of_fit`` and ``independence`` are design-based; ``design=False``
    reads it as a simple random sample."""
    surveys = load_surveys(config)
    if survey is None:
        if len(surveys) != 1:
            names = ", ".join(surveys)
            raise ConfigError(f"{config} defines {len(surveys)} surveys: name one ({names})")
        survey = next(iter(surveys))
    if survey not in surveys:
        raise ConfigError(f"{config} has no survey {survey!r} ({', '.join(surveys)})")
    spec = surveys[survey]
    if side is not None and side not in SIDES:
        raise ConfigError(f"side must be one of {', '.join(SIDES)}, got {side!r}")
    if side is not None and not spec.split:
        raise ConfigError(f"survey {spec.id} is not split: it has no sides")
    side = (side or "exploration") if spec.split else ""
    if group:
        try:
            spec.check_group(group)
        except SurveyError as exc:
            raise ConfigError(str(exc)) from None
    if design and spec.design is None:
        raise ConfigError(f"survey {spec.id} has no sampling design (design = {{ table = ... }})")
    design = spec.design is not None and design is not False
    number = SIDES.get(side, 0)
    questions = {}
    with StoreReader(db) as reader:
        reader.check_definitions(surveys, config)
        confirmations.check_readable(reader.connection, spec, number)
        for question in spec.questions:
            n, sums = reader.statistics(
                spec.id, question.id, question.statistic_size, number, group or ""
            )
            stored = ingest.histogram(question, n, sums)
            hist = Histogram(stored.mechanism, n, stored.values, question)
            why = below_release(spec, question, n, group or "")
            keyed = None
            if design:
                from aggregator.analysis.design_data import read_design_data  # the stats: lazily

                keyed = read_design_data(reader.connection, spec, question, number, group or "")
            questions[question.id] = QuestionData(
                question, hist, not why, why if withhold else "", keyed, design
            )
    return SurveyData(spec, questions, side, group or "")
