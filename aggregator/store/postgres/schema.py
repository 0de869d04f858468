"""The PostgreSQL store's schema and its migration: created by whichever node starts first,
under a transaction-level advisory lock so that nodes starting together do not race.

The tables mirror the SQLite store's, with two differences. The log is keyed by ``report_id``
(the unique constraint every node's insert checks: exact DUPLICATE and CONFLICT answers across
nodes). The statistics are sharded: ``statistic_shards`` holds, per (survey, question, side,
group, shard), the sums of the reports that transactions choosing that shard stored, so
concurrent commits seldom wait on one row; a read sums the shards. Group '' pools all groups.
``design_statistic_shards`` does the same per design key for a survey with a sampling design
(aggregator/store/postgres/design.py): n, sums and float64 sums of squares per (survey,
question, side, group, key, shard), no pooled group (the keys of every group are read).
``confirmations.closed_at`` is set when a seal closes the confirmation side, before its
results are computed (aggregator/store/postgres/confirm.py). ``releases`` and ``holdout_queries``
keep the Analyst's released snapshots and the holdout's query log, as in SQLite
(aggregator/store/postgres/analysis.py), and ``design_releases`` the per key rows of each
released snapshot, their shards summed (aggregator/store/postgres/design_releases.py);
``device_counts`` and ``device_buckets`` the per-device limits every node shares, under keyed
hashes (aggregator/store/postgres/device_limits.py), and ``node_settings`` the fingerprint of
the nodes' common hashing secret. They are added by ``CREATE TABLE IF NOT EXISTS`` to a store
made before them (the first node to start migrates it), so the schema version stays 1."""

from __future__ import annotations

import psycopg

from aggregator.store.errors import StoreError

SCHEMA_VERSION = 1
#: Any fixed 64-bit number: the advisory lock that serializes schema changes and pinning.
SCHEMA_LOCK = 0x4C44505053544F52  # "LDPPSTOR"

_TABLES = (
    "CREATE TABLE IF NOT EXISTS ldp_schema (version integer NOT NULL)",
    """CREATE TABLE IF NOT EXISTS reports (
    report_id bytea PRIMARY KEY CHECK (length(report_id) = 16),
    survey_id text NOT NULL,
    question_id text NOT NULL,
    payload bytea NOT NULL,
    received_at bigint NOT NULL,
    side smallint NOT NULL DEFAULT 0 CHECK (side IN (0, 1, 2)),
    group_value text NOT NULL DEFAULT ''
)""",
    """CREATE TABLE IF NOT EXISTS questions (
    survey_id text NOT NULL,
    question_id text NOT NULL,
    k integer NOT NULL CHECK (k >= 1),
    PRIMARY KEY (survey_id, question_id)
)""",
    """CREATE TABLE IF NOT EXISTS statistic_shards (
    survey_id text NOT NULL,
    question_id text NOT NULL,
    side smallint NOT NULL CHECK (side IN (0, 1, 2)),
    group_value text NOT NULL,
    shard smallint NOT NULL,
    n bigint NOT NULL,
    sums bigint[] NOT NULL,
    PRIMARY KEY (survey_id, question_id, side, group_value, shard)
)""",
    """CREATE TABLE IF NOT EXISTS design_statistic_shards (
    survey_id text NOT NULL,
    question_id text NOT NULL,
    side smallint NOT NULL CHECK (side IN (0, 1, 2)),
    group_value text NOT NULL,
    design_key text NOT NULL CHECK (design_key != ''),
    shard smallint NOT NULL,
    n bigint NOT NULL,
    sums bigint[] NOT NULL,
    squares double precision[] NOT NULL,
    PRIMARY KEY (survey_id, question_id, side, group_value, design_key, shard)
)""",
    """CREATE TABLE IF NOT EXISTS question_definitions (
    survey_id text NOT NULL,
    question_id text NOT NULL,
    definition text NOT NULL,
    digest bytea NOT NULL,
    pinned_at bigint NOT NULL,
    PRIMARY KEY (survey_id, question_id)
)""",
    """CREATE TABLE IF NOT EXISTS survey_splits (
    survey_id text PRIMARY KEY,
    exploration_fraction double precision NOT NULL,
    pinned_at bigint NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS survey_group_labels (
    survey_id text PRIMARY KEY,
    name text NOT NULL,
    group_values text NOT NULL,
    pinned_at bigint NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS confirmations (
    survey_id text PRIMARY KEY,
    mode text NOT NULL CHECK (mode IN ('plan', 'holdout')),
    plan_sha256 text,
    plan text,
    registered_at text NOT NULL,
    sealed text,
    sealed_at text,
    holdout text,
    closed_at text
)""",
    """CREATE TABLE IF NOT EXISTS holdout_queries (
    survey_id text NOT NULL,
    query integer NOT NULL,
    question_id text NOT NULL,
    test text NOT NULL,
    level double precision NOT NULL,
    reject boolean NOT NULL,
    asked_at text NOT NULL,
    PRIMARY KEY (survey_id, query)
)""",
    """CREATE TABLE IF NOT EXISTS releases (
    survey_id text NOT NULL,
    question_id text NOT NULL,
    side smallint NOT NULL,
    group_value text NOT NULL,
    n bigint NOT NULL,
    sums bigint[] NOT NULL,
    PRIMARY KEY (survey_id, question_id, side, group_value)
)""",
    """CREATE TABLE IF NOT EXISTS release_history (
    seq bigserial PRIMARY KEY,
    survey_id text NOT NULL,
    question_id text NOT NULL,
    side smallint NOT NULL,
    group_value text NOT NULL,
    n bigint NOT NULL,
    sums bigint[] NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS design_releases (
    survey_id text NOT NULL,
    question_id text NOT NULL,
    side smallint NOT NULL,
    group_value text NOT NULL,
    design_key text NOT NULL CHECK (design_key != ''),
    n bigint NOT NULL,
    sums bigint[] NOT NULL,
    squares double precision[] NOT NULL,
    PRIMARY KEY (survey_id, question_id, side, group_value, design_key)
)""",
    "CREATE INDEX IF NOT EXISTS release_history_cell"
    " ON release_history (survey_id, question_id, side, group_value, seq)",
    """CREATE TABLE IF NOT EXISTS device_counts (
    pseudonym text NOT NULL,
    survey_id text NOT NULL,
    question_id text NOT NULL,
    accepted bigint NOT NULL CHECK (accepted >= 0),
    PRIMARY KEY (pseudonym, survey_id, question_id)
)""",
    """CREATE TABLE IF NOT EXISTS device_buckets (
    pseudonym text NOT NULL,
    survey_id text NOT NULL,
    tokens double precision NOT NULL,
    stamp double precision NOT NULL,
    PRIMARY KEY (pseudonym, survey_id)
)""",
    """CREATE TABLE IF NOT EXISTS node_settings (
    name text PRIMARY KEY,
    value text NOT NULL
)""",
)


def migrate(conn: psycopg.Connection) -> None:
    """Create the schema if missing (in one transaction); a database of another schema version
    is a StoreError."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        for statement in _TABLES:
            conn.execute(statement)
        row = conn.execute("SELECT max(version) FROM ldp_schema").fetchone()
        version = row[0] if row else None
        if version is None:
            conn.execute("INSERT INTO ldp_schema VALUES (%s)", (SCHEMA_VERSION,))
        elif version != SCHEMA_VERSION:
            raise StoreError(
                f"the PostgreSQL store has schema version {version}, need {SCHEMA_VERSION}"
            )
