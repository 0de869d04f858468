"""Question definitions pinned to their data: the rules and their errors and messages, the same on
every engine (each pins with its own statements: sqlite/pins.py, postgres/pins.py).

A store's reports mean something only under the definition they were randomized with (mechanism,
parameter, grid, categories). The store keeps each question's definition beside its statistics;
until the question has a report the pin follows the configuration, from the first report on a
configuration that changes it is refused, naming survey, question, field, stored and given value
(a changed question needs a new question id: docs/config.md, "Changing a question"). A store
written before pins existed is pinned to the configuration it is next served with.

A survey's exploration/confirmation split (``exploration_fraction``) is pinned the same way:
once the survey has a report, a configuration with another fraction is refused (the sides of the
stored reports were decided with the pinned one). A survey with reports and no pin was collected
without a split.

A survey's public group label (``group_label``, ``group_values``) is pinned too: once the survey
has a report, the label's name and every pinned value must stay; values may only be added (a new
wave). A removed or renamed value would silently reinterpret the stored reports' groups.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from aggregator.store.errors import StoreError
from client.survey import SurveySpec


class DefinitionChangedError(StoreError):
    """The configuration changes a question that already has reports in the store."""


class SplitChangedError(DefinitionChangedError):
    """The configuration changes the split of a survey that already has reports."""


class GroupLabelChangedError(DefinitionChangedError):
    """The configuration renames, removes or drops values of the group label of a survey that
    already has reports (adding values is allowed)."""


SHOWN = 3  # differing labels named in a message; the rest are counted
_LONGEST = 40  # characters of one label or value in a message


def _short(value: object) -> str:
    """``repr(value)``, cut to a readable length."""
    text = repr(value)
    return text if len(text) <= _LONGEST else text[: _LONGEST - 3] + "..."


def difference(stored: Mapping, given: Mapping) -> tuple[str, str, str]:
    """The first field in which two question definitions differ, as (field, stored, given)
    texts for a one-line message: of category labels, only the ones that differ (a few, the
    rest counted), so renaming one of 2,000 labels names that one."""
    for key in ("mechanism", "epsilon", "rho", "granularity_bits", "public_seed", "groups"):
        if stored.get(key) != given.get(key):
            return key, _short(stored.get(key)), _short(given.get(key))
    shared = bool(stored.get("household_shared")), bool(given.get("household_shared"))
    if shared[0] != shared[1]:
        return "household_shared", repr(shared[0]), repr(shared[1])
    old, new = stored["attributes"], given["attributes"]
    if len(old) != len(new):
        return "number of attributes", str(len(old)), str(len(new))
    for i, (a, b) in enumerate(zip(old, new, strict=True)):
        name = "" if len(old) == 1 else f"attribute {i + 1} "
        if a["name"] != b["name"]:
            return f"{name or 'attribute '}name", _short(a["name"]), _short(b["name"])
        if a["categories"] != b["categories"]:
            return _labels_change(name, a["categories"], b["categories"])
    keys = sorted(k for k in stored.keys() | given.keys() if stored.get(k) != given.get(k))
    return (
        ", ".join(keys[:SHOWN]) or "definition",
        ", ".join(_short(stored.get(k)) for k in keys[:SHOWN]),
        ", ".join(_short(given.get(k)) for k in keys[:SHOWN]),
    )


def _labels_change(name: str, old: list[str], new: list[str]) -> tuple[str, str, str]:
    """(field, stored, given) naming the first few labels that differ: by position when the
    count is the same (renamed or reordered), else those removed and added."""
    if len(old) == len(new):
        at = [j for j, (a, b) in enumerate(zip(old, new, strict=True)) if a != b]
        shown = at[:SHOWN]
        more = f" (and {len(at) - SHOWN:,} more of {len(old):,})" if len(at) > SHOWN else ""
        what = "category" if len(at) == 1 else "categories"
        field = f"{name}{what} {', '.join(str(j + 1) for j in shown)}{more}"
        return (
            field,
            ", ".join(_short(old[j]) for j in shown),
            ", ".join(_short(new[j]) for j in shown),
        )
    kept, given = set(old), set(new)
    removed = [label for label in old if label not in given]
    added = [label for label in new if label not in kept]
    stored_text = _some_labels(len(old), removed, "only")
    return f"{name}categories", stored_text, _some_labels(len(new), added, "new")


def _some_labels(total: int, labels: list[str], kind: str) -> str:
    """'2,001 labels, new: 'x' (and 3 more)' for a message."""
    if not labels:
        return f"{total:,} labels"
    more = f" (and {len(labels) - SHOWN:,} more)" if len(labels) > SHOWN else ""
    return f"{total:,} labels, {kind}: {', '.join(_short(x) for x in labels[:SHOWN])}{more}"


def reads_as(stored: SurveySpec, given: SurveySpec | None) -> bool:
    """Whether reports collected under ``stored`` (a shard manifest's survey) are read the same
    under ``given``: the same survey, or one whose group label gained values (a new wave)."""
    if given is None or stored == given:
        return stored == given
    old, new = stored.group_label, given.group_label
    if old is None or new is None or old.name != new.name:
        return False
    if not set(old.values) <= set(new.values):
        return False
    return replace(stored, group_label=new) == given


def survey_change(stored: SurveySpec, given: SurveySpec | None, where: object = "") -> str:
    """One line saying how ``given`` (from a survey file) differs from ``stored`` (e.g. a shard
    manifest's survey): the first changed question and field, or the survey-level key."""
    place = where or "the configuration"
    if given is None:
        return f"survey {stored.id} is not defined in {place}"
    questions = {q.id: q for q in given.questions}
    for question in stored.questions:
        new = questions.get(question.id)
        if new is None:
            return f"survey {stored.id}, question {question.id}: missing in {place}"
        if new.digest != question.digest:
            field, old, value = difference(question.definition(), new.definition())
            return (
                f"survey {stored.id}, question {question.id}: {field} is {value} in {place} "
                f"but the reports were randomized with {field} = {old}"
            )
    keys = ("title", "min_batch_size", "require_device_auth", "exploration_fraction", "group_label")
    for key in keys:
        if getattr(stored, key) != getattr(given, key):
            return (
                f"survey {stored.id}: {key} is {getattr(given, key)!r} in {place}, "
                f"{getattr(stored, key)!r} in the reports' definition"
            )
    return f"survey {stored.id}: the questions differ from {place} (ids, order or wording)"
