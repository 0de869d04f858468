"""The report log appended in ``seq`` order and its id index (issue 27): migration of a store
written by the previous version, exact DUPLICATE/CONFLICT answers whatever the id hashes do,
the index across clean and unclean restarts, and no upload grouped by the log's order."""

from __future__ import annotations

import itertools
import os
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from aggregator.store.model import CONFLICT, DUPLICATE, STORED, StoredReport
from aggregator.store.sqlite import report_store, saved_index
from aggregator.store.sqlite.id_index import IdIndex
from aggregator.store.sqlite.report_store import ReportStore
from aggregator.store.sqlite.schema import SCHEMA_VERSION

#: Written by the previous version's code (schema 4, the log keyed by report_id, WITHOUT ROWID):
#: 300 + 100 reports of survey "plain" (rr k=4, fc k=3), 100 of the split survey "split" (sides 1
#: and 2), 100 of "grouped" (groups "a" and "b").
V4_STORE = Path(__file__).parents[1] / "data" / "report_store_v4.sqlite"


def rr(report_id: bytes, value: int, survey: str = "s", question: str = "q") -> StoredReport:
    row = np.zeros(4, dtype=np.int64)
    row[value] = 1
    return StoredReport(report_id, survey, question, bytes([value]), row)


def log_rows(db: Path) -> list[tuple]:
    with closing(sqlite3.connect(db)) as conn:
        sql = "SELECT report_id, survey_id, question_id, payload, side, group_value FROM reports"
        return sorted(conn.execute(sql))


def statistics_rows(db: Path) -> dict[str, list[tuple]]:
    with closing(sqlite3.connect(db)) as conn:
        return {
            table: sorted(conn.execute(f"SELECT * FROM {table}"))
            for table in ("statistics", "side_statistics", "group_statistics")
        }


def contribution(survey: str, question: str, payload: bytes) -> np.ndarray:
    if question == "fc":
        return np.array([(payload[0] >> j) & 1 for j in range(3)], dtype=np.int64)
    row = np.zeros(4, dtype=np.int64)
    row[payload[0]] = 1
    return row


def test_a_store_of_the_previous_version_is_migrated_without_loss_or_double_count(tmp_path):
    db = tmp_path / "old.sqlite"
    shutil.copy(V4_STORE, db)
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (4,)
    before, stats_before = log_rows(db), statistics_rows(db)
    assert len(before) == 600
    with ReportStore(db) as store:
        assert store.count_reports() == 600
        assert store.statistics("plain", "rr")[0] == 300
        assert store.statistics("split", "rr", side=2)[0] == 50
        assert store.statistics("grouped", "rr", group="a")[0] == 50
        old = before[0]
        assert store.stored_ids([old[0], os.urandom(16)]) == {old[0]}
        resend = StoredReport(old[0], old[1], old[2], old[3], contribution(*old[1:4]), old[4])
        clash = rr(before[1][0], 0, "other", "q")
        store.register_question("other", "q", 4)
        fresh = rr(os.urandom(16), 2, "other", "q")
        assert store.put([resend, clash, fresh]) == [DUPLICATE, CONFLICT, STORED]
    assert log_rows(db) == sorted([*before, (fresh.report_id, "other", "q", bytes([2]), 0, "")])
    after = statistics_rows(db)
    assert [row for row in after["statistics"] if row[0] != "other"] == stats_before["statistics"]
    assert after["side_statistics"] == stats_before["side_statistics"]
    assert after["group_statistics"] == stats_before["group_statistics"]
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'reports'").fetchone()
        assert "WITHOUT ROWID" not in sql.upper()
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with ReportStore(db) as store:  # the statistics agree with the migrated log
        rebuilt = store.rebuild(contribution)
        assert rebuilt[("plain", "rr")][0] == 300 and rebuilt[("other", "q")][0] == 1
    assert statistics_rows(db) == after


def test_answers_stay_exact_when_every_id_hash_collides(tmp_path, monkeypatch):
    """The index only proposes rows: with a hash that maps every id to one key, each answer
    is still decided by comparing whole ids against the log."""
    monkeypatch.setattr(IdIndex, "keys", lambda self, ids: np.zeros(len(list(ids)), np.uint64))
    ids = [os.urandom(16) for _ in range(6)]
    with ReportStore(tmp_path / "s.sqlite") as store:
        store.register_question("s", "q", 4)
        assert store.put([rr(ids[0], 1), rr(ids[1], 2), rr(ids[1], 2)]) == [
            STORED,
            STORED,
            DUPLICATE,
        ]
        assert store.put([rr(ids[2], 0), rr(ids[0], 1), rr(ids[1], 3), rr(ids[3], 1)]) == [
            STORED,
            DUPLICATE,
            CONFLICT,
            STORED,
        ]
        assert store.stored_ids(ids) == set(ids[:4])
        assert store.statistics("s", "q") == (4, pytest.approx(np.array([1, 2, 1, 0])))
        assert store.count_reports() == 4


