"""Survey definitions from a TOML file.

Example::

    [[survey]]
    id = "wellbeing-2026"
    title = "Wellbeing panel"
    min_batch_size = 100
    require_device_auth = false   # true: uploads must be signed by an enrolled device key

    [[survey.question]]
    id = "mood"
    text = "How do you feel today?"
    categories = ["great", "fine", "low", "bad"]
    mechanism = "randomized_response"   # or flip_components, gaussian (rho = ...), laplace
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

import tomllib
from pathlib import Path

from client.mechanisms import DEFAULT_GRANULARITY_BITS
from client.survey import Attribute, QuestionSpec, SurveyError, SurveySpec, build_question

_QUESTION_KEYS = {
    "id",
    "text",
    "categories",
    "attributes",
    "mechanism",
    "epsilon",
    "rho",
    "granularity_bits",
}


class ConfigError(ValueError):
    """The survey file is missing, unreadable or invalid (the message names the place)."""


def load_surveys(path: str | Path) -> dict[str, SurveySpec]:
    """Parse and validate every survey in a TOML file, keyed by survey id."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"survey file not found: {path}") from exc
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read survey file {path}: {exc}") from exc
    surveys = {}
    for entry in data.get("survey", []):
        try:
            survey = _survey(entry)
        except SurveyError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
        if survey.id in surveys:
            raise ConfigError(f"{path}: survey id {survey.id!r} appears twice")
        surveys[survey.id] = survey
    if not surveys:
        raise ConfigError(f"{path}: defines no [[survey]]")
    return surveys


def _survey(entry: dict) -> SurveySpec:
    survey_id = entry.get("id")
    questions = tuple(_question(q, survey_id) for q in entry.get("question", []))
    min_batch = entry.get("min_batch_size", 1)
    require_auth = entry.get("require_device_auth", False)
    return SurveySpec(survey_id, str(entry.get("title", "")), questions, min_batch, require_auth)


def _question(entry: dict, survey_id: object) -> QuestionSpec:
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
    mechanism = entry.get("mechanism")
    key = "rho" if mechanism == "gaussian" else "epsilon"
    if key not in entry:
        raise SurveyError(f"{where}: mechanism {mechanism!r} needs '{key}'")
    return build_question(
        question_id,  # type: ignore[arg-type]
        str(entry.get("text", "")),
        attributes,
        mechanism,  # type: ignore[arg-type]
        entry[key],
        entry.get("granularity_bits", DEFAULT_GRANULARITY_BITS),
    )


def _labels(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SurveyError(f"{where}: categories must be a list of strings")
    return tuple(value)
