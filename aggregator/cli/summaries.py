"""``conditional`` and ``ordinal``: the summaries beside a distribution (read only) —
P(one attribute | the other) of a two-attribute question, and the mean score of a question
declared ordinal with a trend test across groups (aggregator/stats/summaries.py)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from aggregator.cli.common import (
    Subcommands,
    UserError,
    add_command,
    add_group_option,
    add_json_option,
    add_question_options,
    add_shared_store_option,
    add_side_option,
    add_source_options,
    check_source,
    load_histogram,
)
from aggregator.cli.design import (
    add_design_options,
    design_based,
    load_design,
)
from aggregator.confirm.labels import NOT_PREREGISTERED
from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.presentation.numbers import fixed, interval, share
from aggregator.survey_file.analyses import EXPLORATORY
from aggregator.survey_file.config import load_scores, load_surveys
from aggregator.survey_file.design import IGNORES_DESIGN

if TYPE_CHECKING:
    from aggregator.stats.summaries import Conditional, MeanScore, TrendResult


def add_commands(subparsers: Subcommands) -> None:
    cond = add_command(
        subparsers,
        "conditional",
        "P(one attribute | the other) of a two-attribute question, with intervals (read only)",
    )
    add_source_options(cond)
    add_question_options(cond)
    add_side_option(cond)
    add_group_option(cond)
    cond.add_argument(
        "--given",
        metavar="ATTRIBUTE",
        help="the attribute conditioned on (default: the question's second attribute)",
    )
    cond.add_argument("--confidence", type=float, default=0.95, help="confidence level")
    cond.add_argument("--seed", type=int, help="with --variance bootstrap: seed")
    add_design_options(cond, test=False, intervals=False)
    add_shared_store_option(cond)
    add_json_option(cond)
    cond.set_defaults(run=run_conditional)

    ordinal = add_command(
        subparsers,
        "ordinal",
        "mean score of an ordinal question, and a trend test across groups (read only)",
    )
    add_source_options(ordinal)
    add_shared_store_option(ordinal)
    add_question_options(ordinal)
    add_side_option(ordinal)
    where = ordinal.add_mutually_exclusive_group()
    where.add_argument("--group", help="one value of the survey's group label (default: pooled)")
    where.add_argument(
        "--groups",
        nargs="+",
        metavar="GROUP",
        help="mean score per group and the trend test of equal mean scores across them",
    )
    ordinal.add_argument("--confidence", type=float, default=0.95, help="confidence level")
    ordinal.add_argument("--alpha", type=float, default=0.05, help="level of the trend test")
    ordinal.add_argument("--seed", type=int, help="with --variance bootstrap: seed")
    add_design_options(ordinal, test=False)
    add_json_option(ordinal)
    ordinal.set_defaults(run=run_ordinal)


def run_conditional(args: argparse.Namespace) -> int:
    from aggregator.stats import estimate
    from aggregator.stats.summaries import conditional

    designed = design_based(args)
    question, hist = load_histogram(args)
    if len(question.attributes) != 2:
        raise UserError(
            f"question {question.id} has {len(question.attributes)} attribute(s); conditional "
            "distributions need a question of two attributes"
        )
    names = [a.name for a in question.attributes]
    given_name = args.given or names[1]
    if given_name not in names:
        raise UserError(f"--given {given_name!r}: question {question.id} has {', '.join(names)}")
    given = names.index(given_name)
    outcome = question.attributes[1 - given]
    condition = question.attributes[given]
    design = IGNORES_DESIGN if args.design_ignored else None
    try:
        size_rows, size_columns = question.shape
        if designed:
            cond, design = _design_conditional(args, (size_rows, size_columns), given)
        else:
            est = estimate(hist, args.confidence)
            cond = conditional(est, (size_rows, size_columns), given=given)
    except InvalidInputError as exc:
        raise UserError(str(exc)) from None
    if args.json:
        rows = [
            {
                given_name: value,
                "bounded": bool(cond.bounded[j]),
                "condition_share": float(cond.condition_shares[j]),
                "shares": {
                    category: {
                        "share": float(cond.shares[i, j]),
                        "ci_low": float(cond.low[i, j]),
                        "ci_high": float(cond.high[i, j]),
                    }
                    for i, category in enumerate(outcome.categories)
                },
            }
            for j, value in enumerate(condition.categories)
        ]
        label: dict[str, object] = {"exploratory": True} if args.exploratory else {}
        if args.side == "confirmation":  # outside the sealed family
            label = {"not_preregistered": True, "label": NOT_PREREGISTERED}
        if args.design_ignored:
            label |= {"ignores_design": True, "design_label": IGNORES_DESIGN}
        elif design is not None:
            label["design"] = design
        print(
            json.dumps(
                {
                    "question": question.id,
                    "outcome": outcome.name,
                    "given": given_name,
                    "n": hist.n,
                    "confidence": cond.confidence,
                    **label,
                    "conditional": rows,
                }
            )
        )
        return 0
    if args.exploratory:
        print(EXPLORATORY)
    if args.side == "confirmation":
        print(NOT_PREREGISTERED)
    if design is not None:
        print(design)
    level = f"{100 * cond.confidence:g}% CI (Fieller)"
    print(f"P({outcome.name} | {given_name}) of {question.id}, n = {hist.n}")
    width = max(8, *(len(c) for c in outcome.categories))
    for j, value in enumerate(condition.categories):
        note = "" if cond.bounded[j] else "  (not estimable: too few reports in this condition)"
        print(f"{given_name} = {value} (share {share(cond.condition_shares[j])}){note}")
        print(f"  {outcome.name:<{width}}  share     {level}")
        for i, category in enumerate(outcome.categories):
            ci = interval(cond.low[i, j], cond.high[i, j])
            print(f"  {category:<{width}}  {share(cond.shares[i, j]):>8}  {ci}")
    return 0


def _design_conditional(
    args: argparse.Namespace, shape: tuple[int, int], given: int
) -> tuple[Conditional, str]:
    """The design-based conditional distribution (--db or --store) and its design line."""
    from aggregator.stats.design.conditional import design_conditional
    from aggregator.stats.design.estimate import design_estimate

    if args.server is not None:
        raise UserError(
            "a design-based conditional reads the design data of --db (or --store); over "
            "--server give --ignore-design"
        )
    data = load_design(args)
    options = (args.variance, args.replicates, args.seed or 0)
    try:
        est = design_estimate(data.cells(), data.question.mechanism, *options)
    except InsufficientDataError as exc:
        raise UserError(str(exc), status=3) from None
    described = f"design-based: {data.description()}; variance: {args.variance}"
    return design_conditional(est, shape, given, args.confidence), described


def run_ordinal(args: argparse.Namespace) -> int:
    from aggregator.stats import estimate
    from aggregator.stats.summaries import mean_score, score_trend

    check_source(args)
    if args.config is None:  # --server: the scores are declared in the survey file only
        raise UserError("ordinal reads the question's scores from the survey file: give --config")
    scores = load_scores(args.config).get((args.survey, args.question))
    if scores is None and args.question in _questions(args):
        raise UserError(
            f"question {args.question} is not declared ordinal: add 'ordinal = true' (scores "
            "1..k) or 'scores = [...]' to it in the survey file"
        )
    groups = args.groups or [args.group or ""]
    if design_based(args):
        designed, trend, design = _design_ordinal(args, scores)
        return _print_ordinal(args, groups, list(designed), trend, args.exploratory, design)
    estimates = []
    for group in groups:
        one = argparse.Namespace(**{**vars(args), "group": group})
        estimates.append(estimate(load_histogram(one)[1], args.confidence))
        exploratory = one.exploratory
    try:
        means = [mean_score(e, scores) for e in estimates]
        trend = score_trend(estimates, scores, args.alpha) if len(groups) > 1 else None
    except InvalidInputError as exc:
        raise UserError(str(exc)) from None
    ignored = IGNORES_DESIGN if args.design_ignored else None
    return _print_ordinal(args, groups, means, trend, exploratory, ignored)


def _design_ordinal(
    args: argparse.Namespace, scores: tuple[float, ...] | None
) -> tuple[tuple[MeanScore, ...], TrendResult | None, str]:
    """The design-based mean scores (of the pooled reports, one --group, or each of --groups
    as domains of one design) and their trend test; the design's description."""
    from aggregator.analysis.design_data import DesignData
    from aggregator.stats.design.estimate import design_estimate
    from aggregator.stats.design.scores import design_mean_scores, design_score_trend

    if args.server is not None:
        raise UserError(
            "a design-based mean score reads the design data of --db (or --store); over "
            "--server give --ignore-design"
        )
    whole = argparse.Namespace(**{**vars(args), "group": None if args.groups else args.group})
    data = load_design(whole)
    if args.groups:
        for group in args.groups:  # each group compared must be released on its own
            load_histogram(argparse.Namespace(**{**vars(args), "group": group}))
        keys = tuple(stat for stat in data.keys if stat.group in args.groups)
        data = DesignData(data.question, data.frame, keys, tuple(args.groups))
    options = (args.variance, args.replicates, args.seed or 0)
    try:
        cells = data.cells(by_group=bool(args.groups))
        est = design_estimate(cells, data.question.mechanism, *options)
        means = design_mean_scores(est, scores, args.confidence)
        trend = (
            design_score_trend(est, scores, args.alpha, args.confidence) if args.groups else None
        )
    except InsufficientDataError as exc:
        raise UserError(str(exc), status=3) from None
    except InvalidInputError as exc:
        raise UserError(str(exc)) from None
    args.exploratory = whole.exploratory
    return means, trend, f"design-based: {data.description()}; variance: {args.variance}"


