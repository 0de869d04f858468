"""``job``: aggregate shard files with Apache Beam. Beam and ``aggregator.jobs`` load only when
the command runs (extra [beam]); options this parser does not know go through to Beam."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from aggregator.cli.common import Subcommands, UserError, add_command, positive


def add_commands(subparsers: Subcommands) -> None:
    job = add_command(
        subparsers,
        "job",
        "aggregate shard files with Apache Beam (extra [beam])",
        allow_abbrev=False,
        epilog="Other options go to Beam's PipelineOptions, e.g. --direct-num-workers 2 "
        "--direct-running-mode multi_processing, or a runner's own options.",
    )
    job.add_argument(
        "--surveys",
        "--config",
        dest="config",
        type=Path,
        required=True,
        help="survey definitions (TOML)",
    )
    job.add_argument(
        "--shards", nargs="+", required=True, help="shard directories (with manifest) or patterns"
    )
    job.add_argument("--out", required=True, help="results JSON file")
    job.add_argument("--runner", default="DirectRunner", help="Beam runner (default DirectRunner)")
    job.add_argument(
        "--gof",
        action="append",
        default=[],
        metavar="QUESTION=P0",
        help="goodness of fit of [survey/]question against comma-separated p0 (repeatable)",
    )
    job.add_argument("--alpha", type=float, default=0.05, help="significance level")
    job.add_argument("--confidence", type=float, default=0.95, help="confidence level")
    job.add_argument("--seed", type=int, help="seed for Monte Carlo and bootstrap tests")
    job.add_argument("--calibration", choices=["auto", "asymptotic", "monte-carlo"], default="auto")
    job.add_argument(
        "--dedup",
        choices=["auto", "always", "never"],
        default="auto",
        help="count repeated report ids once (auto: when the shards are not one export)",
    )
    job.add_argument(
        "--dedup-partitions", type=positive, default=64, help="partitions of the dedup step"
    )
    job.set_defaults(run=run_job)


def run_job(args: argparse.Namespace) -> int:
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # Beam warns about optional cloud libraries
    try:
        from aggregator.jobs.job_cli import run_job_command
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "apache_beam":
            raise
        raise UserError(
            "the job command needs Apache Beam: pip install 'ldp-survey[beam]'"
        ) from None
    finally:
        root.setLevel(level)
    return run_job_command(args)


def beam_option(arg: str) -> str:
    """Beam spells its options with underscores; accept the dashed form too."""
    if not arg.startswith("--"):
        return arg
    name, sep, value = arg[2:].partition("=")
    return "--" + name.replace("-", "_") + sep + value
