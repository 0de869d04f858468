"""Survey definitions from a TOML file (every key, type, default and constraint: docs/config.md).

Example::

    [[survey]]
    id = "wellbeing-2026"
    title = "Wellbeing panel"
    min_batch_size = 100        # release threshold per question (default 100)
    require_device_auth = false   # true: uploads must be signed by an enrolled device key
    rate_per_minute = 30        # optional per-device token bucket: refill rate ...
    burst = 60                  # ... and size (default: one minute's worth)
    max_reports_per_device = 5  # optional cap per device and question (a question may override)
    repeat = "refuse"           # a device's second answer to a question: "refuse" (default) or
                                # "memoize" (resend the first report); a question may override

    [[survey.question]]
    id = "mood"
    text = "How do you feel today?"
    categories = ["great", "fine", "low", "bad"]
    mechanism = "randomized_response"   # or flip_components, optimized_unary,
                                        # hadamard_response, subset_selection,
                                        # local_hashing, public_coin_bit
                                        # (public_seed = ..., groups = ...),
                                        # gaussian (rho = ...), laplace
    epsilon = 1.0

    [[survey.question]]
    id = "smoking_by_exercise"
    mechanism = "randomized_response"
    epsilon = 2.0
    attributes = [
        { name = "smoker", categories = ["no", "yes"] },
        { name = "exercise", categories = ["never", "weekly", "daily"] },
    ]
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aggregator.survey_file.design import check_design_size, read_design
from client.mechanisms import DEFAULT_GRANULARITY_BITS
from client.survey import (
    REFUSE,
    Attribute,
    GroupLabel,
    QuestionSpec,
    SurveyError,
    SurveySpec,
    build_question,
    check_id,
)

#: Release threshold of a survey that sets none: below ~100 reports the normal-approximation
#: intervals are unreliable and one device's report moves an estimate visibly (docs/config.md).
DEFAULT_MIN_BATCH_SIZE = 100
#: The largest privacy parameters a survey file may declare. Past them a report keeps its true
#: answer with probability 1 - e^-100 or more (no privacy left to spend), and the costs and
#: budgets stay finite: epsilon = 1e308 once ended check-config with a traceback.
MAX_PARAMETER = {"epsilon": 100.0, "rho": 10_000.0}

_QUESTION_KEYS = {
    "id",
    "text",
    "categories",
    "attributes",
    "mechanism",
    "epsilon",
    "rho",
    "granularity_bits",
    "max_reports_per_device",
    "household_shared",
    "public_seed",
    "groups",
    "ordinal",
    "scores",
    "repeat",
}

_SURVEY_KEYS = {
    "id",
    "title",
    "min_batch_size",
    "require_device_auth",
    "household_members",
    "exploration_fraction",
    "group_label",
    "group_values",
    "design",  # read by aggregator.survey_file.design
    "rate_per_minute",
    "burst",
    "max_reports_per_device",
    "repeat",
    "question",
    "analysis",  # read by aggregator.survey_file.analyses
}


@dataclass(frozen=True)
class SurveyLimits:
    """One survey's per-device limits; None means unlimited.

    ``one_answer``: the survey authenticates devices, so the aggregator checks that a device
    stores at most one report per question (its repeat policy, refuse or memoize, sends no
    second one); a cap of 1 on every question, refused as a repeated answer (docs/config.md,
    "Repeat answers")."""

    rate_per_minute: float | None = None
    burst: int | None = None
    max_reports_per_device: Mapping[str, int] = field(default_factory=dict)  # by question id
    one_answer: bool = False

    def cap(self, question_id: str) -> int | None:
        return 1 if self.one_answer else self.max_reports_per_device.get(question_id)

    @property
    def declared(self) -> bool:
        """Whether the survey file sets a rate or a cap (beyond the one-answer rule)."""
        return self.rate_per_minute is not None or bool(self.max_reports_per_device)


class ConfigError(ValueError):
    """The survey file is missing, unreadable or invalid (the message names the place)."""


def load_surveys(path: str | os.PathLike[str]) -> dict[str, SurveySpec]:
    """Parse and validate every survey in a TOML file, keyed by survey id."""
    surveys = {}
    for entry in _read(path).get("survey", []):
        try:
            survey = _survey(_with_category_files(entry, Path(path).parent), Path(path).parent)
        except SurveyError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
        if survey.id in surveys:
            raise ConfigError(f"{path}: survey id {survey.id!r} appears twice")
        surveys[survey.id] = survey
    if not surveys:
        raise ConfigError(f"{path}: defines no [[survey]]")
    return surveys


def load_limits(path: str | os.PathLike[str]) -> dict[str, SurveyLimits]:
    """The per-device limits of every survey in a TOML file that sets any, keyed by survey id."""
    limits = {}
    for entry in _read(path).get("survey", []):
        survey_limits = _limits(entry, f"{path}: survey {entry.get('id')}")
        if survey_limits != SurveyLimits():
            limits[str(entry.get("id"))] = survey_limits
    return limits


def load_scores(path: str | os.PathLike[str]) -> dict[tuple[str, str], tuple[float, ...]]:
    """The scores of every question declared ordinal (``ordinal = true``: 1..k, or ``scores``),
    keyed by (survey id, question id): aggregator side only, not part of a definition."""
    scores = {}
    for raw in _read(path).get("survey", []):
        try:
            survey = _with_category_files(raw, Path(path).parent)
        except SurveyError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        for entry in survey.get("question", []):
            where = f"{path}: survey {survey.get('id')}, question {entry.get('id')}"
            try:
                values = _scores(entry, where)
            except SurveyError as exc:
                raise ConfigError(str(exc)) from None
            if values is not None:
                scores[(str(survey.get("id")), str(entry.get("id")))] = values
    return scores


def _scores(entry: Mapping, where: str) -> tuple[float, ...] | None:
    """An ordinal question's category scores: ``scores`` (one finite number per category, not
    all equal), or 1..k for ``ordinal = true``; None for a question not declared ordinal. Only a
    question of one attribute can be ordinal."""
    ordinal, scores = entry.get("ordinal"), entry.get("scores")
    if ordinal is None and scores is None:
        return None
    if ordinal is not None and not isinstance(ordinal, bool):
        raise SurveyError(f"{where}: ordinal must be true or false")
    if ordinal is False:
        if scores is not None:
            raise SurveyError(f"{where}: scores are given but ordinal = false")
        return None
    categories = entry.get("categories")
    if not isinstance(categories, list):
        raise SurveyError(f"{where}: only a question with 'categories' (one attribute) is ordinal")
    k = len(categories)
    if scores is None:
        return tuple(float(j) for j in range(1, k + 1))
    if (
        not isinstance(scores, list)
        or len(scores) != k
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in scores)
        or not all(math.isfinite(v) for v in scores)
    ):
        raise SurveyError(f"{where}: scores must be {k} finite numbers, one per category")
    if len(set(scores)) == 1:
        raise SurveyError(f"{where}: scores must not all be equal")
    return tuple(float(v) for v in scores)


def _read(path: str | os.PathLike[str]) -> dict:
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"survey file not found: {path}") from exc
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read survey file {path}: {exc}") from exc


def _limits(entry: dict, where: str) -> SurveyLimits:
    rate = entry.get("rate_per_minute")
    burst = entry.get("burst")
    if rate is not None:
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate):
            raise ConfigError(f"{where}: rate_per_minute must be a number, got {rate!r}")
        if rate <= 0:
            raise ConfigError(f"{where}: rate_per_minute must be > 0, got {rate!r}")
        burst = _positive_int(burst, "burst", where) if burst is not None else math.ceil(rate)
    elif burst is not None:
        raise ConfigError(f"{where}: burst needs rate_per_minute")
    survey_cap = entry.get("max_reports_per_device")
    one_answer = entry.get("require_device_auth", False) is True
    caps = {}
    for question in entry.get("question", []):
        cap = question.get("max_reports_per_device", survey_cap)
        if cap is not None:
            where_q = f"{where}, question {question.get('id')}"
            caps[str(question.get("id"))] = _positive_int(cap, "max_reports_per_device", where_q)
            if one_answer and cap > 1:
                raise ConfigError(
                    f"{where_q}: max_reports_per_device = {cap} contradicts one answer per "
                    "device, which a survey with require_device_auth enforces (a cap of 1)"
                )
    return SurveyLimits(rate, burst, caps, one_answer)


def _positive_int(value: object, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: {name} must be an integer >= 1, got {value!r}")
    return value


def _with_category_files(entry: dict, folder: Path) -> dict:
    """The survey entry with every ``categories_file`` (of a question or an attribute) replaced
    by the ``categories`` it lists: one label per line, in order, relative to the survey file's
    folder; blank lines and lines starting with ``#`` are skipped. For domains of hundreds or
    thousands of categories (occupations, places) that no one should retype."""
    questions = []
    for question in entry.get("question", []):
        if not isinstance(question, dict):
            return entry  # _survey reports the malformed entry
        where = f"survey {entry.get('id')}, question {question.get('id')}"
        question = _read_categories(question, folder, where)
        attributes = question.get("attributes")
        if isinstance(attributes, list) and all(isinstance(a, dict) for a in attributes):
            attributes = [_read_categories(a, folder, where) for a in attributes]
            question = {**question, "attributes": attributes}
        questions.append(question)
    return {**entry, "question": questions} if "question" in entry else entry


def _read_categories(entry: dict, folder: Path, where: str) -> dict:
    if "categories_file" not in entry:
        return entry
    if "categories" in entry:
        raise SurveyError(f"{where}: give 'categories' or 'categories_file', not both")
    name = entry["categories_file"]
    if not isinstance(name, str) or not name:
        raise SurveyError(f"{where}: categories_file must name a file")
    path = folder / name
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SurveyError(f"{where}: cannot read categories_file {path}: {exc}") from None
    labels = [line.strip() for line in lines]
    labels = [label for label in labels if label and not label.startswith("#")]
    if not labels:
        raise SurveyError(f"{where}: categories_file {path} lists no categories")
    return {key: value for key, value in entry.items() if key != "categories_file"} | {
        "categories": labels
    }


def _survey(entry: dict, folder: Path) -> SurveySpec:
    survey_id = entry.get("id")
    unknown = set(entry) - _SURVEY_KEYS
    if unknown:  # a misspelt limit would otherwise be silently unlimited
        raise SurveyError(f"survey {survey_id}: unknown keys {sorted(unknown)}")
    repeat = entry.get("repeat", REFUSE)
    questions = tuple(_question(q, survey_id, repeat) for q in entry.get("question", []))
    min_batch = entry.get("min_batch_size", DEFAULT_MIN_BATCH_SIZE)
    require_auth = entry.get("require_device_auth", False)
    group_label = _group_label(entry, survey_id)
    design = read_design(entry.get("design"), folder, survey_id)
    check_design_size(design, questions, survey_id)
    return SurveySpec(
        check_id("survey", survey_id),
        str(entry.get("title", "")),
        questions,
        min_batch,
        require_auth,
        household_members=entry.get("household_members", False),
        exploration_fraction=entry.get("exploration_fraction", 0.0),
        group_label=group_label,
        design=design,
    )


def _group_label(entry: dict, survey_id: object) -> GroupLabel | None:
    """The survey's public group label from ``group_label`` (its name) and ``group_values``:
    both or neither."""
    if ("group_label" in entry) != ("group_values" in entry):
        raise SurveyError(f"survey {survey_id}: give both group_label and group_values, or neither")
    if "group_label" not in entry:
        return None
    values = entry["group_values"]
    if not isinstance(values, list):
        raise SurveyError(f"survey {survey_id}: group_values must be a list of strings")
    return GroupLabel(entry["group_label"], tuple(values))


def _question(entry: dict, survey_id: object, repeat: object) -> QuestionSpec:
    question_id = entry.get("id")
    where = f"survey {survey_id}, question {question_id}"
    unknown = set(entry) - _QUESTION_KEYS
    if unknown:
        raise SurveyError(f"{where}: unknown keys {sorted(unknown)}")
    if ("categories" in entry) == ("attributes" in entry):
        raise SurveyError(f"{where}: give exactly one of 'categories' or 'attributes'")
    if "categories" in entry:
        attributes = [Attribute(str(question_id), _labels(entry["categories"], where))]
    else:
        attributes = [
            Attribute(str(a.get("name", "")), _labels(a.get("categories"), where))
            for a in entry["attributes"]
        ]
    _scores(entry, where)
    mechanism = entry.get("mechanism")
    key = "rho" if mechanism == "gaussian" else "epsilon"
    if key not in entry:
        raise SurveyError(f"{where}: mechanism {mechanism!r} needs '{key}'")
    value = entry[key]
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if numeric and value > MAX_PARAMETER[key]:  # nan, inf and <= 0: the mechanism refuses them
        raise SurveyError(f"{where}: {key} must be at most {MAX_PARAMETER[key]:g}, got {value:g}")
    return build_question(
        check_id("question", question_id),
        str(entry.get("text", "")),
        attributes,
        mechanism,
        entry[key],
        entry.get("granularity_bits", DEFAULT_GRANULARITY_BITS),
        household_shared=entry.get("household_shared", False),
        public_seed=entry.get("public_seed"),
        groups=entry.get("groups"),
        repeat=entry.get("repeat", repeat),
    )


def _labels(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SurveyError(f"{where}: categories must be a list of strings")
    return tuple(value)