def _print_ordinal(
    args: argparse.Namespace,
    groups: list[str],
    means: list[MeanScore],
    trend: TrendResult | None,
    exploratory: bool,
    design: str | None,
) -> int:
    """The mean scores and trend test as text or JSON, with what they rest on: the design, or
    IGNORES_DESIGN for a survey with one read as a simple random sample."""
    if args.json:
        rows = [
            {
                "group": g,
                "n": m.n,
                "mean": m.mean,
                "standard_error": m.standard_error,
                "ci_low": m.low,
                "ci_high": m.high,
            }
            for g, m in zip(groups, means, strict=True)
        ]
        out = {
            "question": args.question,
            "scores": list(means[0].scores),
            "confidence": means[0].confidence,
            "mean_scores": rows,
        }
        if exploratory:
            out["exploratory"] = True
        if args.side == "confirmation":  # outside the sealed family
            out |= {"not_preregistered": True, "label": NOT_PREREGISTERED}
        if design == IGNORES_DESIGN:
            out |= {"ignores_design": True, "design_label": IGNORES_DESIGN}
        elif design is not None:
            out["design"] = design
        if trend is not None:
            out["trend"] = {
                "statistic": trend.statistic,
                "pvalue": trend.pvalue,
                "dof": trend.dof,
                "reject": trend.reject,
                "alpha": trend.alpha,
                "method": trend.method,
            }
        print(json.dumps(out))
        return 0
    if exploratory:
        print(EXPLORATORY)
    if args.side == "confirmation":
        print(NOT_PREREGISTERED)
    if design is not None:
        print(design)
    listed = ", ".join(f"{s:g}" for s in means[0].scores)
    print(f"mean score of {args.survey}:{args.question} (scores {listed})")
    for group, m in zip(groups, means, strict=True):
        name = group or "all reports"
        ci = interval(m.low, m.high)
        print(
            f"  {name}: {fixed(m.mean)} (s.e. {fixed(m.standard_error)}), "
            f"{100 * m.confidence:g}% CI {ci}, n = {m.n}"
        )
    if trend is not None:
        print(trend.summary())
    return 0


def _questions(args: argparse.Namespace) -> set[str]:
    survey = load_surveys(args.config).get(args.survey)
    return {q.id for q in survey.questions} if survey else set()
