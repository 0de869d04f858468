"""Declared tests: the optional analysis section of a survey file (the tests a survey report
runs) and the tests of a preregistered confirmatory plan share this shape and its checks.

Example (in a survey file)::

    [[survey.analysis]]
    title = "Is mood uniform?"          # optional; a default title names the test and question
    question = "mood"
    test = "goodness_of_fit"            # or "independence" (questions with two attributes),
                                        # or "two_sample" (two groups of the survey's label)
    p0 = [0.25, 0.25, 0.25, 0.25]       # goodness_of_fit only: one probability per category,
                                        # "uniform", or a table {great = 0.4, fine = 0.3, ...}
    groups = ["control", "treatment"]   # two_sample only: two values of group_values
    alpha = 0.05                        # optional, default 0.05
    sequential = true                   # optional: also monitor it anytime-valid (watch, the
                                        # report's "as of n"): stop once the e-value passes
                                        # 1/alpha, or at max_n reports
    max_n = 20000                       # optional, sequential only: the planned maximum n
    design = false                      # optional, a survey with a sampling design only: run
                                        # it as a simple random sample (default true there:
                                        # the design-based Rao-Scott test; the answer says
                                        # when it ignores the design)
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from aggregator.errors import ClusteredReportsError
from aggregator.survey_file.config import ConfigError
from aggregator.survey_file.design import design_refusal
from aggregator.survey_file.null_text import NullTextError, parse_null
from client.survey import QuestionSpec, SurveySpec

TESTS = ("goodness_of_fit", "independence", "two_sample")
KEYS = frozenset({"title", "question", "test", "p0", "groups", "alpha", "design"})
#: What a survey file's analysis may add: the anytime-valid stopping rule (docs/monitoring.md).
#: Not in KEYS: a confirmatory plan's tests are fixed-n.
SEQUENTIAL_KEYS = frozenset({"sequential", "max_n"})


@dataclass(frozen=True)
class Analysis:
    """One declared test: which question, which test, its null (goodness of fit), the two
    groups it compares (two-sample), its level, and whether it is design-based (the default
    for a survey with a sampling design)."""

    title: str
    question_id: str
    test: str
    alpha: float = 0.05
    p0: tuple[float, ...] | None = None
    groups: tuple[str, str] | None = None
    sequential: bool = False
    max_n: int | None = None
    design: bool = False


def check_independent(survey: SurveySpec, question: QuestionSpec) -> None:
    """Refuse (ClusteredReportsError) a test on a question whose reports may come from several
    members of one household (privacy-accounting spec §D.3): the survey declares
    ``household_members`` and the question is not ``household_shared``, the tag under which devices
    let only one respondent per household answer. Estimates stay available; only tests assume
    independent reports."""
    if survey.household_members and not question.household_shared:
        raise ClusteredReportsError(
            f"survey {survey.id}, question {question.id}: no test runs here, because several "
            "members of one household may have answered (household_members = true) and their "
            "reports are not independent (Type I error 0.05 -> 0.30 in docs/households.md); "
            "tag the question household_shared = true so one respondent per household answers "
            "(docs/households.md)"
        )


def load_analyses(path: str | Path, surveys: dict[str, SurveySpec]) -> dict[str, list[Analysis]]:
    """The declared analyses of every survey in a TOML file, keyed by survey id (checked against
    the already loaded ``surveys``); a mistake raises ConfigError naming its place."""
    try:
        document = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    found: dict[str, list[Analysis]] = {}
    for entry in document.get("survey", []):
        survey = surveys.get(entry.get("id"))
        if survey is None:
            continue
        analyses = entry.get("analysis", [])
        if not isinstance(analyses, list):
            raise ConfigError(
                f"{path}: survey {survey.id!r}: 'analysis' must be [[survey.analysis]]"
            )
        found[survey.id] = [
            parse_analysis(
                item,
                survey,
                f"{path}: survey {survey.id!r} analysis {number}",
                KEYS | SEQUENTIAL_KEYS,
            )
            for number, item in enumerate(analyses, start=1)
        ]
    return found


def parse_analysis(
    entry: object, survey: SurveySpec, where: str, keys: frozenset[str] = KEYS
) -> Analysis:
    """One declared test from its TOML table; ``where`` prefixes every error message and
    ``keys`` are the keys allowed (a confirmatory plan takes its level from the family)."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: must be a table")
    unknown = sorted(set(entry) - keys)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    question_id = entry.get("question")
    try:
        question = survey.question(str(question_id))
    except KeyError:
        raise ConfigError(f"{where}: no question {question_id!r} in this survey") from None
    test = entry.get("test")
    if test not in TESTS:
        raise ConfigError(f"{where}: test must be one of {', '.join(TESTS)}, got {test!r}")
    alpha = entry.get("alpha", 0.05)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 1:
        raise ConfigError(f"{where}: alpha must be a number in (0, 1), got {alpha!r}")
    p0 = entry.get("p0")
    if test != "goodness_of_fit" and p0 is not None:
        raise ConfigError(f"{where}: only goodness_of_fit takes p0 ({test}'s null is fitted)")
    if test != "two_sample" and "groups" in entry:
        raise ConfigError(f"{where}: only two_sample compares groups")
    p0_values, groups = None, None
    if test == "independence" and len(question.shape) != 2:
        raise ConfigError(f"{where}: independence needs a question with two attributes")
    if test == "goodness_of_fit":
        p0_values = _p0(p0, question, where)
    if test == "two_sample":
        groups = _groups(entry.get("groups"), survey, where)
    try:
        check_independent(survey, question)
    except ClusteredReportsError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    default_title = f"{test.replace('_', ' ')}: {question.id}"
    if groups:
        default_title += f", {groups[0]} vs {groups[1]}"
    title = entry.get("title") or default_title
    sequential, max_n = _stopping_rule(entry, where)
    if sequential and survey.design is not None:
        raise ConfigError(f"{where}: sequential: {design_refusal(survey.id)}")
    design = _design(entry, survey, where)
    return Analysis(
        str(title), question.id, test, float(alpha), p0_values, groups, sequential, max_n, design
    )


