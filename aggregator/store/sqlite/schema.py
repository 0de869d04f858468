"""The report store file's schema (SQLite): its tables (the log, the statistics pooled, per
side and per group, the saved id index), its version and file kind, and the migration of a file
of an older version in place."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

from aggregator.store.errors import StoreError
from aggregator.store.model import RECEIVED_RESOLUTION
from aggregator.store.sqlite.connection import transaction
from aggregator.store.sqlite.file_kind import REPORT_STORE

#: 2: received_at keeps the arrival day only; 3: reports.side, side_statistics;
#: 4: reports.group_value, group_statistics; 5: the log is appended in ``seq`` order (no longer
#: a B-tree keyed by report_id), its ids indexed in memory (aggregator/store/sqlite/id_index.py)
SCHEMA_VERSION = 5
STORE_KIND = replace(REPORT_STORE, version=SCHEMA_VERSION)  # application_id "LDPS" + this version

_SIDE_STATISTICS = """CREATE TABLE IF NOT EXISTS side_statistics (
    survey_id TEXT NOT NULL,
    question_id TEXT NOT NULL,
    side INTEGER NOT NULL CHECK (side IN (1, 2)),
    n INTEGER NOT NULL,
    sums BLOB NOT NULL,
    PRIMARY KEY (survey_id, question_id, side)
);"""
_GROUP_STATISTICS = """CREATE TABLE IF NOT EXISTS group_statistics (
    survey_id TEXT NOT NULL,
    question_id TEXT NOT NULL,
    side INTEGER NOT NULL CHECK (side IN (0, 1, 2)),
    group_value TEXT NOT NULL CHECK (group_value != ''),
    n INTEGER NOT NULL,
    sums BLOB NOT NULL,
    PRIMARY KEY (survey_id, question_id, side, group_value)
);"""
ID_INDEX = """CREATE TABLE IF NOT EXISTS id_index (
    part INTEGER PRIMARY KEY,
    secret BLOB,
    high_water INTEGER,
    hashes BLOB,
    seqs BLOB
)"""
_REPORTS = """CREATE TABLE IF NOT EXISTS {name} (
    report_id BLOB NOT NULL,
    survey_id TEXT NOT NULL,
    question_id TEXT NOT NULL,
    payload BLOB NOT NULL,
    received_at INTEGER NOT NULL,
    side INTEGER NOT NULL DEFAULT 0,
    group_value TEXT NOT NULL DEFAULT '',
    seq INTEGER PRIMARY KEY
);"""
_REPORT_COLUMNS = "report_id, survey_id, question_id, payload, received_at, side, group_value"
_SCHEMA = f"""
BEGIN IMMEDIATE;
{_REPORTS.format(name="reports")}
CREATE TABLE IF NOT EXISTS statistics (
    survey_id TEXT NOT NULL,
    question_id TEXT NOT NULL,
    k INTEGER NOT NULL,
    n INTEGER NOT NULL,
    sums BLOB NOT NULL,
    PRIMARY KEY (survey_id, question_id)
);
{_SIDE_STATISTICS}
{_GROUP_STATISTICS}
{ID_INDEX};
PRAGMA user_version = {SCHEMA_VERSION};
COMMIT;
"""


def migrate(conn: sqlite3.Connection, path: str) -> None:
    """Bring the file on ``conn`` to SCHEMA_VERSION: the schema created in a new (version 0)
    file, an older version's file migrated in place; another version is a StoreError."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == 0:
        conn.executescript(_SCHEMA)
    elif version in (1, 2, 3, 4):
        if version == 1:
            _coarsen_arrival_times(conn)
        if version <= 2:
            _add_sides(conn)
        if version <= 3:
            _add_groups(conn)
        _append_only_log(conn)
    elif version != SCHEMA_VERSION:
        raise StoreError(f"{path} has schema version {version}, need {SCHEMA_VERSION}")


def _coarsen_arrival_times(conn: sqlite3.Connection) -> None:
    """Schema 1 to 2: keep only the day of every stored arrival time."""
    with transaction(conn):
        conn.execute(
            "UPDATE reports SET received_at = received_at - received_at % ?",
            (RECEIVED_RESOLUTION,),
        )
        conn.execute("PRAGMA user_version = 2")


def _add_sides(conn: sqlite3.Connection) -> None:
    """Schema 2 to 3: every stored report is of side 0 (surveys were not split before)."""
    with transaction(conn):
        columns = {row[1] for row in conn.execute("PRAGMA table_info(reports)")}
        if "side" not in columns:
            conn.execute("ALTER TABLE reports ADD COLUMN side INTEGER NOT NULL DEFAULT 0")
        conn.execute(_SIDE_STATISTICS)
        conn.execute("PRAGMA user_version = 3")


def _add_groups(conn: sqlite3.Connection) -> None:
    """Schema 3 to 4: every stored report has the empty group (no survey had a group label)."""
    with transaction(conn):
        columns = {row[1] for row in conn.execute("PRAGMA table_info(reports)")}
        if "group_value" not in columns:
            conn.execute("ALTER TABLE reports ADD COLUMN group_value TEXT NOT NULL DEFAULT ''")
        conn.execute(_GROUP_STATISTICS)
        conn.execute("PRAGMA user_version = 4")


def _append_only_log(conn: sqlite3.Connection) -> None:
    """Schema 4 to 5: the log keyed by report_id (a WITHOUT ROWID table) is copied, in one
    transaction, into the log appended in ``seq`` order. The copy reads the old table in
    report_id order, so ``seq`` says nothing of arrival for the reports stored before."""
    with transaction(conn):
        (sql,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'reports'"
        ).fetchone()
        if "WITHOUT ROWID" in sql.upper():
            conn.execute(_REPORTS.format(name="reports_by_arrival"))
            conn.execute(
                f"INSERT INTO reports_by_arrival ({_REPORT_COLUMNS})"
                f" SELECT {_REPORT_COLUMNS} FROM reports ORDER BY report_id"
            )
            conn.execute("DROP TABLE reports")
            conn.execute("ALTER TABLE reports_by_arrival RENAME TO reports")
        conn.execute(ID_INDEX)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
