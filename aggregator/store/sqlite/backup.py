"""Online backup and restore of a report store.

``backup`` copies the live SQLite database with SQLite's backup API in one step (a consistent
snapshot, taken while the server keeps writing: in WAL mode a reader never blocks the writer),
the files the service keeps beside it (``<db>.limits-secret``, the key of the per-device limit
pseudonyms, and ``<db>.caps``, the per-device cap counts: without them caps restart from zero),
and writes ``MANIFEST.json`` with every file's SHA-256, authenticated by an HMAC-SHA256 under a
backup key that the backup does not contain (``<db>.backup-key`` beside the live store by default,
or a key file the operator keeps elsewhere): whoever can edit a backup can rewrite its digests,
but cannot forge the MAC. ``restore`` checks the MAC and every digest before it writes anything
and refuses to overwrite a store unless told to.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import sqlite3
from collections.abc import Sequence
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

from aggregator.store.errors import StoreError
from aggregator.store.sqlite.lock import StoreInUseError, StoreLock

MANIFEST = "MANIFEST.json"
FORMAT = "ldp-survey-backup"
VERSION = 2  # 1: the manifest was not authenticated
UNAUTHENTICATED_VERSION = 1
SQLITE_HEADER = b"SQLite format 3\x00"


KEY_SUFFIX = ".backup-key"
KEY_BYTES = 32


class BackupError(StoreError):
    """A backup or restore cannot be made (the message says which file and why)."""


def default_key_file(db: Path) -> Path:
    """Where the backup key of the store ``db`` lives unless the operator names another file."""
    return Path(f"{db}{KEY_SUFFIX}")


def read_key(key_file: Path) -> bytes:
    """The backup key in ``key_file`` (at least 32 bytes), or a BackupError saying what is wrong."""
    try:
        key = key_file.read_bytes()
    except FileNotFoundError:
        raise BackupError(f"backup key not found: {key_file}") from None
    except OSError as exc:
        raise BackupError(f"cannot read backup key {key_file}: {exc.strerror}") from None
    if len(key) < KEY_BYTES:
        raise BackupError(f"backup key {key_file} is shorter than {KEY_BYTES} bytes")
    return key


def key_for_backup(key_file: Path) -> bytes:
    """The key in ``key_file``, made (random, mode 0600) the first time a backup needs it."""
    try:
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_key(key_file)
    except OSError as exc:
        raise BackupError(f"cannot create backup key {key_file}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as stream:
        stream.write(os.urandom(KEY_BYTES))
    return read_key(key_file)


def key_id(key: bytes) -> str:
    """A short public name of a key (so a restore can say which key it needs)."""
    return hashlib.sha256(b"ldp-survey backup key id\x00" + key).hexdigest()[:16]


def manifest_mac(manifest: dict, key: bytes) -> str:
    """HMAC-SHA256 of the manifest's canonical JSON (every field but ``mac``)."""
    fields = {name: value for name, value in manifest.items() if name != "mac"}
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def backup(
    db: Path,
    destination: Path,
    sidecar_suffixes: Sequence[str] = (),
    key_file: Path | None = None,
) -> dict:
    """Back up the store ``db`` and its existing ``<db><suffix>`` files into the new folder
    ``destination``, the manifest authenticated with the key in ``key_file`` (default
    ``<db>.backup-key``, made on first use); returns the manifest."""
    if not db.is_file():
        raise BackupError(f"report store not found: {db}")
    key = key_for_backup(key_file or default_key_file(db))
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
        "key_id": key_id(key),
    }
    manifest["mac"] = manifest_mac(manifest, key)
    fd = os.open(destination / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as stream:
        stream.write(json.dumps(manifest, indent=2) + "\n")
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


def restore(
    source: Path,
    db: Path,
    force: bool = False,
    key_file: Path | None = None,
    allow_unauthenticated: bool = False,
) -> dict:
    """Restore the backup folder ``source`` as the store ``db`` (and its sidecar files). The
    manifest's MAC is checked with the key in ``key_file`` (default ``<db>.backup-key``) and then
    every file's digest, before anything is written; a backup of format 1 (no MAC) only with
    ``allow_unauthenticated``. An existing store (or its WAL) is refused unless ``force``, and a
    store a running server holds always (its lock is taken while the files are replaced)."""
    manifest = read_manifest(source)
    if manifest["version"] == UNAUTHENTICATED_VERSION:
        if not allow_unauthenticated:
            raise BackupError(
                f"{source} was made by an earlier version and is not authenticated: check it "
                "came from your server, then restore it with --allow-unauthenticated"
            )
    else:
        check_mac(source, manifest, key_file or default_key_file(db))
    for name, entry in manifest["files"].items():
        if _digest(source / name) != entry["sha256"]:
            raise BackupError(f"{source / name} does not match its SHA-256 in {MANIFEST}")
    db.parent.mkdir(parents=True, exist_ok=True)
    try:
        lock = StoreLock(db)  # held while the files are replaced: no server may start meanwhile
    except StoreInUseError as exc:
        raise BackupError(f"{exc}: stop it before restoring over its store") from None
    with lock:
        _replace_store(source, db, manifest, force)
    return manifest


def _replace_store(source: Path, db: Path, manifest: dict, force: bool) -> None:
    """Copy the backup's checked files over ``db`` and its sidecars, each file replaced at once."""
    targets = [Path(f"{db}{entry['suffix']}") for entry in manifest["files"].values()]
    existing = [p for p in [*targets, Path(f"{db}-wal")] if p.exists()]
    if existing and not force:
        raise BackupError(f"{existing[0]} exists; stop the server and pass --force to replace it")
    for stale in (Path(f"{db}-wal"), Path(f"{db}-shm")):
        stale.unlink(missing_ok=True)  # a WAL of the replaced store must never meet the copy
    for name, target in zip(manifest["files"], targets, strict=True):
        partial = target.with_name(target.name + ".restoring")
        shutil.copyfile(source / name, partial)
        partial.chmod(0o600)
        os.replace(partial, target)


def check_mac(source: Path, manifest: dict, key_file: Path) -> None:
    """Refuse a manifest whose MAC does not verify under the key in ``key_file``."""
    wanted = manifest.get("key_id")
    try:
        key = read_key(key_file)
    except BackupError as exc:
        raise BackupError(
            f"{exc}; restoring {source} needs the backup key {wanted} of the store it came from "
            "(pass --key FILE)"
        ) from None
    if key_id(key) != wanted:
        raise BackupError(f"{source} was authenticated with key {wanted}, {key_file} holds another")
    mac = manifest.get("mac")
    if not isinstance(mac, str) or not hmac.compare_digest(mac, manifest_mac(manifest, key)):
        raise BackupError(f"{source / MANIFEST} fails its authentication: it was altered")


def read_manifest(source: Path) -> dict:
    try:
        manifest = json.loads((source / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise BackupError(f"{source} is not a backup: {MANIFEST}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BackupError(f"{source / MANIFEST} is not an ldp-survey backup manifest")
    if manifest.get("version") not in (VERSION, UNAUTHENTICATED_VERSION):
        raise BackupError(f"backup format version {manifest.get('version')!r} is not supported")
    files = manifest.get("files")
    if not isinstance(files, dict) or not any(e.get("suffix") == "" for e in files.values()):
        raise BackupError(f"{source / MANIFEST} lists no database file")
    for name, entry in files.items():
        suffix = entry.get("suffix")
        if Path(name).name != name or not isinstance(suffix, str) or "/" in suffix:
            raise BackupError(f"{source / MANIFEST} names a file outside the backup: {name!r}")
    return manifest
