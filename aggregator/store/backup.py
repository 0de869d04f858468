"""Online backup and restore of a report store.

``backup`` copies the live SQLite database with SQLite's backup API in one step (a consistent
snapshot, taken while the server keeps writing: in WAL mode a reader never blocks the writer),
the files the service keeps beside it (``<db>.limits-secret``, the key of the per-device limit
pseudonyms, and ``<db>.caps``, the per-device cap counts: without them caps restart from zero),
and writes ``MANIFEST.json`` with every file's SHA-256. ``restore`` checks every digest before
it writes anything and refuses to overwrite a store unless told to.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
from collections.abc import Sequence
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

from aggregator.store.report_store import StoreError

MANIFEST = "MANIFEST.json"
FORMAT = "ldp-survey-backup"
VERSION = 1
SQLITE_HEADER = b"SQLite format 3\x00"


class BackupError(StoreError):
    """A backup or restore cannot be made (the message says which file and why)."""


def backup(db: Path, destination: Path, sidecar_suffixes: Sequence[str] = ()) -> dict:
    """Back up the store ``db`` and its existing ``<db><suffix>`` files into the new folder
    ``destination``; returns the manifest."""
    if not db.is_file():
        raise BackupError(f"report store not found: {db}")
    if destination.exists() and (not destination.is_dir() or any(destination.iterdir())):
        raise BackupError(f"backup folder must be new or empty: {destination}")
    destination.mkdir(mode=0o700, parents=True, exist_ok=True)
    copy = destination / db.name
    try:
        with (
            closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)) as source,
            closing(sqlite3.connect(copy)) as target,
        ):
            source.backup(target)  # one step: one consistent snapshot
            target.execute("PRAGMA journal_mode = DELETE")  # a standalone file, no WAL beside it
            integrity = target.execute("PRAGMA integrity_check").fetchone()[0]
            reports = target.execute("SELECT count(*) FROM reports").fetchone()[0]
    except sqlite3.Error as exc:
        shutil.rmtree(destination, ignore_errors=True)
        raise BackupError(f"cannot back up {db}: {exc}") from None
    if integrity != "ok":
        raise BackupError(f"the copy of {db} fails its integrity check: {integrity}")
    files = {copy.name: _entry(copy, "")}
    for suffix in sidecar_suffixes:
        sidecar = Path(f"{db}{suffix}")
        if sidecar.is_file():
            target_file = destination / sidecar.name
            _copy_sidecar(sidecar, target_file)
            files[target_file.name] = _entry(target_file, suffix)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "source": str(db.resolve()),
        "reports": reports,
        "files": files,
    }
    (destination / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _copy_sidecar(source: Path, target: Path) -> None:
    """A plain file is copied; an SQLite one (the cap counts, written while serving) goes
    through the backup API, so a write in progress cannot tear the copy."""
    with source.open("rb") as stream:
        is_sqlite = stream.read(16) == SQLITE_HEADER
    if not is_sqlite:
        shutil.copyfile(source, target)
        return
    try:
        with (
            closing(sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)) as src,
            closing(sqlite3.connect(target)) as dst,
        ):
            src.backup(dst)
    except sqlite3.Error as exc:
        raise BackupError(f"cannot back up {source}: {exc}") from None


def _entry(path: Path, suffix: str) -> dict:
    path.chmod(0o600)
    return {"sha256": _digest(path), "bytes": path.stat().st_size, "suffix": suffix}


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def restore(source: Path, db: Path, force: bool = False) -> dict:
    """Restore the backup folder ``source`` as the store ``db`` (and its sidecar files); every
    digest is checked first. An existing store (or its WAL) is refused unless ``force``."""
    manifest = read_manifest(source)
    for name, entry in manifest["files"].items():
        if _digest(source / name) != entry["sha256"]:
            raise BackupError(f"{source / name} does not match its SHA-256 in {MANIFEST}")
    targets = [Path(f"{db}{entry['suffix']}") for entry in manifest["files"].values()]
    existing = [p for p in [*targets, Path(f"{db}-wal")] if p.exists()]
    if existing and not force:
        raise BackupError(f"{existing[0]} exists; stop the server and pass --force to replace it")
    db.parent.mkdir(parents=True, exist_ok=True)
    for stale in (Path(f"{db}-wal"), Path(f"{db}-shm")):
        stale.unlink(missing_ok=True)  # a WAL of the replaced store must never meet the copy
    for name, target in zip(manifest["files"], targets, strict=True):
        partial = target.with_name(target.name + ".restoring")
        shutil.copyfile(source / name, partial)
        partial.chmod(0o600)
        os.replace(partial, target)
    return manifest


def read_manifest(source: Path) -> dict:
    try:
        manifest = json.loads((source / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise BackupError(f"{source} is not a backup: {MANIFEST}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BackupError(f"{source / MANIFEST} is not an ldp-survey backup manifest")
    if manifest.get("version") != VERSION:
        raise BackupError(f"backup format version {manifest.get('version')!r} is not supported")
    files = manifest.get("files")
    if not isinstance(files, dict) or not any(e.get("suffix") == "" for e in files.values()):
        raise BackupError(f"{source / MANIFEST} lists no database file")
    for name, entry in files.items():
        suffix = entry.get("suffix")
        if Path(name).name != name or not isinstance(suffix, str) or "/" in suffix:
            raise BackupError(f"{source / MANIFEST} names a file outside the backup: {name!r}")
    return manifest
