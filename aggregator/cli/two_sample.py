"""``two-sample``: did two groups answer alike? A homogeneity test of two questions, or of one
question split by two values of its survey's group label (read only; docs/two-sample.md)."""

from __future__ import annotations

import argparse
import json

from aggregator.cli.common import (
    Subcommands,
    UserError,
    add_calibration_option,
    add_command,
    add_json_option,
    add_side_option,
    add_source_options,
    load_histogram,
)
from aggregator.cli.design import add_design_options, design_based, run_design_homogeneity
from aggregator.confirm.labels import NOT_PREREGISTERED
from aggregator.errors import InsufficientDataError
from aggregator.survey_file.analyses import EXPLORATORY
from aggregator.survey_file.design import IGNORES_DESIGN


def add_commands(subparsers: Subcommands) -> None:
    two = add_command(
        subparsers,
        "two-sample",
        "did two groups answer alike? homogeneity of two questions (read only)",
    )
    add_source_options(two)
    two.add_argument("--a", metavar="SURVEY:QUESTION", help="group A: a question")
    two.add_argument("--b", metavar="SURVEY:QUESTION", help="group B: a question")
    two.add_argument("--survey", help="with --groups: the survey (it declares a group label)")
    two.add_argument("--question", help="with --groups: the question")
    two.add_argument(
        "--groups",
        nargs=2,
        metavar=("A", "B"),
        help="compare two values of the survey's group label on one question (instead of --a/--b)",
    )
    two.add_argument("--alpha", type=float, default=0.05, help="significance level")
    two.add_argument("--seed", type=int, help="seed for the Monte Carlo null")
    add_calibration_option(two, "docs/two-sample.md")
    add_side_option(two)
    add_design_options(two, test=True)
    add_json_option(two)
    two.set_defaults(run=run_two_sample)


def run_two_sample(args: argparse.Namespace) -> int:
    from aggregator.stats import two_sample
    from aggregator.survey_file.groups import check_same_definition

    # A split survey is read on one side (--side; exploration, labelled, by default), like
    # estimate and test; --side applies to both groups.
    groups = _two_sample_groups(args)
    ignored = _design_choice(args, groups)
    if ignored is None:
        return run_design_homogeneity(groups[0], [g.group for g in groups])
    (question_a, hist_a), (question_b, hist_b) = (
        load_histogram(group, test=True) for group in groups
    )
    exploratory = any(group.exploratory for group in groups)
    name_a, name_b = (
        f"{g.survey}:{g.question}" + (f"[{g.group}]" if g.group else "") for g in groups
    )
    names = (name_a, name_b)
    check_same_definition(question_a, question_b, names)
    try:
        result = two_sample(hist_a, hist_b, args.alpha, calibration=args.calibration, rng=args.seed)
    except InsufficientDataError as exc:
        raise UserError(str(exc), status=3) from None
    if args.json:
        label: dict[str, object] = {"exploratory": True} if exploratory else {}
        if args.side == "confirmation":  # outside the sealed family
            label = {"not_preregistered": True, "label": NOT_PREREGISTERED}
        if ignored:
            label |= {"ignores_design": True, "design_label": IGNORES_DESIGN}
        print(json.dumps({"a": names[0], "b": names[1], **label, **result.to_dict()}))
    else:
        if exploratory:
            print(EXPLORATORY)
        if args.side == "confirmation":
            print(NOT_PREREGISTERED)
        if ignored:
            print(IGNORES_DESIGN)
        print(f"A = {names[0]} (n = {hist_a.n}), B = {names[1]} (n = {hist_b.n})")
        print(result.summary())
    return 0


def _design_choice(args: argparse.Namespace, groups: list[argparse.Namespace]) -> bool | None:
    """None: the design-based comparison (two groups of one question of a survey with a
    sampling design); else whether the simple one ignores a declared design (--ignore-design).
    Two questions of a survey with a design have no design-based comparison: one line."""
    declared = [design_based(group) for group in groups]
    if any(declared):
        if groups[0].group and groups[1].group:
            return None
        raise UserError(
            "a design-based comparison of two questions is not available: compare two groups "
            "of one question (--survey, --question, --groups A B), or --ignore-design"
        )
    return any(group.design_ignored for group in groups)


def _two_sample_groups(args: argparse.Namespace) -> list[argparse.Namespace]:
    """The two groups of ``two-sample`` as arguments of load_histogram: two questions (--a, --b)
    or one question split by two values of its survey's group label (--survey, --question,
    --groups). One line (exit 2) for a mix of the two forms, neither, or two names of one
    group."""
    from aggregator.survey_file.groups import two_sample_request_problem

    pair = args.a is not None or args.b is not None
    grouped = args.groups is not None or args.survey is not None or args.question is not None
    if pair == grouped:
        raise UserError(
            "give either --a and --b (two questions) or --survey, --question and --groups A B "
            "(one question split by its group label)"
        )
    if pair:
        if args.a is None or args.b is None:
            raise UserError("--a and --b go together")
        if args.a == args.b:
            raise UserError(
                f"--a and --b both name {args.a}: a two-sample test compares two groups"
            )
        where = [_survey_question(flag, text) for flag, text in (("a", args.a), ("b", args.b))]
        where = [{**w, "group": ""} for w in where]
    else:
        if args.survey is None or args.question is None or args.groups is None:
            raise UserError("--groups A B needs --survey and --question")
        where = [
            {"survey": args.survey, "question": args.question, "group": g} for g in args.groups
        ]
    keys = [(w["survey"], w["question"], w["group"]) for w in where]
    problem = two_sample_request_problem(keys[0], keys[1])
    if problem:
        raise UserError(problem)
    fields = {k: v for k, v in vars(args).items() if k not in ("survey", "question", "groups")}
    return [argparse.Namespace(**fields, **w) for w in where]


def _survey_question(flag: str, text: str) -> dict[str, str]:
    """--a or --b as SURVEY:QUESTION."""
    survey, sep, question = text.partition(":")
    if not (sep and survey and question):
        raise UserError(f"--{flag} {text!r}: expected SURVEY:QUESTION")
    return {"survey": survey, "question": question}
