"""``ldp-aggregator``: serve, estimate, test, export, import, rebuild, job (Beam); enroll, revoke
and list device keys; analyst-token add/list/revoke; check-config, cost and export-survey for the
survey file; report, plan, backup and restore; two-sample; watch (live anytime-valid
monitoring).

User mistakes end with a one-line message on stderr (a JSON object with ``--json``) and a
non-zero exit status (2: bad input, 3: not enough reports to release), never a traceback. Every
command that reads the store checks the survey file against the question definitions pinned in
it (aggregator/store/definitions.py); the read-only ones (estimate, test, export) open the file
read-only and never create or change it. The analysis commands (estimate, test, two-sample,
k-sample, conditional, ordinal, report, preregister, confirm, holdout) read a running server's
Analyst service instead with ``--server`` (aggregator.remote): the same output and exit codes.

One module per command group owns its commands' options and handlers: serving, devices,
analyst_tokens, analysis (estimate, test), data (export, import, rebuild), surveys
(check-config, cost, export-survey), job, report, confirm (preregister, confirm, holdout), plan,
backup (backup, restore), two_sample, k_sample, summaries (conditional, ordinal), watch; common
holds what they share. The package may import every other aggregator package, ``aggregator.jobs``
only lazily (for ``ldp-aggregator job``); nothing outside it imports it.
"""

from __future__ import annotations

import os
import sys

# gRPC's C core reads GRPC_VERBOSITY once, when grpc is first imported: its own log lines stay
# off a CLI user's terminal (our errors say it in one line) unless asked for (debug, or
# GRPC_VERBOSITY set in the environment).
if "debug" not in sys.argv:
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import argparse
import logging
from collections.abc import Sequence

from aggregator.cli import (
    analysis,
    analyst_tokens,
    backup,
    confirm,
    data,
    devices,
    job,
    k_sample,
    plan,
    report,
    serving,
    summaries,
    surveys,
    two_sample,
    watch,
)
from aggregator.cli.common import PROG, UserError, fail
from aggregator.errors import LdpError
from aggregator.store.errors import StoreError
from aggregator.survey_file.config import ConfigError
from client import __version__
from client.cli.parsing import DefaultsFormatter, OneLineParser, reader_went_away

#: The command groups, in the order ``ldp-aggregator --help`` lists their commands.
COMMAND_GROUPS = (
    serving,
    devices,
    analyst_tokens,
    analysis,
    data,
    surveys,
    job,
    report,
    confirm,
    plan,
    backup,
    two_sample,
    k_sample,
    summaries,
    watch,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit status (safe to call again in the same process)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.run is not job.run_job:  # only the Beam job passes options through
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.beam_args = [job.beam_option(arg) for arg in extra]
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s"
    )
    try:
        return args.run(args)
    except BrokenPipeError:
        return reader_went_away()
    except UserError as exc:
        return fail(args, str(exc), exc.status)
    except (ConfigError, StoreError, LdpError, ValueError, OSError) as exc:  # incl. shard errors
        return fail(args, str(exc), 2)
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    """The ``ldp-aggregator`` parser: the global options, then every group's commands."""
    parser = OneLineParser(
        prog=PROG, description="LDP survey aggregator", formatter_class=DefaultsFormatter
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning"],
        help="log level (debug also lets gRPC's own log lines through)",
    )
    subparsers = parser.add_subparsers(required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.add_commands(subparsers)
    return parser
