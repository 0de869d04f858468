"""Question definitions pinned to their data.

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

import json
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import replace

from aggregator.store.sqlite.report_store import ReportStore, StoreError
from client.survey import GroupLabel, QuestionSpec, SurveySpec

_SCHEMA = """
CREATE TABLE IF NOT EXISTS question_definitions (
    survey_id TEXT NOT NULL,
    question_id TEXT NOT NULL,
    definition TEXT NOT NULL,
    digest BLOB NOT NULL,
    pinned_at INTEGER NOT NULL,
    PRIMARY KEY (survey_id, question_id)
);
CREATE TABLE IF NOT EXISTS survey_splits (
    survey_id TEXT PRIMARY KEY,
    exploration_fraction REAL NOT NULL,
    pinned_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS survey_group_labels (
    survey_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    group_values TEXT NOT NULL,
    pinned_at INTEGER NOT NULL
);
"""


class DefinitionChangedError(StoreError):
    """The configuration changes a question that already has reports in the store."""


class SplitChangedError(DefinitionChangedError):
    """The configuration changes the split of a survey that already has reports."""


class GroupLabelChangedError(DefinitionChangedError):
    """The configuration renames, removes or drops values of the group label of a survey that
    already has reports (adding values is allowed)."""


def register(store: ReportStore, surveys: Mapping[str, SurveySpec], where: object = "") -> None:
    """Pin (or check) every question of ``surveys`` in the store and register its statistics,
    in one transaction. Raises DefinitionChangedError for a changed question with reports."""

    def pin_all(conn: sqlite3.Connection) -> None:
        for statement in _SCHEMA.split(";"):
            conn.execute(statement)
        for survey in surveys.values():
            _pin_split(conn, survey, where)
            _pin_group_label(conn, survey, where)
            for question in survey.questions:
                _pin(conn, survey.id, question, where)

    store.run_in_writer(pin_all)
    for survey in surveys.values():
        for question in survey.questions:
            store.register_question(survey.id, question.id, question.statistic_size)


def check(conn: sqlite3.Connection, surveys: Mapping[str, SurveySpec], where: object = "") -> None:
    """Refuse (DefinitionChangedError) a configuration that changes a question with reports,
    reading only: for read-only commands on a connection of their own."""
    has_pins = has_table(conn, "question_definitions")
    for survey in surveys.values():
        _check_split(conn, survey, _stored_split(conn, survey.id), where)
        _check_group_label(conn, survey, _stored_group_label(conn, survey.id), where)
        for question in survey.questions:
            n, k = _count(conn, survey.id, question.id)
            if not n:
                continue
            stored = _stored(conn, survey.id, question.id) if has_pins else None
            if stored is not None and stored[1] != question.digest:
                raise _changed(survey.id, question, json.loads(stored[0]), where)
            if (
                stored is None and k != question.statistic_size
            ):  # a store from before pins: k is all we know
                raise DefinitionChangedError(
                    f"survey {survey.id}, question {question.id}: {where or 'the configuration'} "
                    f"gives {question.k} categories, the store holds reports with {k}"
                )


def has_table(conn: sqlite3.Connection, name: str) -> bool:
    sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    return conn.execute(sql, (name,)).fetchone() is not None


def _stored_split(conn: sqlite3.Connection, survey_id: str) -> float | None:
    if not has_table(conn, "survey_splits"):
        return None
    sql = "SELECT exploration_fraction FROM survey_splits WHERE survey_id = ?"
    row = conn.execute(sql, (survey_id,)).fetchone()
    return None if row is None else row[0]


def _survey_has_reports(conn: sqlite3.Connection, survey: SurveySpec) -> bool:
    return any(_count(conn, survey.id, question.id)[0] for question in survey.questions)


def _check_split(
    conn: sqlite3.Connection, survey: SurveySpec, stored: float | None, where: object
) -> None:
    """SplitChangedError if the survey has reports and ``survey`` gives another split."""
    pinned = 0.0 if stored is None else stored
    if pinned != survey.exploration_fraction and _survey_has_reports(conn, survey):
        raise SplitChangedError(
            f"survey {survey.id}: exploration_fraction is {survey.exploration_fraction!r} in "
            f"{where or 'the configuration'} but the store holds reports split with "
            f"{pinned!r}; the split of a survey with reports cannot change (docs/config.md)"
        )


def _pin_split(conn: sqlite3.Connection, survey: SurveySpec, where: object) -> None:
    stored = _stored_split(conn, survey.id)
    if stored == survey.exploration_fraction:
        return
    _check_split(conn, survey, stored, where)
    conn.execute(
        "INSERT OR REPLACE INTO survey_splits VALUES (?, ?, ?)",
        (survey.id, survey.exploration_fraction, int(time.time())),
    )


def _stored_group_label(conn: sqlite3.Connection, survey_id: str) -> GroupLabel | None:
    if not has_table(conn, "survey_group_labels"):
        return None
    sql = "SELECT name, group_values FROM survey_group_labels WHERE survey_id = ?"
    row = conn.execute(sql, (survey_id,)).fetchone()
    return None if row is None else GroupLabel(row[0], tuple(json.loads(row[1])))


def _check_group_label(
    conn: sqlite3.Connection, survey: SurveySpec, stored: GroupLabel | None, where: object
) -> None:
    """GroupLabelChangedError if the survey has reports and ``survey``'s group label is not the
    pinned one (no label pinned: the reports were collected without groups) or the pinned one
    with values added."""
    given = survey.group_label
    if given == stored or not _survey_has_reports(conn, survey):
        return
    place = where or "the configuration"
    if stored is None:
        problem = f"{place} adds group label {given.name!r} to it"  # type: ignore[union-attr]
    elif given is None:
        problem = f"{place} removes its group label {stored.name!r}"
    elif given.name != stored.name:
        problem = f"{place} renames group label {stored.name!r} to {given.name!r}"
    else:
        missing = [value for value in stored.values if value not in given.values]
        if not missing:
            return  # values added: a new wave
        problem = f"{place} drops {stored.name} value(s) {', '.join(map(repr, missing))}"
    raise GroupLabelChangedError(
        f"survey {survey.id}: the store holds reports, and {problem}; a group label may only "
        "gain values once reports exist (docs/config.md)"
    )


def _pin_group_label(conn: sqlite3.Connection, survey: SurveySpec, where: object) -> None:
    stored = _stored_group_label(conn, survey.id)
    if stored == survey.group_label:
        return
    _check_group_label(conn, survey, stored, where)
    if survey.group_label is None:
        conn.execute("DELETE FROM survey_group_labels WHERE survey_id = ?", (survey.id,))
        return
    conn.execute(
        "INSERT OR REPLACE INTO survey_group_labels VALUES (?, ?, ?, ?)",
        (
            survey.id,
            survey.group_label.name,
            json.dumps(list(survey.group_label.values)),
            int(time.time()),
        ),
    )


def _pin(conn: sqlite3.Connection, survey_id: str, question: QuestionSpec, where: object) -> None:
    stored = _stored(conn, survey_id, question.id)
    n, k = _count(conn, survey_id, question.id)
    definition = json.dumps(question.definition(), sort_keys=True)
    if stored is not None and stored[1] == question.digest:
        return
    if n:
        if stored is not None:
            raise _changed(survey_id, question, json.loads(stored[0]), where)
        if k != question.statistic_size:
            raise DefinitionChangedError(
                f"survey {survey_id}, question {question.id}: {where or 'the configuration'} "
                f"gives {question.k} categories, the store holds reports with {k}"
            )
    elif (
        k is not None and k != question.statistic_size
    ):  # no data yet: the statistics follow the config
        conn.execute(
            "UPDATE statistics SET k = ?, sums = ? WHERE survey_id = ? AND question_id = ?",
            (question.statistic_size, bytes(8 * question.statistic_size), survey_id, question.id),
        )
        for table in ("side_statistics", "group_statistics"):
            conn.execute(
                f"DELETE FROM {table} WHERE survey_id = ? AND question_id = ?",
                (survey_id, question.id),
            )
    conn.execute(
        "INSERT OR REPLACE INTO question_definitions VALUES (?, ?, ?, ?, ?)",
        (survey_id, question.id, definition, question.digest, int(time.time())),
    )


def _stored(conn: sqlite3.Connection, survey_id: str, question_id: str) -> tuple[str, bytes] | None:
    return conn.execute(
        "SELECT definition, digest FROM question_definitions "
        "WHERE survey_id = ? AND question_id = ?",
        (survey_id, question_id),
    ).fetchone()


def _count(conn: sqlite3.Connection, survey_id: str, question_id: str) -> tuple[int, int | None]:
    """(reports on every side, k) of a question; (0, None) if it is not registered."""
    key = (survey_id, question_id)
    row = conn.execute(
        "SELECT n, k FROM statistics WHERE survey_id = ? AND question_id = ?", key
    ).fetchone()
    if row is None:
        return 0, None
    n = row[0]
    if has_table(conn, "side_statistics"):
        sql = "SELECT sum(n) FROM side_statistics WHERE survey_id = ? AND question_id = ?"
        n += conn.execute(sql, key).fetchone()[0] or 0
    return n, row[1]


def _changed(
    survey_id: str, question: QuestionSpec, stored: dict, where: object
) -> DefinitionChangedError:
    field, old, new = difference(stored, question.definition())
    return DefinitionChangedError(
        f"survey {survey_id}, question {question.id}: {field} is {new} in "
        f"{where or 'the configuration'} but the store holds reports randomized with "
        f"{field} = {old}; give the changed question a new id (docs/config.md)"
    )


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
