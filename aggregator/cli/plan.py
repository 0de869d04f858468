"""``plan``: study planning, the power at n or the n a target power needs, for one mechanism or
ranked over all (docs/planning.md). Needs no survey file and no store."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from aggregator.cli.common import Subcommands, UserError, add_command, add_json_option, positive
from client.survey import MECHANISM_NAMES

if TYPE_CHECKING:
    from aggregator.planning.study import SequentialPlan, StudyPlan
    from aggregator.stats.design.power import DesignEffect
    from client.mechanisms import Mechanism

#: What --mechanism takes: one mechanism of a survey file, or all of them ranked.
PLAN_MECHANISMS = ("all", *MECHANISM_NAMES)


def add_commands(subparsers: Subcommands) -> None:
    plan = add_command(
        subparsers,
        "plan",
        "study planning: power at n, or the n a target power needs, ranked over mechanisms",
        epilog="Goodness of fit: --p0 (or --k for a uniform null); independence: --shape R,C. "
        "The alternative: --alternative (a full distribution) or --effect (Cohen's w; see "
        "docs/planning.md for the alternative it builds).",
    )
    plan.add_argument(
        "--mechanism", choices=PLAN_MECHANISMS, default="all", help="one mechanism, or rank all"
    )
    plan.add_argument("--epsilon", type=float, help="epsilon of the epsilon-LDP mechanisms")
    plan.add_argument("--rho", type=float, help="rho of --mechanism gaussian (zCDP)")
    plan.add_argument(
        "--groups",
        type=positive,
        default=10,
        help="public groups L of --mechanism public_coin_bit (default 10); its power is averaged "
        "over the public random subsets, i.e. over seeds",
    )
    null = plan.add_mutually_exclusive_group(required=True)
    null.add_argument("--p0", help="goodness of fit against this null (comma-separated)")
    null.add_argument("--k", type=positive, help="goodness of fit against uniform on k categories")
    null.add_argument("--shape", help="independence of an R x C table, e.g. 2,3")
    alternative = plan.add_mutually_exclusive_group(required=True)
    alternative.add_argument("--alternative", help="the true distribution to detect")
    alternative.add_argument("--effect", type=float, help="Cohen's effect size w to detect")
    goal = plan.add_mutually_exclusive_group(required=True)
    goal.add_argument("--n", type=positive, help="planned number of reports: give the power")
    goal.add_argument("--power", type=float, help="target power: give the reports needed")
    plan.add_argument("--alpha", type=float, default=0.05, help="significance level")
    plan.add_argument("--plot", type=Path, help="draw power against n here (.png, .svg, .pdf)")
    plan.add_argument(
        "--sequential",
        action="store_true",
        help="also where the sequential goodness-of-fit test (e-process) is expected to stop: "
        "forecast mean, median and 90%% point, the max n to plan for (docs/planning.md)",
    )
    plan.add_argument(
        "--look-every",
        type=positive,
        default=100,
        help="with --sequential: reports between two looks (default 100)",
    )
    plan.add_argument(
        "--simulate",
        type=positive,
        metavar="PATHS",
        help="with --sequential: also run the real e-process on this many simulated studies",
    )
    add_design_options(plan)
    add_json_option(plan)
    plan.set_defaults(run=run_plan)

    groups = add_command(
        subparsers,
        "plan-groups",
        "planning a comparison of groups: power with n reports per group, or the n per group "
        "a target power needs, for a two- or k-sample homogeneity test",
        epilog="Each --distributions entry is one group's expected answer distribution "
        "(comma-separated, same categories). docs/planning.md, 'Comparing groups'.",
    )
    groups.add_argument(
        "--distributions",
        nargs="+",
        required=True,
        metavar="P",
        help="two or more groups' distributions, e.g. 0.5,0.3,0.2 0.4,0.3,0.3",
    )
    groups.add_argument(
        "--allocation",
        help="relative group sizes, e.g. 1,2 (default equal): group g gets n x its share",
    )
    groups.add_argument(
        "--mechanism", choices=PLAN_MECHANISMS, default="all", help="one mechanism, or rank all"
    )
    groups.add_argument("--epsilon", type=float, help="epsilon of the epsilon-LDP mechanisms")
    groups.add_argument("--rho", type=float, help="rho of --mechanism gaussian (zCDP)")
    groups.add_argument(
        "--public-groups",
        dest="groups",
        type=positive,
        default=10,
        help="public groups L of --mechanism public_coin_bit (default 10)",
    )
    goal = groups.add_mutually_exclusive_group(required=True)
    goal.add_argument("--n", type=positive, help="reports per group (per unit of --allocation)")
    goal.add_argument("--power", type=float, help="target power: give the reports per group")
    groups.add_argument("--alpha", type=float, default=0.05, help="significance level")
    add_design_options(groups)
    add_json_option(groups)
    groups.set_defaults(run=run_plan_groups)


def add_design_options(parser: argparse.ArgumentParser) -> None:
    """A survey design's effect on the plan (docs/planning.md, 'Survey designs')."""
    design = parser.add_argument_group(
        "survey design (plan the design-based Rao-Scott test; docs/planning.md)"
    )
    design.add_argument(
        "--deff",
        type=float,
        help="design effect of the privatized reports (e.g. a pilot's deff_model), applied as is",
    )
    design.add_argument(
        "--clustering-effect",
        type=float,
        help="the answers' raw clustering effect 1 + ICC (m - 1), m the cluster size; local "
        "noise dilutes it per mechanism",
    )
    design.add_argument(
        "--weighting-effect",
        type=float,
        help="Kish's weighting effect 1 + CV(w)^2 (not diluted by local noise)",
    )
    design.add_argument(
        "--design-df",
        type=positive,
        help="design degrees of freedom (PSUs - strata): refer to the F law of the default "
        "Rao-Scott test (default: chi-square, many PSUs)",
    )


