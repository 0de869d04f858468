"""Online backup and restore of the report store on real SQLite files: a backup taken while a
writer keeps committing is one consistent snapshot (its statistics equal a recount of its own
log), restore checks every digest and never overwrites a store unasked."""

from __future__ import annotations

import json
import sqlite3
import stat
import threading
from pathlib import Path

import numpy as np
import pytest

from aggregator.store.backup import MANIFEST, BackupError, backup, restore
from aggregator.store.report_store import ReportStore, StoredReport

K = 4
EYE = np.eye(K, dtype=np.int64)


def report(i: int) -> StoredReport:
    return StoredReport(i.to_bytes(16, "big"), "s", "q", bytes([i % K]), EYE[i % K])


def one_hot(survey_id: str, question_id: str, payload: bytes) -> np.ndarray:
    return EYE[payload[0]]


def recount(db: Path) -> tuple[int, list[int]]:
    """The log's own statistics, read with plain sqlite3 (not the store's code)."""
    with sqlite3.connect(db) as conn:
        payloads = [row[0] for row in conn.execute("SELECT payload FROM reports")]
    sums = [0] * K
    for payload in payloads:
        sums[payload[0]] += 1
    return len(payloads), sums


def test_a_backup_during_writes_is_one_consistent_snapshot(tmp_path):
    db = tmp_path / "live" / "reports.sqlite"
    db.parent.mkdir()
    Path(f"{db}.limits-secret").write_bytes(b"s" * 32)
    written = threading.Event()
    stop = threading.Event()
    with ReportStore(db) as store:
        store.register_question("s", "q", K)

        def writer() -> None:
            i = 0
            while not stop.is_set():
                store.put([report(j) for j in range(i, i + 50)])
                i += 50
                written.set()

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            assert written.wait(10)
            manifests = [backup(db, tmp_path / f"b{n}", [".limits-secret"]) for n in range(3)]
        finally:
            stop.set()
            thread.join(10)
        final = store.statistics("s", "q")
    for n, manifest in enumerate(manifests):
        copy = tmp_path / f"b{n}" / "reports.sqlite"
        logged, sums = recount(copy)
        with ReportStore(copy) as restored_view:
            stored_n, stored_sums = restored_view.statistics("s", "q")
        assert stored_n == logged == manifest["reports"] > 0
        assert stored_sums.tolist() == sums  # statistics and log from the same instant
        assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert manifests[-1]["reports"] <= final[0]


def test_restore_checks_digests_and_keeps_the_secret(tmp_path):
    db = tmp_path / "reports.sqlite"
    Path(f"{db}.limits-secret").write_bytes(b"k" * 32)
    with ReportStore(db) as store:
        store.register_question("s", "q", K)
        store.put([report(i) for i in range(100)])
    manifest = backup(db, tmp_path / "backup", [".limits-secret", ".absent"])
    assert set(manifest["files"]) == {"reports.sqlite", "reports.sqlite.limits-secret"}

    target = tmp_path / "restored" / "reports.sqlite"
    restore(tmp_path / "backup", target)
    assert Path(f"{target}.limits-secret").read_bytes() == b"k" * 32
    assert stat.S_IMODE(Path(f"{target}.limits-secret").stat().st_mode) == 0o600
    with ReportStore(target) as store:
        assert store.statistics("s", "q")[0] == 100 and store.integrity_check() == "ok"
        assert store.rebuild(one_hot)["s", "q"][0] == 100

    with pytest.raises(BackupError, match="exists; stop the server and pass --force"):
        restore(tmp_path / "backup", target)
    restore(tmp_path / "backup", target, force=True)

    secret = tmp_path / "backup" / "reports.sqlite.limits-secret"
    secret.write_bytes(b"x" * 32)
    with pytest.raises(BackupError, match="does not match its SHA-256"):
        restore(tmp_path / "backup", tmp_path / "other.sqlite")
    assert not (tmp_path / "other.sqlite").exists()  # nothing written before the check


def test_bad_sources_and_destinations_are_refused(tmp_path):
    with pytest.raises(BackupError, match="report store not found"):
        backup(tmp_path / "missing.sqlite", tmp_path / "b")
    db = tmp_path / "r.sqlite"
    with ReportStore(db) as store:
        store.register_question("s", "q", K)
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    with pytest.raises(BackupError, match="must be new or empty"):
        backup(db, full)
    with pytest.raises(BackupError, match="is not a backup"):
        restore(full, tmp_path / "t.sqlite")
    backup(db, tmp_path / "ok")
    manifest = json.loads((tmp_path / "ok" / MANIFEST).read_text())
    manifest["files"]["r.sqlite.secret"] = {"sha256": "0", "bytes": 1, "suffix": "/../../escape"}
    (tmp_path / "ok" / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(BackupError, match="outside the backup"):
        restore(tmp_path / "ok", tmp_path / "t.sqlite")


def test_an_sqlite_sidecar_is_copied_through_the_backup_api(tmp_path):
    db = tmp_path / "reports.sqlite"
    with ReportStore(db) as store:
        store.register_question("s", "q", K)
    caps = Path(f"{db}.caps")
    with sqlite3.connect(caps) as conn:
        conn.execute("CREATE TABLE cap_counts (k TEXT, n INTEGER)")
        conn.executemany("INSERT INTO cap_counts VALUES (?, ?)", [("a", 3), ("b", 5)])
    manifest = backup(db, tmp_path / "b", [".caps"])
    assert manifest["files"]["reports.sqlite.caps"]["suffix"] == ".caps"
    copy = tmp_path / "b" / "reports.sqlite.caps"
    with sqlite3.connect(copy) as conn:
        assert conn.execute("SELECT sum(n) FROM cap_counts").fetchone()[0] == 8