def test_duplicates_are_found_after_a_clean_close_and_after_a_crash(tmp_path):
    db = tmp_path / "s.sqlite"
    first = [rr(os.urandom(16), i % 4) for i in range(500)]
    second = [rr(os.urandom(16), i % 4) for i in range(300)]
    with ReportStore(db) as store:
        store.register_question("s", "q", 4)
        assert set(store.put(first)) == {STORED}
    with ReportStore(db) as store:  # the index saved at close, nothing appended after it
        assert set(store.put(first)) == {DUPLICATE}
        assert set(store.put(second)) == {STORED}
        crashed = tmp_path / "crashed"
        crashed.mkdir()
        for suffix in ("", "-wal"):  # the files as a kill would leave them: WAL not emptied
            shutil.copy(f"{db}{suffix}", crashed / f"s.sqlite{suffix}")
    with ReportStore(crashed / "s.sqlite") as store:  # saved index + the rows appended after
        assert set(store.put(first + second)) == {DUPLICATE}
        assert store.count_reports() == 800 and store.statistics("s", "q")[0] == 800


def test_the_index_is_saved_as_the_log_grows_so_a_crash_costs_little(tmp_path, monkeypatch):
    """Without a clean close, the start indexes only the rows after the last periodic save:
    each save appends the entries of the rows that became final since the one before."""
    monkeypatch.setattr("aggregator.store.sqlite.log.BLOCK", 8)
    monkeypatch.setattr(report_store, "INDEX_SAVE_ROWS", 64)
    db = tmp_path / "s.sqlite"
    reports = [rr(os.urandom(16), i % 4) for i in range(500)]
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    with ReportStore(db) as store:
        store.register_question("s", "q", 4)
        for start in range(0, 500, 20):
            store.put(reports[start : start + 20])
        assert store.put(reports[:1]) == [DUPLICATE]  # a call through the writer: saves done
        for suffix in ("", "-wal"):  # the files as a kill would leave them
            shutil.copy(f"{db}{suffix}", crashed / f"s.sqlite{suffix}")
    with closing(sqlite3.connect(crashed / "s.sqlite")) as conn:
        index, saved = saved_index.open_index(conn)
        parts = conn.execute("SELECT count(*) FROM id_index WHERE part > 0").fetchone()[0]
        saved_entries = sum(
            len(h) // 8 for (h,) in conn.execute("SELECT hashes FROM id_index WHERE part > 0")
        )
    assert 500 - 64 - 8 <= saved <= 500 and saved % 8 == 0 and parts >= 5
    assert saved_entries == saved and len(index) == 500
    with ReportStore(crashed / "s.sqlite") as store:
        assert set(store.put(reports)) == {DUPLICATE}
        assert store.count_reports() == 500 and store.statistics("s", "q")[0] == 500


def test_a_saved_index_that_does_not_fit_the_log_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setattr("aggregator.store.sqlite.log.BLOCK", 8)
    db = tmp_path / "s.sqlite"
    reports = [rr(os.urandom(16), 1) for _ in range(50)]
    with ReportStore(db) as store:
        store.register_question("s", "q", 4)
        store.put(reports)
    with closing(sqlite3.connect(db)) as conn:  # the log lost its tail behind the index's back
        lost = conn.execute("DELETE FROM reports WHERE seq > 36").rowcount
        conn.commit()
    with ReportStore(db) as store:
        flags = store.put(reports)
    with closing(sqlite3.connect(db)) as conn:
        stored = [row[0] for row in conn.execute("SELECT report_id FROM reports")]
    assert flags.count(STORED) == lost == 14 and sorted(stored) == sorted(
        r.report_id for r in reports
    )