def _design(args: argparse.Namespace) -> tuple[DesignEffect | None, int | None]:
    """The planned design effect from the options (None: a simple random sample)."""
    from aggregator.errors import InvalidInputError
    from aggregator.stats.design.power import DesignEffect

    parts = (args.clustering_effect, args.weighting_effect)
    if args.deff is not None and any(p is not None for p in parts):
        raise UserError("give --deff or --clustering-effect/--weighting-effect, not both")
    if args.deff is None and all(p is None for p in parts):
        if args.design_df is not None:
            raise UserError("--design-df needs a design effect (--deff or --clustering-effect)")
        return None, None
    try:
        if args.deff is not None:
            return DesignEffect(total=args.deff), args.design_df
        return DesignEffect(*(1.0 if p is None else p for p in parts)), args.design_df
    except InvalidInputError as exc:
        raise UserError(f"{exc}") from None


def run_plan(args: argparse.Namespace) -> int:
    from aggregator.planning.study import (
        interaction_alternative,
        plan_sequential,
        plan_study,
        plot_power_curves,
        tilted_alternative,
    )
    from aggregator.stats.validate import check_distribution

    if not args.sequential and (args.simulate is not None or args.look_every != 100):
        raise UserError("--look-every and --simulate go with --sequential")
    null, shape = None, None
    if args.shape is not None:
        shape = _shape(args.shape)
        k = shape[0] * shape[1]
    elif args.p0 is not None:
        null = check_distribution(_numbers("--p0", args.p0), len(args.p0.split(",")), "--p0")
        k = null.size
    else:
        k = args.k
        null = np.full(k, 1.0 / k)
    if args.alternative is not None:
        alternative = _numbers("--alternative", args.alternative)
        if alternative.size != k:
            raise UserError(f"--alternative has {alternative.size} probabilities, the null {k}")
    elif shape is not None:
        alternative = interaction_alternative(shape, args.effect)
    else:
        assert null is not None  # --p0 or --k gave one: only --shape plans without a null
        alternative = tilted_alternative(null, args.effect)
    epsilon, mechanisms = _plan_mechanisms(args, k)
    design, design_df = _design(args)
    plan = plan_study(
        k=k,
        epsilon=epsilon,
        alternative=alternative,
        null=null,
        shape=shape,
        mechanisms=mechanisms,
        n=args.n,
        target_power=args.power,
        alpha=args.alpha,
        design=design,
        design_df=design_df,
    )
    if args.plot is not None:
        plot_power_curves(plan, args.plot)
    shown: StudyPlan | SequentialPlan = plan
    if args.sequential:
        shown = plan_sequential(plan, batch=args.look_every, simulate=args.simulate or 0)
    print(json.dumps(shown.to_dict()) if args.json else shown.summary())
    if args.plot is not None:  # on stderr: stdout stays the plan (and valid JSON with --json)
        print(f"power curves written to {args.plot.resolve()}", file=sys.stderr)
    return 0


