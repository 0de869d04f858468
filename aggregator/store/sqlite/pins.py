"""Question definitions, splits and group labels pinned to their data in a report store file
(SQLite): the rules of aggregator/store/definitions.py, pinned in one transaction of the store's
writer as it is served, or checked on a read-only connection by a command that only reads."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping

from aggregator.store.definitions import (
    DefinitionChangedError,
    GroupLabelChangedError,
    SplitChangedError,
    difference,
)
from aggregator.store.sqlite.connection import has_table
from aggregator.store.sqlite.report_store import ReportStore
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
