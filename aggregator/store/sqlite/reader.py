"""A read-only view of a report store, for the commands and the Python loader that only read.

It opens the file as a report store (wrong kind, corrupt file, directory, newer version: one
FileKindError), never creates or changes anything, and checks the configuration against the
pinned definitions before any number is read, so a changed config can never reinterpret data.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import closing

import numpy as np

from aggregator.store.sqlite import pins
from aggregator.store.sqlite.connection import has_table
from aggregator.store.sqlite.file_kind import open_read_only
from aggregator.store.sqlite.schema import STORE_KIND
from client.survey import SurveySpec


class StoreReader:
    """Committed statistics and reports of one store file, read only."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._conn = open_read_only(path, STORE_KIND)

    def check_definitions(self, surveys: Mapping[str, SurveySpec], where: object = "") -> None:
        """DefinitionChangedError if ``surveys`` change a question that has reports here."""
        pins.check(self._conn, surveys, where)

    def statistics(
        self, survey_id: str, question_id: str, k: int, side: int = 0, group: str = ""
    ) -> tuple[int, np.ndarray]:
        """The question's (n, int64 sums) on ``side`` (0: a survey that is not split) and of
        ``group`` ('': all groups pooled); (0, zeros) for a question, side or group with no
        row yet."""
        key = (survey_id, question_id)
        if group:
            if not has_table(self._conn, "group_statistics"):
                return 0, np.zeros(k, dtype=np.int64)  # a store from before group labels
            sql = (
                "SELECT n, sums FROM group_statistics WHERE survey_id = ? AND question_id = ?"
                " AND side = ? AND group_value = ?"
            )
            row = self._conn.execute(sql, (*key, side, group)).fetchone()
        elif side:
            if not has_table(self._conn, "side_statistics"):
                return 0, np.zeros(k, dtype=np.int64)  # a store from before splits
            sql = "SELECT n, sums FROM side_statistics WHERE survey_id = ? AND question_id = ?"
            row = self._conn.execute(sql + " AND side = ?", (*key, side)).fetchone()
        else:
            sql = "SELECT n, sums FROM statistics WHERE survey_id = ? AND question_id = ?"
            row = self._conn.execute(sql, key).fetchone()
        if row is None:
            return 0, np.zeros(k, dtype=np.int64)
        return row[0], np.frombuffer(row[1], dtype="<i8").astype(np.int64)

    @property
    def connection(self) -> sqlite3.Connection:
        """The read-only connection (for the store's other read-only modules)."""
        return self._conn

    def iter_reports(
        self,
        survey_id: str,
        question_id: str | None = None,
        batch: int = 10000,
        side: int | None = None,
    ) -> Iterator[tuple[bytes, str, bytes, str]]:
        """(report_id, question_id, payload, group) in report_id order, from one snapshot."""
        sql = "SELECT report_id, question_id, payload, group_value FROM reports WHERE survey_id = ?"
        params: tuple[str | int, ...] = (survey_id,)
        if question_id is not None:
            sql += " AND question_id = ?"
            params += (question_id,)
        if side is not None:  # one side of a split survey
            sql += " AND side = ?"
            params += (side,)
        with closing(self._conn.execute(sql + " ORDER BY report_id", params)) as cursor:
            while rows := cursor.fetchmany(batch):
                yield from rows

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
