"""This device's public design key in each survey with a sampling design (docs/designs.md).

The study gives each device its row of the sampling frame (a stratum x PSU x weight class key)
when it samples it; the key is sent unrandomized with every report. The survey publishes its
frame's key digests (docs/wire.md §3.12), so a key the frame lacks is refused here, before the
ledger is charged; a definition without digests (an older server) leaves that check to the
aggregator, which refuses such a report for good after it was charged. A device keeps the first key
it reports in a survey and refuses another one later: a respondent is sampled once, from one
PSU, and a key that changes would count one person in two PSUs.
"""

from __future__ import annotations

import os
import time

from client.device.database import connect, immediate
from client.survey import SurveyError, SurveySpec

_SCHEMA = """CREATE TABLE IF NOT EXISTS survey_design_keys (
    survey_id TEXT PRIMARY KEY,
    design_key TEXT NOT NULL,
    fixed_at INTEGER NOT NULL
)"""


class DesignKeyChangedError(SurveyError):
    """The device already reports under another design key of this survey."""


class DeviceDesignKeys:
    """The fixed design key of this device per survey, in the device database."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._conn = connect(path)
        self._conn.execute(_SCHEMA)

    def get(self, survey_id: str) -> str | None:
        """The device's design key in the survey, None before its first report there."""
        sql = "SELECT design_key FROM survey_design_keys WHERE survey_id = ?"
        row = self._conn.execute(sql, (survey_id,)).fetchone()
        return None if row is None else row[0]

    def resolve(self, survey: SurveySpec, key: str | None) -> str:
        """The key a new report of ``survey`` carries: ``key`` checked against the survey
        (SurveyError, also for a key whose digest the survey's published frame lacks) and
        against the device's fixed key (DesignKeyChangedError); None means the fixed one. ''
        for a survey without a design. Nothing is recorded: the caller charges only after."""
        fixed = self.get(survey.id)
        if survey.design is None:
            return survey.check_design_key(key or "")
        if key is None:
            if fixed is None:
                raise SurveyError(
                    f"survey {survey.id!r} has a sampling design: give this device's design key "
                    "(its row of the sampling frame, from the study)"
                )
            key = fixed
        survey.check_design_key(key)
        if fixed is not None and fixed != key:
            raise DesignKeyChangedError(
                f"survey {survey.id!r}: this device reports under design key {fixed!r}, not "
                f"{key!r}; a device's design key is fixed (one respondent, one PSU)"
            )
        return key

    def fix(self, survey_id: str, key: str) -> None:
        """Record ``key`` as the device's design key in the survey (a no-op once it is)."""
        with immediate(self._conn):
            if self.get(survey_id) is None:
                self._conn.execute(
                    "INSERT INTO survey_design_keys VALUES (?, ?, ?)",
                    (survey_id, key, int(time.time())),
                )

    def close(self) -> None:
        self._conn.close()
