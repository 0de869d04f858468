"""``analyst-token add|list|revoke``: the hashed bearer tokens ``serve --analyst-tokens`` checks
Analyst callers against (aggregator/service/analyst/tokens.py, docs/operations.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from aggregator.cli.common import Subcommands, UserError, add_command
from aggregator.service.analyst import tokens as analyst_tokens


def add_commands(subparsers: Subcommands) -> None:
    command = add_command(subparsers, "analyst-token", "mint, list or revoke analyst tokens")
    actions = command.add_subparsers(required=True, metavar="ACTION")

    add = add_command(actions, "add", "mint a token: printed once, only its hash is stored")
    add.add_argument("name", help="the analyst's name (audit log, analysis limits)")
    _add_file_option(add)
    add.set_defaults(run=run_add)

    listing = add_command(actions, "list", "list the tokens' names")
    _add_file_option(listing)
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(run=run_list)

    revoke = add_command(actions, "revoke", "revoke a token (a running server rereads the file)")
    revoke.add_argument("name", help="the token's name")
    _add_file_option(revoke)
    revoke.set_defaults(run=run_revoke)


def _add_file_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=Path, required=True, help="the token file (mode 0600)")


def run_add(args: argparse.Namespace) -> int:
    try:
        token = analyst_tokens.mint(args.tokens, args.name)
    except analyst_tokens.TokenFileError as exc:
        raise UserError(str(exc)) from None
    print(token)
    print(
        f"analyst token {args.name!r}: give it to the analyst now, it is not shown again",
        file=sys.stderr,
    )
    return 0


def run_list(args: argparse.Namespace) -> int:
    try:
        names = sorted(analyst_tokens.read_tokens(args.tokens))
    except analyst_tokens.TokenFileError as exc:
        raise UserError(str(exc)) from None
    if args.json:
        print(json.dumps(names))
    else:
        for name in names:
            print(name)
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    try:
        analyst_tokens.revoke(args.tokens, args.name)
    except analyst_tokens.TokenFileError as exc:
        raise UserError(str(exc)) from None
    print(f"revoked analyst token {args.name} (a running server refuses it from its next call)")
    return 0
