"""A preregistered confirmatory plan: the family of tests, its level and multiplicity rule, fixed
(and hashed) before the confirmation side may be read.

Example ``plan.toml``::

    survey = "wellbeing-2026"
    alpha = 0.05
    multiplicity = "holm"            # or "bonferroni"

    [[test]]
    title = "Mood is not uniform"
    question = "mood"
    test = "goodness_of_fit"
    p0 = [0.25, 0.25, 0.25, 0.25]

    [[test]]
    question = "smoking_by_exercise"
    test = "independence"

The plan's identity is the SHA-256 of the file's exact bytes: what was registered is what runs.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path

from aggregator.survey_file.analyses import KEYS, Analysis, parse_analysis
from aggregator.survey_file.config import ConfigError
from client.survey import SurveySpec

MULTIPLICITY = ("holm", "bonferroni")
_PLAN_KEYS = {"survey", "alpha", "multiplicity", "test"}
_TEST_KEYS = KEYS - {"alpha"}  # one level for the whole family


@dataclass(frozen=True)
class Plan:
    """A parsed plan and the bytes it was parsed from (kept, so a sealed result can show them)."""

    survey_id: str
    alpha: float
    multiplicity: str
    tests: tuple[Analysis, ...]
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def parse_plan(text: str, surveys: dict[str, SurveySpec], where: str = "plan") -> Plan:
    """Check a plan's text against the loaded surveys; a mistake raises ConfigError naming it."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    unknown = sorted(set(document) - _PLAN_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    survey_id = document.get("survey")
    survey = surveys.get(survey_id) if isinstance(survey_id, str) else None
    if survey is None:
        raise ConfigError(f"{where}: 'survey' must name a survey of the config file")
    alpha = document.get("alpha", 0.05)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 1:
        raise ConfigError(f"{where}: alpha must be a number in (0, 1), got {alpha!r}")
    multiplicity = document.get("multiplicity", "holm")
    if multiplicity not in MULTIPLICITY:
        raise ConfigError(f"{where}: multiplicity must be one of {', '.join(MULTIPLICITY)}")
    entries = document.get("test", [])
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{where}: a plan declares at least one [[test]]")
    tests = tuple(
        parse_analysis(entry, survey, f"{where}: test {number}", _TEST_KEYS)
        for number, entry in enumerate(entries, start=1)
    )
    return Plan(survey.id, float(alpha), multiplicity, tests, text)


def load_plan(path: str | Path, surveys: dict[str, SurveySpec]) -> Plan:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return parse_plan(text, surveys, str(path))
