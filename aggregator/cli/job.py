"""``job``: aggregate shard files (or one snapshot of a shared PostgreSQL store) with Apache
Beam. Beam and ``aggregator.jobs`` load only when the command runs (extra [beam]); options this
parser does not know go through to Beam."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from aggregator.cli.common import (
    Subcommands,
    UserError,
    add_command,
    add_side_option,
    check_store_url,
    find_survey,
    positive,
    side_of,
)
from aggregator.stats.design.options import DEFAULT_REPLICATES, DEFAULT_VARIANCE, VARIANCES
from aggregator.survey_file.config import load_surveys


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
    source = job.add_mutually_exclusive_group(required=True)
    source.add_argument("--shards", nargs="+", help="shard directories (with manifest) or patterns")
    source.add_argument(
        "--store",
        metavar="URL",
        help="instead: read one survey (--survey, --side) from one snapshot of a shared "
        "PostgreSQL store (postgresql://...; extra [postgres])",
    )
    job.add_argument("--survey", help="with --store: the survey to aggregate")
    add_side_option(job)
    job.add_argument(
        "--ranges",
        type=_ranges,
        default=16,
        help="with --store: report-id ranges read in parallel (1-256)",
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
        "--design",
        action="store_true",
        help="design-based estimates of surveys with a sampling design, from the exports' "
        "design statistics: the default for such surveys (docs/beam-job.md)",
    )
    job.add_argument(
        "--ignore-design",
        action="store_true",
        help="surveys with a sampling design as simple random samples (their results then say "
        "they ignore the design)",
    )
    job.add_argument(
        "--variance",
        choices=VARIANCES,
        default=DEFAULT_VARIANCE,
        help=f"with --design: the variance method (default {DEFAULT_VARIANCE})",
    )
    job.add_argument(
        "--replicates",
        type=positive,
        default=DEFAULT_REPLICATES,
        help="with --design: bootstrap replicates",
    )
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


def _ranges(text: str) -> int:
    value = positive(text)
    if value > 256:
        raise argparse.ArgumentTypeError("at most 256")
    return value


def run_job(args: argparse.Namespace) -> int:
    if args.design and args.ignore_design:
        raise UserError("--design and --ignore-design contradict each other: give one")
    if args.store is not None:  # checked before Beam loads
        check_store_url(args.store)
        if args.design:
            raise UserError("--design reads exports: export --store, then run the job on it")
        if args.survey is None:
            raise UserError("--store needs --survey: the job reads one survey from the store")
        survey = find_survey(load_surveys(args.config), args.survey, args.config)
        if survey.design is not None and not args.ignore_design:
            raise UserError(
                f"survey {survey.id} declares a sampling design, and a direct read of the "
                "store has no design statistics: export --store and run the job on the export "
                "(design-based), or give --ignore-design"
            )
        args.store_side = side_of(survey, args.side)
    elif args.survey is not None or args.side is not None:
        raise UserError("--survey and --side go with --store (shards name their survey)")
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
