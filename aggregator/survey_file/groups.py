"""Two groups to compare (two-sample tests): both questions must randomize and read their
reports the same way, or their histograms say nothing about each other."""

from __future__ import annotations

from aggregator.errors import IncompatibleHistogramsError
from client.survey import QuestionSpec


def check_same_definition(a: QuestionSpec, b: QuestionSpec, names: tuple[str, str]) -> None:
    """Refuse, saying what differs, unless ``a`` and ``b`` share mechanism, parameters and
    categories (their ids, texts and attribute names may differ). ``names`` label them."""
    first, second = _definition(a), _definition(b)
    if first == second:
        return
    for key in [*first, *(key for key in second if key not in first)]:  # mechanism first
        if first.get(key) != second.get(key):
            what = "categories" if key == "attributes" else key
            raise IncompatibleHistogramsError(
                f"two-sample test needs the same question definition: {names[0]} and "
                f"{names[1]} differ in {what} ({_brief(first.get(key))} vs "
                f"{_brief(second.get(key))})"
            )


def _definition(question: QuestionSpec) -> dict[str, object]:
    """The question's definition with each attribute reduced to its categories."""
    definition = question.definition()
    definition["attributes"] = [list(a.categories) for a in question.attributes]
    return definition


def _brief(value: object) -> str:
    if isinstance(value, list):  # attributes: their categories, joined
        return "; ".join(",".join(categories) for categories in value)
    return str(value)


def two_sample_request_problem(a: tuple[str, str, str], b: tuple[str, str, str]) -> str | None:
    """What is wrong with comparing ``a`` and ``b``, each (survey, question, group); None if
    nothing. Either two different questions (no groups), or one question split by two
    different values of its survey's public group label."""
    if bool(a[2]) != bool(b[2]):
        return "give both groups or neither"
    if a[2]:
        if a[:2] != b[:2]:
            return (
                "groups compare one question: survey and question of B must be empty or equal "
                "to those of A"
            )
        if a[2] == b[2]:
            return f"A and B name the same group {a[2]!r}: a two-sample test compares two groups"
        return None
    if a[:2] == b[:2]:
        return "A and B name the same question: a two-sample test compares two groups"
    return None


def group_name(survey_id: str, question_id: str, group: str = "") -> str:
    """How a compared group is named in messages: survey/question, with [group] if any."""
    return f"{survey_id}/{question_id}" + (f"[{group}]" if group else "")
