"""The device's durable cache of survey definitions, in the device state file.

A field device answers without signal: the definition it randomizes with comes from the last
successful fetch, or from a file the app ships (``ldp-client install-survey``). Reports carry the
digest of the definition they were randomized under, so one made with a stale definition is
refused by the aggregator (FAILED_PRECONDITION) rather than counted under another.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass

from client.device.database import connect, immediate
from client.device.filekind import DEVICE_STATE, open_read_only
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS survey_cache (
    survey_id TEXT PRIMARY KEY,
    definition BLOB NOT NULL,
    source TEXT NOT NULL,
    stored_at REAL NOT NULL
);
"""


@dataclass(frozen=True)
class CachedSurvey:
    survey: SurveySpec
    source: str  # "server" (fetched) or the file it was installed from
    stored_at: float


class SurveyCache:
    """Survey definitions by id, as last fetched or installed."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._conn = connect(path)
        try:
            self._conn.executescript(_SCHEMA)
        except BaseException:
            self._conn.close()
            raise

    @classmethod
    def read_only(cls, path: str | os.PathLike[str]) -> SurveyCache:
        """The cache of an existing device state file, opened without changing anything."""
        cache = cls.__new__(cls)
        cache._conn = open_read_only(path, DEVICE_STATE)
        return cache

    def get(self, survey_id: str) -> CachedSurvey | None:
        row = self._conn.execute(
            "SELECT definition, source, stored_at FROM survey_cache WHERE survey_id = ?",
            (survey_id,),
        ).fetchone()
        if row is None:
            return None
        survey = SurveySpec.from_proto(ldp_pb2.Survey.FromString(row[0]))
        return CachedSurvey(survey, row[1], row[2])

    def put(self, survey: SurveySpec, source: str) -> bool:
        """Store (or replace) a definition; whether it differs from the one cached before."""
        blob = survey.to_proto(key_digests=True).SerializeToString(deterministic=True)
        with immediate(self._conn):
            row = self._conn.execute(
                "SELECT definition FROM survey_cache WHERE survey_id = ?", (survey.id,)
            ).fetchone()
            if row is not None and row[0] == blob:
                return False
            self._conn.execute(
                "INSERT OR REPLACE INTO survey_cache VALUES (?, ?, ?, ?)",
                (survey.id, blob, source, time.time()),
            )
        return True

    def surveys(self) -> list[CachedSurvey]:
        """Every cached definition, by survey id."""
        try:
            rows = self._conn.execute("SELECT survey_id FROM survey_cache ORDER BY survey_id")
            ids = [row[0] for row in rows]
        except sqlite3.OperationalError:  # a state file that never cached a survey
            return []
        return [cached for survey_id in ids if (cached := self.get(survey_id)) is not None]

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> SurveyCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
