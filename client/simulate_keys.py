"""Signing keys of simulated devices, one Ed25519 key per device in a folder.

``ldp-client simulate-keys --out DIR --devices N`` writes ``sim-000001.key`` (private, mode
0600) and ``sim-000001.pub`` (public PEM) ... for N devices, keeping keys already there. The
operator enrolls the folder (``ldp-aggregator enroll --devices REGISTRY --public-key DIR``
enrolls every ``*.pub`` in it, also while the server runs), then ``ldp-client simulate --keys
DIR`` signs each simulated device's upload with its own key, as a real device would.
"""

from __future__ import annotations

from pathlib import Path

from client.device.keys import DeviceKey, DeviceKeyError

PREFIX = "sim-"


class KeyFolderError(ValueError):
    """A key folder that cannot give the simulated devices their keys."""


def key_path(folder: Path, device: int) -> Path:
    """The private key of simulated device ``device`` (0-based)."""
    return folder / f"{PREFIX}{device + 1:06d}.key"


def make_keys(folder: Path, devices: int) -> int:
    """Keys (and public PEMs) for devices 0..devices-1 in ``folder`` (created, mode 0700);
    returns how many were new."""
    if devices < 1:
        raise KeyFolderError("--devices must be positive")
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        new = 0
        for device in range(devices):
            path = key_path(folder, device)
            new += not path.exists()
            key = DeviceKey.load_or_create(path)
            public = path.with_suffix(".pub")
            if not public.exists():
                public.write_bytes(key.public_key_pem())
    except OSError as exc:
        raise KeyFolderError(f"cannot write keys in {folder}: {exc.strerror or exc}") from None
    except DeviceKeyError as exc:
        raise KeyFolderError(str(exc)) from None
    return new


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