def run_plan_groups(args: argparse.Namespace) -> int:
    from aggregator.planning.groups import plan_groups

    distributions = [_numbers("--distributions", text).tolist() for text in args.distributions]
    allocation = (
        None if args.allocation is None else _numbers("--allocation", args.allocation).tolist()
    )
    epsilon, mechanisms = _plan_mechanisms(args, len(distributions[0]))
    design, design_df = _design(args)
    plan = plan_groups(
        distributions=distributions,
        epsilon=epsilon,
        mechanisms=mechanisms,
        n=args.n,
        target_power=args.power,
        allocation=allocation,
        alpha=args.alpha,
        design=design,
        design_df=design_df,
    )
    print(json.dumps(plan.to_dict()) if args.json else plan.summary())
    return 0


def _plan_mechanisms(args: argparse.Namespace, k: int) -> tuple[float, list[Mechanism] | None]:
    """The epsilon the advisor compares at, and the one mechanism asked for (None: all)."""
    from client.mechanisms import (
        FlipComponents,
        GaussianNoise,
        HadamardResponse,
        LaplaceNoise,
        LocalHashing,
        OptimizedUnaryEncoding,
        PublicCoinBit,
        RandomizedResponse,
        SubsetSelection,
    )

    if args.mechanism == "gaussian":
        if args.rho is None:
            raise UserError("--mechanism gaussian needs --rho")
        return math.sqrt(2 * args.rho), [GaussianNoise(k, args.rho)]
    if args.rho is not None:
        raise UserError("--rho is for --mechanism gaussian; the others take --epsilon")
    if args.epsilon is None:
        raise UserError(f"--mechanism {args.mechanism} needs --epsilon")
    kinds: dict[str, Callable[[int, float], Mechanism]] = {
        "randomized_response": RandomizedResponse,
        "flip_components": FlipComponents,
        "laplace": LaplaceNoise,
        "optimized_unary": OptimizedUnaryEncoding,
        "hadamard_response": HadamardResponse,
        "subset_selection": SubsetSelection,
        "local_hashing": LocalHashing,
    }
    if args.mechanism == "all":
        return args.epsilon, None
    if args.mechanism == "public_coin_bit":  # the seed does not change the planned power
        try:
            return args.epsilon, [PublicCoinBit(k, args.epsilon, 0, args.groups)]
        except ValueError as exc:
            raise UserError(str(exc)) from None
    return args.epsilon, [kinds[args.mechanism](k, args.epsilon)]


def _numbers(flag: str, text: str) -> np.ndarray:
    """A comma-separated list of numbers given with ``flag``."""
    try:
        return np.array([float(x) for x in text.split(",")])
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected comma-separated numbers") from None


def _shape(text: str) -> tuple[int, int]:
    """--shape R,C: the two category counts of an independence test."""
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) >= 2 for p in parts):
        raise UserError(f"--shape {text!r}: expected two category counts >= 2, e.g. 2,3")
    return int(parts[0]), int(parts[1])