def test_the_log_order_groups_no_upload(tmp_path, monkeypatch):
    """Uploads of 4 reports, each its own commit, as from one device at a time: each report
    takes a random free place of the log's current block, so in the log's order an upload's
    reports are apart (neighbours from one upload about as rare as by chance, 3 in 256 here)."""
    monkeypatch.setattr("aggregator.store.sqlite.log.BLOCK", 256)
    db = tmp_path / "s.sqlite"
    upload_of = {}
    with ReportStore(db) as store:
        store.register_question("s", "q", 4)
        for upload in range(300):
            reports = [rr(os.urandom(16), i) for i in range(4)]
            upload_of.update((r.report_id, upload) for r in reports)
            assert store.put(reports) == [STORED] * 4
    with closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT seq, report_id FROM reports ORDER BY seq").fetchall()
    seqs = [seq for seq, _ in rows]  # 4 full blocks, then 176 random places of the fifth
    assert seqs[:1024] == list(range(1, 1025)) and 1024 < min(seqs[1024:]) <= max(seqs) <= 1280
    log = [upload_of[i] for _, i in rows]
    together = sum(a == b for a, b in itertools.pairwise(log))
    assert together < 0.05 * len(log)  # in arrival order it would be 3 in 4
    blocks = [sorted(set(log[i : i + 256])) for i in range(0, 1200, 256)]
    assert blocks[:4] == [list(range(64 * b, 64 * b + 64)) for b in range(4)]
    with ReportStore(db) as store:  # the fifth block's free places are found again
        store.put([rr(os.urandom(16), 0) for _ in range(100)])
    with closing(sqlite3.connect(db)) as conn:
        seqs = [row[0] for row in conn.execute("SELECT seq FROM reports ORDER BY seq")]
    assert seqs[:1280] == list(range(1, 1281)) and 1280 < min(seqs[1280:]) <= max(seqs) <= 1536


def test_index_finds_every_entry_across_growth_and_a_reload():
    """Exact candidate lists with many equal hashes (long probe chains), while the table
    doubles several times; the same after export and load; the entries of a row range to save."""
    rng = np.random.default_rng(7)
    index = IdIndex()
    keys = rng.integers(0, 50_000, size=40_000, dtype=np.uint64)  # many collisions on purpose
    keys[::9] = keys[0]  # one hash 4,445 times: chains far longer than a bucket
    keys[1::9] = 0  # and the hash an empty slot holds
    for start in range(0, len(keys), 700):
        chunk = keys[start : start + 700]
        index.add(chunk, np.arange(start, start + len(chunk)))
    assert len(index) == len(keys) and index.high_water == len(keys) - 1
    assert index.nbytes <= 4 * 16 * len(keys)
    probe = np.concatenate((keys[::97], np.array([50_001, 60_000], dtype=np.uint64)))
    reloaded = IdIndex(index.secret)
    reloaded.load(index.export(), index.high_water)
    for found in (index.candidates(probe), reloaded.candidates(probe)):
        for i, key in enumerate(probe.tolist()):
            assert sorted(found.get(i, [])) == np.flatnonzero(keys == key).tolist()
    part_keys, part_rows = index.entries_between(100, 15_000)
    assert sorted(part_rows.tolist()) == list(range(101, 15_001))
    assert np.all(part_keys[:-1] <= part_keys[1:])
    index.forget_through(15_000)
    assert sorted(index.entries_between(0, 10**9)[1].tolist()) == list(range(15_001, 40_000))
    index.add(keys[:1], np.array([2**40]))  # a log row past 32 bits: the table widens its rows
    assert 2**40 in index.candidates(keys[:1])[0] and len(index) == len(keys) + 1


def test_id_hashes_depend_on_the_key_and_on_every_byte():
    ids = [bytes(16), bytes(15) + b"\x01", b"\x01" + bytes(15), os.urandom(16)]
    one, other = IdIndex(bytes(range(80))), IdIndex(bytes(range(1, 81)))
    assert len(set(one.keys(ids).tolist())) == 4
    assert one.keys(ids).tolist() != other.keys(ids).tolist()
    assert IdIndex(bytes(range(80))).keys(ids).tolist() == one.keys(ids).tolist()
    with pytest.raises(ValueError):
        one.keys([b"short"])


def test_log_rows_keep_every_column_whether_bound_or_literal(tmp_path):
    """The writer puts a column that is one plain value for the whole commit into its INSERT
    as a literal and binds the others: either way the log holds exactly what was submitted
    (quotes, spaces and non-ASCII text are bound, never quoted into the statement)."""
    odd = "it's a 'survey'; --"
    reports = [
        StoredReport(
            os.urandom(16),
            survey,
            question,
            bytes([i % 4, 0, 0, 0]),
            np.eye(4, dtype=np.int64)[i % 4],
            side,
            group,
        )
        for i, (survey, question, side, group) in enumerate(
            [("s", "q", 0, "")] * 3
            + [(odd, "q", 0, "")] * 2
            + [("s", "qü", 1, "north east")] * 2
            + [("s", "q", 0, "north")] * 2
        )
    ]
    with ReportStore(tmp_path / "s.sqlite") as store:
        for survey, question in {(r.survey_id, r.question_id) for r in reports}:
            store.register_question(survey, question, 4)
        assert store.put(reports[:3]) == [STORED] * 3  # one plain value a column: literals
        assert store.put(reports[3:5]) == [STORED] * 2  # one odd survey id: bound
        assert store.put(reports[5:]) == [STORED] * 4  # columns that vary: bound
    assert log_rows(tmp_path / "s.sqlite") == sorted(
        (r.report_id, r.survey_id, r.question_id, r.payload, r.side, r.group) for r in reports
    )
