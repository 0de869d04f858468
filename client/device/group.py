"""This device's public group in each survey that declares a group label (docs/two-sample.md).

The study assigns the group (an arm, a region, a wave); it is sent unrandomized with every
report. A device keeps the first group it reports in a survey and refuses another one later:
otherwise one person could be counted in two groups and the groups would no longer be disjoint
samples, which every two-sample test assumes.
"""

from __future__ import annotations

import os
import time

from client.device.database import connect, immediate
from client.survey import SurveyError, SurveySpec

_SCHEMA = """CREATE TABLE IF NOT EXISTS survey_groups (
    survey_id TEXT PRIMARY KEY,
    group_value TEXT NOT NULL,
    fixed_at INTEGER NOT NULL
)"""


class GroupChangedError(SurveyError):
    """The device already reports in another group of this survey."""


class DeviceGroups:
    """The fixed group of this device per survey, in the device database."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._conn = connect(path)
        self._conn.execute(_SCHEMA)

    def get(self, survey_id: str) -> str | None:
        """The device's group in the survey, None before its first report there."""
        sql = "SELECT group_value FROM survey_groups WHERE survey_id = ?"
        row = self._conn.execute(sql, (survey_id,)).fetchone()
        return None if row is None else row[0]

    def resolve(self, survey: SurveySpec, group: str | None) -> str:
        """The group a new report of ``survey`` carries: ``group`` checked against the survey
        (SurveyError) and against the device's fixed group (GroupChangedError); None means the
        fixed one. '' for a survey without a group label. Nothing is recorded."""
        fixed = self.get(survey.id)
        label = survey.group_label
        if label is None:
            survey.check_group(group or "")
            return ""
        if group is None:
            if fixed is None:
                raise SurveyError(
                    f"survey {survey.id!r} declares group label {label.name!r}: give this "
                    f"device's {label.name} (one of {', '.join(label.values)})"
                )
            group = fixed
        survey.check_group(group)
        if fixed is not None and fixed != group:
            raise GroupChangedError(
                f"survey {survey.id!r}: this device reports in {label.name} {fixed!r}, not "
                f"{group!r}; a device's {label.name} is fixed (one person in one group)"
            )
        return group

    def fix(self, survey_id: str, group: str) -> None:
        """Record ``group`` as the device's group in the survey (a no-op once it is);
        GroupChangedError if another one is recorded."""
        with immediate(self._conn):
            fixed = self.get(survey_id)
            if fixed is None:
                self._conn.execute(
                    "INSERT INTO survey_groups VALUES (?, ?, ?)",
                    (survey_id, group, int(time.time())),
                )
            elif fixed != group:
                raise GroupChangedError(
                    f"survey {survey_id!r}: this device reports in group {fixed!r}, not {group!r}"
                )

    def close(self) -> None:
        self._conn.close()
