"""Question definitions, splits and group labels pinned to their data in the PostgreSQL store:
the rules of aggregator/store/definitions.py (the same errors and messages), checked and written
by each node as it starts, in one transaction under the schema's advisory lock, so two nodes
started with different configurations cannot both pin theirs."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping

import psycopg

from aggregator.store.definitions import (
    DefinitionChangedError,
    GroupLabelChangedError,
    SplitChangedError,
    difference,
)
from aggregator.store.postgres.engine import PostgresStore
from aggregator.store.postgres.schema import SCHEMA_LOCK
from aggregator.store.postgres.statistics import question_count, survey_has_reports
from client.survey import GroupLabel, QuestionSpec, SurveySpec


def register(store: PostgresStore, surveys: Mapping[str, SurveySpec], where: object = "") -> None:
    """Pin (or check) every question, split and group label of ``surveys`` and register the
    questions' statistics, in one transaction. A change to a survey or question with reports
    raises DefinitionChangedError (or its Split/GroupLabel kinds), and nothing is written."""
    with store.transaction() as conn:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        for survey in surveys.values():
            _pin_split(conn, survey, where)
            _pin_group_label(conn, survey, where)
            for question in survey.questions:
                _pin(conn, survey.id, question, where)
    for survey in surveys.values():
        for question in survey.questions:
            store.register_question(survey.id, question.id, question.statistic_size)


def check(store: PostgresStore, surveys: Mapping[str, SurveySpec], where: object = "") -> None:
    """The checks of :func:`register` for a command that only reads: the same errors, and
    nothing written (they run in a transaction that is rolled back)."""
    with store.transaction() as conn, conn.transaction(force_rollback=True):
        for survey in surveys.values():
            _pin_split(conn, survey, where)
            _pin_group_label(conn, survey, where)
            for question in survey.questions:
                _pin(conn, survey.id, question, where)


def _pin_split(conn: psycopg.Connection, survey: SurveySpec, where: object) -> None:
    sql = "SELECT exploration_fraction FROM survey_splits WHERE survey_id = %s"
    row = conn.execute(sql, (survey.id,)).fetchone()
    pinned = 0.0 if row is None else row[0]
    if row is not None and pinned == survey.exploration_fraction:
        return
    if pinned != survey.exploration_fraction and survey_has_reports(conn, survey.id):
        raise SplitChangedError(
            f"survey {survey.id}: exploration_fraction is {survey.exploration_fraction!r} in "
            f"{where or 'the configuration'} but the store holds reports split with "
            f"{pinned!r}; the split of a survey with reports cannot change (docs/config.md)"
        )
    conn.execute(
        "INSERT INTO survey_splits VALUES (%s, %s, %s) ON CONFLICT (survey_id) DO UPDATE"
        " SET exploration_fraction = excluded.exploration_fraction, pinned_at = excluded.pinned_at",
        (survey.id, survey.exploration_fraction, int(time.time())),
    )


def _pin_group_label(conn: psycopg.Connection, survey: SurveySpec, where: object) -> None:
    sql = "SELECT name, group_values FROM survey_group_labels WHERE survey_id = %s"
    row = conn.execute(sql, (survey.id,)).fetchone()
    stored = None if row is None else GroupLabel(row[0], tuple(json.loads(row[1])))
    given = survey.group_label
    if stored == given:
        return
    if survey_has_reports(conn, survey.id):
        place = where or "the configuration"
        problem = None
        if stored is None:
            problem = f"{place} adds group label {given.name!r} to it"  # type: ignore[union-attr]
        elif given is None:
            problem = f"{place} removes its group label {stored.name!r}"
        elif given.name != stored.name:
            problem = f"{place} renames group label {stored.name!r} to {given.name!r}"
        else:
            missing = [value for value in stored.values if value not in given.values]
            if missing:
                problem = f"{place} drops {stored.name} value(s) {', '.join(map(repr, missing))}"
        if problem is not None:
            raise GroupLabelChangedError(
                f"survey {survey.id}: the store holds reports, and {problem}; a group label "
                "may only gain values once reports exist (docs/config.md)"
            )
    if given is None:
        conn.execute("DELETE FROM survey_group_labels WHERE survey_id = %s", (survey.id,))
        return
    conn.execute(
        "INSERT INTO survey_group_labels VALUES (%s, %s, %s, %s) ON CONFLICT (survey_id) DO "
        "UPDATE SET name = excluded.name, group_values = excluded.group_values, "
        "pinned_at = excluded.pinned_at",
        (survey.id, given.name, json.dumps(list(given.values)), int(time.time())),
    )


def _pin(conn: psycopg.Connection, survey_id: str, question: QuestionSpec, where: object) -> None:
    key = (survey_id, question.id)
    stored = conn.execute(
        "SELECT definition, digest FROM question_definitions "
        "WHERE survey_id = %s AND question_id = %s",
        key,
    ).fetchone()
    if stored is not None and bytes(stored[1]) == question.digest:
        return
    registered = conn.execute(
        "SELECT k FROM questions WHERE survey_id = %s AND question_id = %s", key
    ).fetchone()
    if question_count(conn, *key):
        if stored is not None:
            field, old, new = difference(json.loads(stored[0]), question.definition())
            raise DefinitionChangedError(
                f"survey {survey_id}, question {question.id}: {field} is {new} in "
                f"{where or 'the configuration'} but the store holds reports randomized with "
                f"{field} = {old}; give the changed question a new id (docs/config.md)"
            )
        if registered is not None and registered[0] != question.statistic_size:
            raise DefinitionChangedError(
                f"survey {survey_id}, question {question.id}: {where or 'the configuration'} "
                f"gives {question.k} categories, the store holds reports with {registered[0]}"
            )
    elif registered is not None and registered[0] != question.statistic_size:
        # no data yet: the statistics follow the configuration
        conn.execute(
            "UPDATE questions SET k = %s WHERE survey_id = %s AND question_id = %s",
            (question.statistic_size, *key),
        )
        conn.execute("DELETE FROM statistic_shards WHERE survey_id = %s AND question_id = %s", key)
    conn.execute(
        "INSERT INTO question_definitions VALUES (%s, %s, %s, %s, %s) ON CONFLICT "
        "(survey_id, question_id) DO UPDATE SET definition = excluded.definition, "
        "digest = excluded.digest, pinned_at = excluded.pinned_at",
        (
            *key,
            json.dumps(question.definition(), sort_keys=True),
            question.digest,
            int(time.time()),
        ),
    )
