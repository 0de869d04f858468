"""``backup``, ``restore``: an online copy of a report store with the files the service keeps
beside it, its manifest authenticated by a backup key the backup does not hold, and its
restoration after the manifest and every file's SHA-256 are checked."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from aggregator.cli.common import Subcommands, add_command, add_json_option

#: Files the service keeps beside the store, which a backup carries: the key of the limit
#: pseudonyms (service/limits.py) and the per-device cap counts (service/cap_file.py).
SIDECAR_SUFFIXES = (".limits-secret", ".caps")


def add_commands(subparsers: Subcommands) -> None:
    backup = add_command(
        subparsers, "backup", "online backup of a report store and its secret files"
    )
    backup.add_argument("--db", type=Path, required=True, help="the report store (may be serving)")
    backup.add_argument("--out", type=Path, required=True, help="a new or empty folder")
    backup.add_argument(
        "--key",
        type=Path,
        help="the backup key that authenticates the manifest (made if missing; keep it apart "
        "from the backups); default: <db>.backup-key",
    )
    add_json_option(backup)
    backup.set_defaults(run=run_backup)

    restore = add_command(
        subparsers, "restore", "restore a backup (checks its manifest and every file first)"
    )
    restore.add_argument("--from", dest="source", type=Path, required=True, help="backup folder")
    restore.add_argument("--db", type=Path, required=True, help="the store to restore as")
    restore.add_argument(
        "--force", action="store_true", help="replace an existing store (stop its server first)"
    )
    restore.add_argument(
        "--key",
        type=Path,
        help="the backup key the backup was made with; default: <db>.backup-key",
    )
    restore.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="restore a backup made before manifests were authenticated (format 1)",
    )
    add_json_option(restore)
    restore.set_defaults(run=run_restore)


def run_backup(args: argparse.Namespace) -> int:
    from aggregator.store.sqlite.backup import backup

    manifest = backup(args.db, args.out, SIDECAR_SUFFIXES, args.key)
    if args.json:
        print(json.dumps(manifest))
    else:
        print(
            f"backed up {manifest['reports']:,} reports and {len(manifest['files'])} files "
            f"to {args.out}"
        )
    return 0


def run_restore(args: argparse.Namespace) -> int:
    from aggregator.store.sqlite.backup import restore

    manifest = restore(args.source, args.db, args.force, args.key, args.allow_unauthenticated)
    if args.json:
        print(json.dumps(manifest))
    else:
        print(f"restored {manifest['reports']:,} reports ({manifest['created']}) as {args.db}")
    return 0
