"""Enrolled device keys, in their own SQLite file (never the report store).

Keeping identities apart from reports is the point: the report store holds randomized values and
random report ids only, so nothing in it links a report to a device. The server reads the active
keys at start (``ldp-aggregator serve --devices FILE``) and checks the file on every signed
call (:class:`LiveKeys`): once ``enroll`` or ``revoke`` has returned, the very next upload is
judged by it, in every ``--workers`` process, with no restart. The loaded keys catch up within
a second (:class:`RegistryWatch`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from aggregator.errors import LdpError
from aggregator.store.sqlite.file_kind import (
    DEVICE_REGISTRY,
    FileKindError,
    claim,
    open_file,
    open_read_only,
)
from client.device.keys import device_id_for

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS devices (
    device_id TEXT PRIMARY KEY,
    public_key BLOB NOT NULL UNIQUE CHECK (length(public_key) = 32),
    enrolled_at REAL NOT NULL,
    revoked_at REAL
);
"""


class DeviceRegistryError(LdpError, ValueError):
    """An enrollment or revocation the registry refuses, or an unusable registry file."""


@dataclass(frozen=True)
class Device:
    device_id: str
    public_key: bytes  # raw 32-byte Ed25519 public key
    enrolled_at: float
    revoked_at: float | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def parse_public_key(pem: bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM (SubjectPublicKeyInfo), or DeviceRegistryError."""
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, UnsupportedAlgorithm):
        raise DeviceRegistryError("not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise DeviceRegistryError(f"expected an Ed25519 public key, got {type(key).__name__}")
    return key


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class DeviceRegistry:
    """The enrolled devices of one aggregator."""

    def __init__(
        self, path: str | os.PathLike[str], *, create: bool = False, read_only: bool = False
    ) -> None:
        """Open (``create``: or create, mode 0600) a device registry file; ``read_only`` opens
        it without changing anything. A file of another kind is refused."""
        if not create and not Path(path).exists():
            raise DeviceRegistryError(f"device registry not found: {path}")
        try:
            if read_only:
                self._conn = open_read_only(path, DEVICE_REGISTRY)
                return
            self._conn = open_file(path, DEVICE_REGISTRY)
            claim(self._conn, DEVICE_REGISTRY, path)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.executescript(_SCHEMA)
        except FileKindError as exc:
            raise DeviceRegistryError(str(exc)) from None
        except sqlite3.DatabaseError as exc:
            raise DeviceRegistryError(f"cannot open device registry {path}: {exc}") from None

    def enroll(self, public_key_pem: bytes, device_id: str | None = None) -> tuple[Device, bool]:
        """Enroll a device key; returns the device and whether it is new (enrolling the same key
        again changes nothing). ``device_id``, if given, must be the id the key derives."""
        key = parse_public_key(public_key_pem)
        derived = device_id_for(key)
        if device_id is not None and device_id != derived:
            raise DeviceRegistryError(
                f"device id {device_id!r} does not belong to this key (its id is {derived!r})"
            )
        existing = self.get(derived)
        if existing is not None:
            if not existing.active:
                raise DeviceRegistryError(
                    f"device {derived} was revoked; the device must generate a new key"
                )
            return existing, False
        device = Device(derived, _raw(key), time.time(), None)
        self._conn.execute(
            "INSERT INTO devices (device_id, public_key, enrolled_at) VALUES (?, ?, ?)",
            (device.device_id, device.public_key, device.enrolled_at),
        )
        return device, True

    def enroll_all(self, pems: Sequence[tuple[str, bytes]]) -> int:
        """Enroll many (name, PEM) keys (a folder of simulated devices) in one transaction, all
        or none; returns how many were new. An error names the key's ``name``."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            new = 0
            for name, pem in pems:
                try:
                    new += self.enroll(pem)[1]
                except DeviceRegistryError as exc:
                    raise DeviceRegistryError(f"{name}: {exc}") from None
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")
        return new

    def revoke(self, device_id: str) -> Device:
        """Revoke a device for good (a running server refuses its next upload)."""
        device = self.get(device_id)
        if device is None:
            raise DeviceRegistryError(f"unknown device {device_id!r}")
        if not device.active:
            return device
        revoked_at = time.time()
        self._conn.execute(
            "UPDATE devices SET revoked_at = ? WHERE device_id = ?", (revoked_at, device_id)
        )
        return Device(device.device_id, device.public_key, device.enrolled_at, revoked_at)

    def get(self, device_id: str) -> Device | None:
        with closing(
            self._conn.execute(
                "SELECT device_id, public_key, enrolled_at, revoked_at FROM devices "
                "WHERE device_id = ?",
                (device_id,),
            )
        ) as rows:
            row = rows.fetchone()
        return None if row is None else Device(*row)

    def devices(self) -> list[Device]:
        """Every device ever enrolled, revoked ones included, in enrollment order."""
        with closing(
            self._conn.execute(
                "SELECT device_id, public_key, enrolled_at, revoked_at FROM devices "
                "ORDER BY enrolled_at, device_id"
            )
        ) as rows:
            return [Device(*row) for row in rows]

    def active_keys(self) -> dict[str, Ed25519PublicKey]:
        """Device id -> public key of every device not revoked: what the server verifies with."""
        return {
            d.device_id: Ed25519PublicKey.from_public_bytes(d.public_key)
            for d in self.devices()
            if d.active
        }

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> DeviceRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LiveKeys(Mapping[str, Ed25519PublicKey]):
    """The enrolled keys as a server sees them: a snapshot of the registry, checked against the
    file on every look-up. While the file has commits the snapshot lacks (SQLite's
    ``data_version``, a few microseconds to read), a device's key is read from its own row, so
    an ``enroll`` or ``revoke`` that has returned governs the very next upload."""

    def __init__(self, path: str, load: Callable[[], dict[str, Ed25519PublicKey]]) -> None:
        """Watch ``path`` from a snapshot ``load`` reads (after noting the version, so a commit
        in between is not missed)."""
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._applied = self.version()
        self._snapshot = load()

    def version(self) -> int:
        """The file's ``data_version`` as this connection sees it (it moves on every commit by
        another connection)."""
        return self._conn.execute("PRAGMA data_version").fetchone()[0]

    def replace(self, snapshot: dict[str, Ed25519PublicKey], version: int) -> None:
        """Adopt a snapshot read after the file was at ``version``."""
        self._snapshot = snapshot
        self._applied = version

    def changed(self) -> int | None:
        """The file's version if it has commits the snapshot lacks, else None."""
        version = self.version()
        return None if version == self._applied else version

    def __getitem__(self, device_id: str) -> Ed25519PublicKey:
        try:
            if self.changed() is None:
                return self._snapshot[device_id]
            with closing(
                self._conn.execute(
                    "SELECT public_key FROM devices WHERE device_id = ? AND revoked_at IS NULL",
                    (device_id,),
                )
            ) as rows:
                row = rows.fetchone()
        except sqlite3.Error as exc:  # the file is unreadable now: keep to the snapshot
            log.error("cannot read the device registry (using the loaded keys): %s", exc)
            return self._snapshot[device_id]
        if row is None:
            raise KeyError(device_id)
        return Ed25519PublicKey.from_public_bytes(row[0])

    def __iter__(self) -> Iterator[str]:
        return iter(self._snapshot)

    def __len__(self) -> int:
        return len(self._snapshot)

    def close(self) -> None:
        self._conn.close()


class RegistryWatch:
    """Keeps a server's enrolled keys current with the registry file: :meth:`start` hands
    ``on_change`` a :class:`LiveKeys` (so enrollment and revocation count from the next upload),
    and its snapshot is reloaded off the event loop within ``interval`` seconds of a change."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        on_change: Callable[[Mapping[str, Ed25519PublicKey]], None],
        interval: float = 1.0,
    ) -> None:
        self._path = os.fspath(path)
        self._on_change = on_change
        self._interval = interval
        self._keys = LiveKeys(self._path, self._load)
        self._task: asyncio.Task | None = None

    def _load(self) -> dict[str, Ed25519PublicKey]:
        with DeviceRegistry(self._path) as registry:
            return registry.active_keys()

    def start(self) -> None:
        self._on_change(self._keys)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                version = self._keys.changed()
                if version is None:
                    continue
                keys = await asyncio.to_thread(self._load)
            except (sqlite3.Error, DeviceRegistryError) as exc:
                log.error("cannot reload the device registry (keeping the keys): %s", exc)
                continue
            self._keys.replace(keys, version)
            log.info("device registry reloaded: %d active devices", len(keys))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._keys.close()
