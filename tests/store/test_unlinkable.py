"""Unlinkable at rest: with every store file in hand (database, WAL copied mid-run, cap counts,
secret), nothing ties a stored report to the device that sent it; store files are 0600; a secret
file with loose permissions is refused."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import time
from contextlib import closing

import grpc
import pytest
from cli_runner import run_cli
from conftest import ServerThread
from service.collector.test_limits_service import LIMITED_TOML, reports

from aggregator.service.collector.limits import KeyPseudonyms, SecretFileError
from aggregator.store.model import RECEIVED_RESOLUTION
from aggregator.store.sqlite.report_store import ReportStore
from aggregator.store.sqlite.schema import SCHEMA_VERSION
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc


@pytest.fixture
def limited_file(tmp_path):
    path = tmp_path / "limited.toml"
    path.write_text(LIMITED_TOML)
    return path


def tables(db) -> set[str]:
    with closing(sqlite3.connect(db)) as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}


def test_a_wal_copied_mid_run_holds_no_device_link(tmp_path, limited_file):
    """Capped uploads from one device; the database and WAL copied while serving (and replayed
    by opening the copy) hold reports only: no count table, no pseudonym, in any byte."""
    db = tmp_path / "reports.sqlite"
    running = ServerThread(limited_file, db).start()
    try:
        with grpc.insecure_channel(running.target) as channel:
            stub = ldp_pb2_grpc.CollectorStub(channel)
            for _ in range(5):
                stub.Upload(
                    ldp_pb2.UploadRequest(reports=reports("capped", 2, "roomy")), timeout=10
                )
        copy = tmp_path / "copy"
        copy.mkdir()
        raw = b""
        for suffix in ("", "-wal"):
            shutil.copy(f"{db}{suffix}", copy / f"reports.sqlite{suffix}")
            raw += (copy / f"reports.sqlite{suffix}").read_bytes()
    finally:
        running.stop()
    pseudonym = KeyPseudonyms.beside(str(db))("host:127.0.0.1")
    assert pseudonym.encode() not in raw and b"127.0.0.1" not in raw
    assert tables(copy / "reports.sqlite") == {
        "reports",
        "statistics",
        "sqlite_autoindex_statistics_1",
        "question_definitions",  # the pinned definitions: one row per question, no device
        "sqlite_autoindex_question_definitions_1",
        "side_statistics",  # split surveys' statistics per side: no device either
        "sqlite_autoindex_side_statistics_1",
        "survey_splits",
        "sqlite_autoindex_survey_splits_1",
        "group_statistics",  # statistics per public group label value: no device
        "sqlite_autoindex_group_statistics_1",
        "survey_group_labels",
        "sqlite_autoindex_survey_group_labels_1",
        "id_index",  # keyed hashes of the report ids and their log rows: no device, no time
    }
    with closing(sqlite3.connect(copy / "reports.sqlite")) as conn:
        assert conn.execute("SELECT count(*) FROM reports").fetchone()[0] == 10
    with closing(sqlite3.connect(f"{db}.caps")) as conn:  # the counts: no report id, no time
        assert conn.execute("SELECT * FROM cap_counts").fetchall() == [
            (pseudonym, "capped", "roomy", 10)
        ]


def test_a_wal_copied_after_the_window_groups_nothing(tmp_path, limited_file):
    """Five uploads of one device, then the store files copied once the WAL window has passed:
    the WAL is empty (no transaction holds one upload's reports together) and every report keeps
    only its arrival day, so the reports of one upload share nothing the others lack."""
    db = tmp_path / "reports.sqlite"
    running = ServerThread(limited_file, db).start()
    try:
        with grpc.insecure_channel(running.target) as channel:
            stub = ldp_pb2_grpc.CollectorStub(channel)
            for _ in range(5):
                stub.Upload(
                    ldp_pb2.UploadRequest(reports=reports("capped", 2, "roomy")), timeout=10
                )
        wal = tmp_path / "reports.sqlite-wal"
        deadline = time.monotonic() + 60  # the default window is 5 s; generous for a busy CI
        while wal.stat().st_size and time.monotonic() < deadline:
            time.sleep(0.1)
        assert wal.stat().st_size == 0, "the WAL still holds the uploads' transactions"
        copy = tmp_path / "copy.sqlite"
        shutil.copy(db, copy)
    finally:
        running.stop()
    with closing(sqlite3.connect(copy)) as conn:
        arrivals = conn.execute("SELECT DISTINCT received_at FROM reports").fetchall()
        assert conn.execute("SELECT count(*) FROM reports").fetchone()[0] == 10
    assert len(arrivals) == 1 and arrivals[0][0] % RECEIVED_RESOLUTION == 0


def test_arrival_seconds_of_an_older_store_are_coarsened_once(tmp_path):
    db = tmp_path / "old.sqlite"
    ReportStore(db).close()
    with closing(sqlite3.connect(db)) as conn:
        conn.execute(
            "INSERT INTO reports (report_id, survey_id, question_id, payload, received_at)"
            " VALUES (?, 's', 'q', x'00', 1795000123)",
            (bytes(16),),
        )
        conn.execute("PRAGMA user_version = 1")  # the schema before arrival days
        conn.commit()
    ReportStore(db).close()
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT received_at FROM reports").fetchall() == [(1794960000,)]
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)


def test_counts_kept_in_the_report_database_move_out(tmp_path, limited_file):
    """An earlier version's in-database counts are adopted and erased from the database file."""
    db = tmp_path / "reports.sqlite"
    pseudonym = KeyPseudonyms.beside(str(db))("host:127.0.0.1")
    ReportStore(db).close()  # a report store, then the table an earlier version kept in it
    with closing(sqlite3.connect(db)) as conn:
        conn.execute(
            "CREATE TABLE limit_counts (pseudonym TEXT, survey_id TEXT, question_id TEXT,"
            " accepted INTEGER, PRIMARY KEY (pseudonym, survey_id, question_id)) WITHOUT ROWID"
        )
        conn.execute("INSERT INTO limit_counts VALUES (?, 'capped', 'q', 2)", (pseudonym,))
        conn.commit()
    running = ServerThread(limited_file, db).start()
    try:
        with grpc.insecure_channel(running.target) as channel, pytest.raises(grpc.RpcError) as cap:
            ldp_pb2_grpc.CollectorStub(channel).Upload(
                ldp_pb2.UploadRequest(reports=reports("capped", 1)), timeout=10
            )
        assert "cap reached" in cap.value.details()
    finally:
        running.stop()
    assert "limit_counts" not in tables(db)
    assert pseudonym.encode() not in db.read_bytes()


def test_store_files_are_private(tmp_path, limited_file):
    db = tmp_path / "reports.sqlite"
    db.touch(mode=0o644)
    os.chmod(db, 0o644)
    previous = os.umask(0o022)
    try:
        running = ServerThread(limited_file, db).start()
        with grpc.insecure_channel(running.target) as channel:
            ldp_pb2_grpc.CollectorStub(channel).Upload(
                ldp_pb2.UploadRequest(reports=reports("capped", 1)), timeout=10
            )
        modes = {
            path.name: stat.S_IMODE(path.stat().st_mode) for path in tmp_path.glob("reports.*")
        }
        running.stop()
    finally:
        os.umask(previous)
    assert set(modes) >= {
        "reports.sqlite",
        "reports.sqlite-wal",
        "reports.sqlite-shm",
        "reports.sqlite.caps",
        "reports.sqlite.limits-secret",
        "reports.sqlite.lock",
    }
    assert {name: oct(mode) for name, mode in modes.items() if mode != 0o600} == {}


def test_a_secret_others_can_read_is_refused(tmp_path, limited_file):
    db = tmp_path / "reports.sqlite"
    secret = tmp_path / "reports.sqlite.limits-secret"
    secret.write_bytes(os.urandom(32))
    os.chmod(secret, 0o644)
    with pytest.raises(SecretFileError, match="mode 0644"):
        KeyPseudonyms.beside(str(db))
    result = run_cli(
        "agg",
        *("serve", "--insecure", "--port", "0"),
        *("--config", str(limited_file), "--db", str(db)),
    )

    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"ldp-aggregator: error: {secret} has mode 0644: a secret must be private to its owner "
        f"(chmod 600 {secret})"
    ]
