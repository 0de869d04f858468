"""Signing keys of simulated devices, one Ed25519 key per device in a folder.

``ldp-client simulate-keys --out DIR --devices N`` writes ``sim-000001.key`` (private, mode
0600) and ``sim-000001.pub`` (public PEM) ... for N devices, keeping keys already there. The
operator enrolls the folder (``ldp-aggregator enroll --devices REGISTRY --public-key DIR``
enrolls every ``*.pub`` in it, also while the server runs), then ``ldp-client simulate --keys
DIR`` signs each simulated device's upload with its own key, as a real device would.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from client.device.keys import DeviceKey, DeviceKeyError

PREFIX = "sim-"


class KeyFolderError(ValueError):
    """A key folder that cannot give the simulated devices their keys."""


def key_path(folder: Path, device: int) -> Path:
    """The private key of simulated device ``device`` (0-based)."""
    return folder / f"{PREFIX}{device + 1:06d}.key"


def make_keys(folder: Path, devices: int) -> int:
    """Keys (and public PEMs) for devices 0..devices-1 in ``folder`` (created, mode 0700);
    returns how many were new. Written without the fsync a real device's key gets: a lost
    simulated key is simply made again."""
    if devices < 1:
        raise KeyFolderError("--devices must be positive")
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        new = 0
        for device in range(devices):
            path = key_path(folder, device)
            public = path.with_suffix(".pub")
            if not path.exists():
                public.write_bytes(_write_key(path))
                new += 1
            elif not public.exists():
                public.write_bytes(DeviceKey.load_or_create(path).public_key_pem())
    except OSError as exc:
        raise KeyFolderError(f"cannot write keys in {folder}: {exc.strerror or exc}") from None
    except DeviceKeyError as exc:
        raise KeyFolderError(str(exc)) from None
    return new


def _write_key(path: Path) -> bytes:
    """A new Ed25519 private key at ``path`` (PKCS#8 PEM, created 0600, never replacing one);
    its public key PEM."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, pem)
    finally:
        os.close(fd)
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def load_keys(folder: Path, devices: int) -> list[DeviceKey]:
    """The keys of devices 0..devices-1, or KeyFolderError saying how to make the missing ones."""
    if folder.exists() and not folder.is_dir():
        raise KeyFolderError(f"--keys {folder} is not a folder")
    paths = [key_path(folder, device) for device in range(devices)]
    missing = sum(not path.exists() for path in paths)
    if missing:
        raise KeyFolderError(
            f"--keys {folder} lacks {missing} of the {devices} simulated device keys: run "
            f"`ldp-client simulate-keys --out {folder} --devices {devices}`, then "
            f"`ldp-aggregator enroll --devices REGISTRY --public-key {folder}`"
        )
    try:
        return [DeviceKey.load_or_create(path) for path in paths]  # all exist: loads only
    except DeviceKeyError as exc:
        raise KeyFolderError(str(exc)) from None
