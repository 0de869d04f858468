"""``enroll``, ``revoke``, ``devices``: the registry of device keys that ``serve --devices``
checks upload signatures against (docs/threat-model.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from aggregator.cli.common import Subcommands, UserError, add_command
from aggregator.service.collector.registry import DeviceRegistry, DeviceRegistryError


def add_commands(subparsers: Subcommands) -> None:
    enroll = add_command(subparsers, "enroll", "enroll a device's Ed25519 public key")
    _add_registry_option(enroll)
    enroll.add_argument(
        "--public-key",
        type=Path,
        required=True,
        help="device public key PEM, or a folder: every *.pub in it (ldp-client simulate-keys)",
    )
    enroll.add_argument("--device-id", help="the id the device printed (checked against the key)")
    enroll.set_defaults(run=run_enroll)

    revoke = add_command(subparsers, "revoke", "revoke a device key for good")
    _add_registry_option(revoke)
    revoke.add_argument("--device-id", required=True, help="the device's id (see devices)")
    revoke.set_defaults(run=run_revoke)

    listing = add_command(subparsers, "devices", "list enrolled and revoked devices")
    _add_registry_option(listing)
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(run=run_devices)


def _add_registry_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", type=Path, required=True, help="device registry (SQLite)")


def run_enroll(args: argparse.Namespace) -> int:
    if args.public_key.is_dir():
        return _enroll_folder(args)
    try:
        pem = args.public_key.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read public key {args.public_key}: {exc.strerror}") from None
    with DeviceRegistry(args.devices, create=True) as registry:
        device, new = registry.enroll(pem, args.device_id)
    state = "enrolled" if new else "already enrolled"
    print(f"{state} device {device.device_id} in {args.devices}")
    return 0


def _enroll_folder(args: argparse.Namespace) -> int:
    """Every ``*.pub`` of a folder, in one transaction (a running server accepts them at once)."""
    if args.device_id is not None:
        raise UserError("--device-id names one key; --public-key is a folder")
    paths = sorted(args.public_key.glob("*.pub"))
    if not paths:
        raise UserError(f"folder {args.public_key} holds no *.pub public keys")
    pems = []
    for path in paths:
        try:
            pems.append((str(path), path.read_bytes()))
        except OSError as exc:
            raise UserError(f"cannot read public key {path}: {exc.strerror}") from None
    with DeviceRegistry(args.devices, create=True) as registry:
        try:
            new = registry.enroll_all(pems)
        except DeviceRegistryError as exc:
            raise UserError(f"nothing enrolled: {exc}") from None
    print(f"enrolled {new} new devices ({len(pems)} keys in {args.public_key}) in {args.devices}")
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    with DeviceRegistry(args.devices) as registry:
        device = registry.revoke(args.device_id)
    print(f"revoked device {device.device_id} (a running server refuses its next upload)")
    return 0


def run_devices(args: argparse.Namespace) -> int:
    with DeviceRegistry(args.devices, read_only=True) as registry:
        devices = registry.devices()
    rows = [
        {
            "device_id": d.device_id,
            "public_key": d.public_key.hex(),
            "enrolled_at": d.enrolled_at,
            "revoked_at": d.revoked_at,
        }
        for d in devices
    ]
    if args.json:
        print(json.dumps(rows))
    else:
        for row in rows:
            state = "active" if row["revoked_at"] is None else "revoked"
            print(f"{row['device_id']}  {state}")
    return 0
