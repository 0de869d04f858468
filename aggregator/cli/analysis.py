"""``estimate`` and ``test``: frequencies with confidence intervals, and goodness-of-fit or
independence tests, of one question read from the store (read only)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from aggregator.cli.common import (
    Subcommands,
    UserError,
    add_calibration_option,
    add_command,
    add_group_option,
    add_json_option,
    add_question_options,
    add_shared_store_option,
    add_side_option,
    add_source_options,
    load_histogram,
    null_distribution,
)
from aggregator.cli.design import (
    add_design_options,
    design_based,
    run_design_estimate,
    run_design_test,
)
from aggregator.confirm.labels import NOT_PREREGISTERED
from aggregator.errors import InsufficientDataError
from aggregator.presentation.numbers import interval, share
from aggregator.survey_file.analyses import EXPLORATORY
from aggregator.survey_file.design import IGNORES_DESIGN

if TYPE_CHECKING:
    from aggregator.stats.estimate import Estimate

METHOD_HELP = (  # tests/cli/test_labels_and_cost.py holds it against the statistics' method tables
    "test method; default: the first one of the question's mechanism (t1, t2 are the "
    "large-domain U-statistics of docs/calibration.md). gof: "
    "randomized_response: pearson, t2; flip_components: projected, nonprojected, t1; gaussian: "
    "projected, nonprojected, imhof; laplace: monte-carlo; optimized_unary: pearson, t1; "
    "hadamard_response, subset_selection, local_hashing: pearson, t2; public_coin_bit: t3. "
    "independence: "
    "randomized_response: "
    "min-chi-square; flip_components, gaussian: projected, nonprojected; laplace: bootstrap; "
    "optimized_unary, hadamard_response, subset_selection, local_hashing: bootstrap"
)


def add_commands(subparsers: Subcommands) -> None:
    est = add_command(subparsers, "estimate", "frequencies with confidence intervals (read only)")
    add_source_options(est)
    add_shared_store_option(est)
    add_question_options(est)
    add_side_option(est)
    add_group_option(est)
    est.add_argument("--confidence", type=float, default=0.95, help="confidence level")
    est.add_argument(
        "--simultaneous", action="store_true", help="also intervals covering all categories at once"
    )
    est.add_argument(
        "--estimator",
        choices=["simplex", "unbiased"],
        default="simplex",
        help="simplex: shares (non-negative, summing to 1; the unbiased estimate projected onto "
        "the simplex, printed beside it); unbiased: the de-biased reports, which may fall "
        "outside [0, 1] (docs/calibration.md)",
    )
    add_design_options(est, test=False)
    est.add_argument("--seed", type=int, help="with --variance bootstrap: seed")
    add_json_option(est)
    est.set_defaults(run=run_estimate)

    test = add_command(subparsers, "test", "goodness of fit or independence test (read only)")
    add_source_options(test)
    add_shared_store_option(test)
    add_question_options(test)
    test.add_argument(
        "kind",
        choices=["gof", "independence", "homogeneity"],
        help="which test (homogeneity: across the groups of a survey with a sampling design; "
        "without a design use k-sample)",
    )
    add_side_option(test)
    add_group_option(test)
    test.add_argument(
        "--p0",
        help="gof only: the null distribution: 'uniform', one probability per category in the "
        "question's order (comma-separated), or @FILE with 'label,probability' lines (or one "
        "probability per line); summing to 1 within 1e-9",
    )
    test.add_argument("--alpha", type=float, default=0.05, help="significance level")
    test.add_argument("--method", help=METHOD_HELP)
    test.add_argument("--seed", type=int, help="seed for Monte Carlo and bootstrap tests")
    add_calibration_option(test)
    add_design_options(test, test=True)
    add_json_option(test)
    test.set_defaults(run=run_test)


def run_estimate(args: argparse.Namespace) -> int:
    # its own module, not aggregator.stats: the start-up stays under a second (docs/performance.md)
    from aggregator.stats.estimate import estimate

    if design_based(args):
        return run_design_estimate(args)
    question, hist = load_histogram(args)
    est = estimate(hist, args.confidence, simultaneous=args.simultaneous, estimator=args.estimator)
    if args.json:
        labels = {"question": question.id, "labels": question.labels}
        print(json.dumps({**labels, **_what_was_read(args), **est.to_dict()}))
    else:
        _print_what_was_read(args)
        print(estimate_table(est, question.labels))
    return 0


def estimate_table(est: Estimate, labels: list[str]) -> str:
    """The estimate as a table with its estimator and interval method; simultaneous intervals
    when computed; beside a simplex estimate its unbiased values, and beside an unbiased one,
    when a value falls outside [0, 1], the projected distribution, with what it means."""
    simplex = est.estimator == "simplex"
    beside = est.unbiased_frequencies if simplex else est.projected()
    outside = simplex or bool(est.outside.any())
    joint_low, joint_high = est.simultaneous_low, est.simultaneous_high
    joint = joint_low is not None and joint_high is not None
    width = max(8, *(len(label) for label in labels))
    level = f"{100 * est.confidence:g}% CI"
    header = f"  {'category':<{width}}  estimate    s.e.   {level:<18}"
    if joint:
        header += f"  {'simultaneous':<18}"
    method = f", intervals: {est.interval_method}" if est.interval_method else ""
    lines = [
        f"estimate [{est.mechanism}], n = {est.n}, estimator: {est.estimator_label}{method}",
        header + (f"  {'unbiased' if simplex else 'projected':>9}" if outside else ""),
    ]
    for j, label in enumerate(labels):
        ci = interval(est.ci_low[j], est.ci_high[j])
        line = f"  {label:<{width}}  {share(est.frequencies[j]):>8}  "
        line += f"{share(est.standard_errors[j]):>6}   {ci:<18}"
        if joint_low is not None and joint_high is not None:
            both = interval(joint_low[j], joint_high[j])
            line += f"  {both:<18}"
        lines.append(line + (f"  {share(beside[j]):>9}" if outside else ""))
    if joint:
        lines.append(
            f"  'simultaneous': all {len(labels)} intervals cover at once with probability at "
            f"least {100 * est.confidence:g}%"
        )
    if simplex:
        lines.append(f"  {est.simplex_note()}")
    elif outside:
        lines.append(
            "  An unbiased estimate can fall outside [0, 1] by noise; 'projected' is the nearest "
            "distribution (non-negative, sums to 1; biased), for reading off shares."
        )
    return "\n".join(line.rstrip() for line in lines)


def run_test(args: argparse.Namespace) -> int:
    from aggregator.stats.gof import goodness_of_fit  # not the composite tests' imports

    if args.kind == "independence" and args.p0:
        raise UserError("--p0 is for gof; an independence test takes no null distribution")
    if args.kind == "gof" and not args.p0:
        raise UserError("gof needs --p0 (one probability per category, comma-separated)")
    designed = design_based(args)
    if args.kind == "homogeneity" and not designed:
        raise UserError(
            "homogeneity is the design-based test across groups of a survey with a sampling "
            "design; compare groups with k-sample otherwise"
        )
    if designed:
        return run_design_test(args)
    question, hist = load_histogram(args, test=True)
    try:
        if args.kind == "gof":
            p0 = null_distribution(args.p0, question)
            result = goodness_of_fit(
                hist, p0, args.alpha, args.method, calibration=args.calibration, rng=args.seed
            )
        else:
            if len(question.shape) != 2:
                raise UserError(f"question {question.id} does not have exactly 2 attributes")
            from aggregator.stats.composite import independence

            result = independence(
                hist,
                question.shape,
                args.alpha,
                args.method,
                calibration=args.calibration,
                rng=args.seed,
            )
    except InsufficientDataError as exc:
        raise UserError(str(exc), status=3) from None
    if args.json:
        print(json.dumps({**_what_was_read(args), **result.to_dict()}))
    else:
        _print_what_was_read(args)
        print(result.summary())
    return 0


def _what_was_read(args: argparse.Namespace) -> dict:
    """For the JSON output: the side of a split survey (exploratory, or not preregistered on
    the confirmation side), and the group(s) read."""
    side: dict[str, object] = {"exploratory": True} if args.exploratory else {}
    if args.side == "confirmation":  # sealed (load_histogram checked): outside its family
        side = {"not_preregistered": True, "label": NOT_PREREGISTERED}
    if getattr(args, "design_ignored", False):
        side |= {"ignores_design": True, "design_label": IGNORES_DESIGN}
    return {**side, **args.groups}


def _print_what_was_read(args: argparse.Namespace) -> None:
    """The lines above a text result: the side's label, and which group(s) were read."""
    if args.exploratory:
        print(EXPLORATORY)
    if args.side == "confirmation":
        print(NOT_PREREGISTERED)
    if getattr(args, "design_ignored", False):
        print(IGNORES_DESIGN)
    groups = args.groups
    if not groups:
        return
    if groups["group"]:
        print(f"{groups['group_label']} = {groups['group']}")
    else:
        print(
            f"all {groups['group_label']} groups pooled ({groups['pooled']}); --group VALUE "
            "reads one group"
        )
