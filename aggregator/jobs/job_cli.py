"""``ldp-aggregator job``: turn the command line into a JobSpec, run it, print a summary."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import tempfile
import threading
from collections.abc import Iterator

from apache_beam.options.pipeline_options import PipelineOptions

from aggregator.errors import LdpError
from aggregator.jobs import inputs, pipeline
from aggregator.jobs.design import DesignAnalysis
from aggregator.jobs.results import Analysis
from aggregator.survey_file.config import load_surveys
from aggregator.survey_file.null_text import NullTextError, parse_null
from client.cli.progress import bar, shown
from client.survey import SurveySpec

log = logging.getLogger(__name__)
#: Runners whose workers run on this machine, so they can mark shards in a local directory.
LOCAL_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "FnApiRunner")


class JobFailedError(LdpError):
    """The pipeline stopped with an error (its last line is the message)."""


def run_job_command(args: argparse.Namespace) -> int:
    surveys = load_surveys(args.config)
    if args.store is not None:
        return _run_on_store(args, surveys)
    found = inputs.resolve(args.shards, surveys)
    dedup = args.dedup == "always" or (args.dedup == "auto" and found.may_overlap)
    spec = pipeline.JobSpec(
        surveys=surveys,
        shards=found.shards,
        out=args.out,
        analysis=_analysis(args, surveys, found.sides),
        dedup_partitions=args.dedup_partitions if dedup else 0,
        design=_design(args, surveys),
        designs=found.designs,
        ignores_design=args.ignore_design,
    )
    options = _options(args)
    with shard_progress(args.runner, len(spec.shards)) as progress_dir:
        document = _run(dataclasses.replace(spec, progress_dir=progress_dir), options)
    _summary(document)
    print(f"wrote {args.out} ({len(spec.shards)} shard(s), deduplicated: {bool(dedup)})")
    return 0


def _run_on_store(args: argparse.Namespace, surveys: dict[str, SurveySpec]) -> int:
    """``job --store URL --survey S``: the survey's reports (one side of a split survey) read
    from one snapshot of a shared PostgreSQL store, in ``--ranges`` parallel ranges, after the
    checks an export makes (definitions pinned, side readable)."""
    from aggregator.jobs.postgres_source import held_snapshot, ranges
    from aggregator.store.postgres import pins
    from aggregator.store.postgres.engine import PostgresStore

    survey, side = surveys[args.survey], args.store_side
    with PostgresStore(args.store) as store:
        pins.check(store, surveys, args.config)
        store.analysis().check_readable(survey, side)
    sides = {survey.id: side} if survey.split else {}
    options = _options(args)
    with held_snapshot(args.store) as snapshot:
        spec = pipeline.JobSpec(
            surveys=surveys,
            shards=(),
            out=args.out,
            analysis=_analysis(args, surveys, sides),
            tables=ranges(args.store, snapshot, survey.id, side or None, args.ranges),
            ignores_design=args.ignore_design,
        )
        document = _run(spec, options)
    _summary(document)
    print(f"wrote {args.out} ({args.ranges} range(s) of one snapshot of the store)")
    return 0


def _design(args: argparse.Namespace, surveys: dict[str, SurveySpec]) -> DesignAnalysis | None:
    """Design-based estimates with ``estimate --design``'s options: with --design, or by
    default when a survey declares a sampling design (not with --ignore-design)."""
    declared = any(survey.design is not None for survey in surveys.values())
    if args.ignore_design or not (args.design or declared):
        return None
    return DesignAnalysis(args.variance, args.replicates, args.seed or 0, args.confidence)


def _analysis(
    args: argparse.Namespace, surveys: dict[str, SurveySpec], sides: dict[str, int]
) -> Analysis:
    return Analysis(
        confidence=args.confidence,
        alpha=args.alpha,
        seed=args.seed,
        calibration=args.calibration,
        gof=dict(parse_gof(option, surveys) for option in args.gof),
        sides=sides,
    )


def _options(args: argparse.Namespace) -> list[str]:
    """Beam's options, with Beam's own failure logging silenced unless asked for."""
    quiet = logging.getLogger().getEffectiveLevel() >= logging.WARNING
    if quiet:  # a failure is reported below in one line; Beam would log it again at length
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
    return beam_options(args.runner, args.beam_args, quiet)


def _run(spec: pipeline.JobSpec, options: list[str]) -> dict:
    """Run the pipeline; its failure is one JobFailedError line."""
    try:
        return pipeline.run(spec, options)
    except (ValueError, LdpError, OSError, RuntimeError) as exc:
        log.debug("job failed", exc_info=True)
        raise JobFailedError(f"job failed: {last_line(exc)}") from None


def _summary(document: dict) -> None:
    """One line per result."""
    for result in document["results"]:
        status = "released" if result["released"] else "NOT released (below min_batch_size)"
        if "side" in result:
            status += f", {result['side']} side" + (
                " (exploratory)" if result["exploratory"] else ""
            )
        group = result.get("group")
        which = "" if group is None else f" [{group or 'all ' + result['group_label'] + 's'}]"
        print(f"{result['survey']}/{result['question']}{which}: n = {result['n']}, {status}")


@contextlib.contextmanager
def shard_progress(runner: str, shards: int) -> Iterator[str | None]:
    """A bar of the shards read, on a terminal and with a local runner (whose workers share this
    machine's files): yields the directory where the pipeline marks each shard read (None: no
    bar), and counts the marks while the job runs."""
    if runner not in LOCAL_RUNNERS or not shown():
        yield None
        return
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="ldp-job-progress-") as directory:

        def watch() -> None:
            with bar(shards, "job", unit="shards read") as progress:
                done, finished = 0, False
                while not finished:
                    finished = stop.wait(0.2)
                    marked = len(os.listdir(directory))
                    progress.update(marked - done)
                    done = marked
                progress.refresh()  # the final count, however soon after the last one

        watcher = threading.Thread(target=watch, name="job-progress", daemon=True)
        watcher.start()
        try:
            yield directory
        finally:
            stop.set()
            watcher.join()


def beam_options(runner: str, passthrough: list[str], quiet: bool) -> list[str]:
    """Beam's arguments; an option no Beam options class knows is a user error (Beam itself
    would only warn and drop it)."""
    options = [f"--runner={runner}", *passthrough]
    if quiet and not any(a.startswith("--default_sdk_harness_log_level") for a in passthrough):
        options.append("--default_sdk_harness_log_level=ERROR")  # worker processes' logs
    parsed = PipelineOptions(options)
    unknown = set(parsed.get_all_options(retain_unknown_options=True)) - set(
        parsed.get_all_options()
    )
    if unknown:
        raise inputs.JobInputError(f"unknown Beam option(s): {', '.join(sorted(unknown))}")
    return options


def parse_gof(option: str, surveys: dict[str, SurveySpec]) -> tuple[tuple[str, str], tuple]:
    """``[survey/]question=P0`` -> ((survey, question), p0); the question must exist and P0 be a
    distribution over its categories, written as for ``test --p0`` (``uniform``, numbers in
    category order, ``@file``; aggregator/survey_file/null_text.py)."""
    name, sep, values = option.partition("=")
    if not sep:
        raise inputs.JobInputError(f"--gof {option!r}: expected QUESTION=P0")
    survey_id, slash, question_id = name.rpartition("/")
    matches = [
        (survey.id, question.id)
        for survey in surveys.values()
        for question in survey.questions
        if question.id == question_id and (not slash or survey.id == survey_id)
    ]
    if len(matches) != 1:
        problem = "matches no question" if not matches else "is ambiguous: use survey/question"
        raise inputs.JobInputError(f"--gof {name!r} {problem}")
    key = matches[0]
    question = surveys[key[0]].question(key[1])
    try:
        p0 = parse_null(values, question.labels, "p0")
    except NullTextError as exc:
        raise inputs.JobInputError(f"--gof {name}: {exc}") from None
    return key, p0


def last_line(exc: BaseException) -> str:
    """The informative end of an error that may carry a remote traceback."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
