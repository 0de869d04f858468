"""``k-sample``: did several groups answer alike? Homogeneity of one question across two or more
values of its survey's group label (read only; docs/two-sample.md, "More than two groups")."""

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
    survey_definitions,
)
from aggregator.cli.design import add_design_options, design_based, run_design_homogeneity
from aggregator.confirm.labels import NOT_PREREGISTERED
from aggregator.errors import InsufficientDataError
from aggregator.survey_file.analyses import EXPLORATORY
from aggregator.survey_file.design import IGNORES_DESIGN


def add_commands(subparsers: Subcommands) -> None:
    cmd = add_command(
        subparsers,
        "k-sample",
        "did several groups answer alike? homogeneity of one question across its group label "
        "(read only)",
    )
    add_source_options(cmd)
    cmd.add_argument("--survey", required=True, help="the survey (it declares a group label)")
    cmd.add_argument("--question", required=True, help="the question")
    cmd.add_argument(
        "--groups",
        nargs="+",
        metavar="GROUP",
        help="two or more values of the survey's group label (default: every declared value)",
    )
    cmd.add_argument("--alpha", type=float, default=0.05, help="significance level")
    cmd.add_argument("--seed", type=int, help="seed for the Monte Carlo null")
    add_calibration_option(cmd, "docs/two-sample.md")
    add_side_option(cmd)
    add_design_options(cmd, test=True)
    add_json_option(cmd)
    cmd.set_defaults(run=run_k_sample)


def run_k_sample(args: argparse.Namespace) -> int:
    from aggregator.stats import k_sample

    groups = _groups(args)
    if design_based(args):
        return run_design_homogeneity(args, groups)
    hists = []
    for group in groups:
        one = argparse.Namespace(**{**vars(args), "group": group})
        hists.append(load_histogram(one, test=True)[1])
        exploratory = one.exploratory
    try:
        result = k_sample(hists, args.alpha, calibration=args.calibration, rng=args.seed)
    except InsufficientDataError as exc:
        raise UserError(str(exc), status=3) from None
    sizes = [{"group": g, "n": h.n} for g, h in zip(groups, hists, strict=True)]
    if args.json:
        label: dict[str, object] = {"exploratory": True} if exploratory else {}
        if args.side == "confirmation":  # outside the sealed family
            label = {"not_preregistered": True, "label": NOT_PREREGISTERED}
        if args.design_ignored:
            label |= {"ignores_design": True, "design_label": IGNORES_DESIGN}
        where = {"survey": args.survey, "question": args.question, "groups": sizes}
        print(json.dumps({**where, **label, **result.to_dict()}))
    else:
        if exploratory:
            print(EXPLORATORY)
        if args.side == "confirmation":
            print(NOT_PREREGISTERED)
        if args.design_ignored:
            print(IGNORES_DESIGN)
        listed = ", ".join(f"{s['group']} (n = {s['n']})" for s in sizes)
        print(f"{args.survey}:{args.question} across {len(groups)} groups: {listed}")
        print(result.summary())
    return 0


def _groups(args: argparse.Namespace) -> list[str]:
    """The groups to compare: --groups, or every value of the survey's group label; one line
    (exit 2) for a survey without a group label, fewer than two groups, an undeclared group or
    one named twice."""
    survey = survey_definitions(args, args.survey).get(args.survey)
    if survey is None:
        raise UserError(f"unknown survey {args.survey!r}")
    label = survey.group_label
    if label is None:
        raise UserError(
            f"survey {args.survey} declares no group label: k-sample compares the groups of one "
            "question (two questions: use two-sample --a/--b)"
        )
    groups = list(args.groups or label.values)
    if len(groups) < 2:
        raise UserError("--groups needs two or more groups")
    unknown = [g for g in groups if g not in label.values]
    if unknown:
        raise UserError(
            f"{label.name} {unknown[0]!r} is not declared by survey {args.survey} "
            f"(declared: {', '.join(label.values)})"
        )
    if len(set(groups)) < len(groups):
        raise UserError("--groups names a group twice")
    return groups
