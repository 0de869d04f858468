"""Online backup and restore of the report store on real SQLite files: a backup taken while a
writer keeps committing is one consistent snapshot (its statistics equal a recount of its own
log), restore checks the manifest's MAC and every digest and never overwrites a store unasked."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import stat
import threading
from pathlib import Path

import numpy as np
import pytest

from aggregator.store.model import StoredReport
from aggregator.store.sqlite.backup import MANIFEST, BackupError, backup, default_key_file, restore
from aggregator.store.sqlite.lock import StoreLock
from aggregator.store.sqlite.report_store import ReportStore

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
    key = default_key_file(db)
    restore(tmp_path / "backup", target, key_file=key)
    assert Path(f"{target}.limits-secret").read_bytes() == b"k" * 32
    assert stat.S_IMODE(Path(f"{target}.limits-secret").stat().st_mode) == 0o600
    with ReportStore(target) as store:
        assert store.statistics("s", "q")[0] == 100 and store.integrity_check() == "ok"
        assert store.rebuild(one_hot)["s", "q"][0] == 100

    with pytest.raises(BackupError, match="exists; stop the server and pass --force"):
        restore(tmp_path / "backup", target, key_file=key)
    restore(tmp_path / "backup", target, force=True, key_file=key)

    secret = tmp_path / "backup" / "reports.sqlite.limits-secret"
    secret.write_bytes(b"x" * 32)
    with pytest.raises(BackupError, match="does not match its SHA-256"):
        restore(tmp_path / "backup", tmp_path / "other.sqlite", key_file=key)
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
        restore(tmp_path / "ok", tmp_path / "t.sqlite", key_file=default_key_file(db))


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


def small_store(tmp_path: Path) -> Path:
    db = tmp_path / "live" / "reports.sqlite"
    db.parent.mkdir()
    with ReportStore(db) as store:
        store.register_question("s", "q", K)
        store.put([report(i) for i in range(20)])
    return db


def test_a_rewritten_digest_does_not_make_an_edited_backup_pass(tmp_path):
    """The attack: edit the database in a backup and write its new SHA-256 into the manifest.
    The manifest's MAC (under a key the backup does not hold) no longer verifies."""
    db = small_store(tmp_path)
    folder = tmp_path / "backup"
    backup(db, folder)
    key = default_key_file(db)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE((folder / MANIFEST).stat().st_mode) == 0o600
    assert key.name not in {path.name for path in folder.iterdir()}  # never in the backup
    assert key.read_bytes() not in b"".join(path.read_bytes() for path in folder.iterdir())

    copy = folder / db.name
    with sqlite3.connect(copy) as conn:
        conn.execute("DELETE FROM reports WHERE payload = x'00'")
    manifest = json.loads((folder / MANIFEST).read_text())
    entry = manifest["files"][db.name]
    entry["sha256"] = hashlib.sha256(copy.read_bytes()).hexdigest()
    entry["bytes"] = copy.stat().st_size
    (folder / MANIFEST).write_text(json.dumps(manifest))
    target = tmp_path / "restored.sqlite"
    with pytest.raises(BackupError, match="fails its authentication: it was altered"):
        restore(folder, target, key_file=key)
    assert not target.exists()


def test_restore_needs_the_key_that_made_the_backup(tmp_path):
    db = small_store(tmp_path)
    backup(db, tmp_path / "b")
    target = tmp_path / "new" / "reports.sqlite"
    with pytest.raises(BackupError, match=r"backup key not found: .*pass --key FILE"):
        restore(tmp_path / "b", target)  # another machine: no key beside the target
    other = tmp_path / "other.key"
    other.write_bytes(b"o" * 32)
    with pytest.raises(BackupError, match=r"authenticated with key [0-9a-f]{16}, .* holds another"):
        restore(tmp_path / "b", target, key_file=other)
    short = tmp_path / "short.key"
    short.write_bytes(b"s" * 8)
    with pytest.raises(BackupError, match="shorter than 32 bytes"):
        restore(tmp_path / "b", target, key_file=short)
    assert not target.exists()
    restore(tmp_path / "b", target, key_file=default_key_file(db))
    with ReportStore(target) as store:
        assert store.statistics("s", "q")[0] == 20


def test_an_operator_key_file_is_used_and_kept(tmp_path):
    db = small_store(tmp_path)
    key = tmp_path / "vault" / "backup.key"
    key.parent.mkdir()
    backup(db, tmp_path / "b1", key_file=key)
    first = key.read_bytes()
    backup(db, tmp_path / "b2", key_file=key)
    assert key.read_bytes() == first and not default_key_file(db).exists()
    manifests = [json.loads((tmp_path / b / MANIFEST).read_text()) for b in ("b1", "b2")]
    assert manifests[0]["key_id"] == manifests[1]["key_id"]
    restore(tmp_path / "b2", tmp_path / "r.sqlite", key_file=key)


def test_a_backup_from_before_authentication_needs_an_explicit_yes(tmp_path):
    db = small_store(tmp_path)
    backup(db, tmp_path / "b")
    manifest = json.loads((tmp_path / "b" / MANIFEST).read_text())
    for name in ("mac", "key_id"):
        del manifest[name]
    manifest["version"] = 1
    (tmp_path / "b" / MANIFEST).write_text(json.dumps(manifest))
    target = tmp_path / "r.sqlite"
    with pytest.raises(BackupError, match=r"not authenticated.*--allow-unauthenticated"):
        restore(tmp_path / "b", target)
    restore(tmp_path / "b", target, allow_unauthenticated=True)
    with ReportStore(target) as store:
        assert store.statistics("s", "q")[0] == 20


def test_restore_refuses_a_store_a_server_holds_even_with_force(tmp_path):
    db = small_store(tmp_path)
    backup(db, tmp_path / "b")
    with StoreLock(db), pytest.raises(BackupError, match="stop it before restoring"):
        restore(tmp_path / "b", db, force=True)
    restore(tmp_path / "b", db, force=True)  # the server has stopped
    with ReportStore(db) as store:
        assert store.statistics("s", "q")[0] == 20