def _design(entry: dict, survey: SurveySpec, where: str) -> bool:
    """Whether the test is design-based: ``design`` (a boolean), by default whether the survey
    declares a sampling design; ``design = true`` without one is a mistake."""
    declared = survey.design is not None
    design = entry.get("design", declared)
    if not isinstance(design, bool):
        raise ConfigError(f"{where}: design must be true or false, got {design!r}")
    if design and not declared:
        raise ConfigError(
            f"{where}: design = true, but survey {survey.id!r} declares no sampling design"
        )
    return design


def _stopping_rule(entry: dict, where: str) -> tuple[bool, int | None]:
    """``sequential`` (a boolean) and ``max_n`` (a positive integer, only with sequential)."""
    sequential = entry.get("sequential", False)
    if not isinstance(sequential, bool):
        raise ConfigError(f"{where}: sequential must be true or false, got {sequential!r}")
    max_n = entry.get("max_n")
    if max_n is not None:
        if not sequential:
            raise ConfigError(f"{where}: max_n is the stopping rule of a sequential analysis")
        if isinstance(max_n, bool) or not isinstance(max_n, int) or max_n < 1:
            raise ConfigError(f"{where}: max_n must be a positive integer, got {max_n!r}")
    return sequential, max_n


def _groups(groups: object, survey: SurveySpec, where: str) -> tuple[str, str]:
    """Two distinct values of the survey's public group label (docs/two-sample.md)."""
    label = survey.group_label
    if label is None:
        raise ConfigError(
            f"{where}: two_sample compares two groups of the survey's group label, and survey "
            f"{survey.id!r} declares none (group_label, group_values)"
        )
    if not isinstance(groups, list) or len(groups) != 2:
        raise ConfigError(
            f"{where}: two_sample needs groups = [A, B], two of {', '.join(label.values)}"
        )
    unknown = [g for g in groups if g not in label.values]
    if unknown:
        raise ConfigError(
            f"{where}: unknown {label.name} {unknown[0]!r}; expected one of "
            f"{', '.join(label.values)}"
        )
    if groups[0] == groups[1]:
        raise ConfigError(f"{where}: groups names {groups[0]!r} twice; compare two groups")
    return groups[0], groups[1]


def _p0(p0: object, question: QuestionSpec, where: str) -> tuple[float, ...]:
    """The declared null (a list, ``"uniform"`` or a label table; no file, because a plan's
    hash must cover its null)."""
    if p0 is None:
        raise ConfigError(f'{where}: goodness_of_fit needs p0 (a list, "uniform" or a table)')
    if isinstance(p0, str) and p0.strip().startswith("@"):
        raise ConfigError(f"{where}: p0 cannot name a file here; write the values in the file")
    try:
        return parse_null(p0, question.labels, "p0")
    except NullTextError as exc:
        raise ConfigError(f"{where}: {exc}") from None


#: The label of everything computed on a split survey's exploration side (CLI, RPCs, reports).
EXPLORATORY = (
    "exploratory: the exploration side of a split survey; free to look at, not a confirmatory "
    "result (docs/adaptive-analysis.md)"
)
