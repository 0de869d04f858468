"""Design-based ``estimate`` and ``test``: estimates with design effects and Rao-Scott tests of
one question of a survey with a sampling design, from the store's per design key statistics
joined to the survey's frame (--db or --store, read only), or as a running server's Analyst
service answers them from its released design rows (--server; docs/designs.md). A survey that
declares a design is analysed this way by default; ``--ignore-design`` opts out, and the answer
then says it ignores the sampling design."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TypeVar

import grpc
import numpy as np

from aggregator.analysis.design_answers import (
    DesignEstimateAnswer,
    design_estimate_answer,
    design_test,
)
from aggregator.analysis.design_data import DesignData, design_data_of, read_design_data
from aggregator.analysis.survey_data import below_release
from aggregator.cli.common import (
    UserError,
    check_source,
    connect,
    load_histogram,
    null_distribution,
    server_surveys,
    side_of,
)
from aggregator.confirm.labels import NOT_PREREGISTERED
from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.presentation.numbers import interval, share
from aggregator.remote import NotReleasedError, RemoteAnalyst, RemoteError
from aggregator.stats.design.options import (
    CORRECTIONS,
    DEFAULT_CORRECTION,
    DEFAULT_INTERVAL,
    DEFAULT_REPLICATES,
    DEFAULT_SMALL_SAMPLE,
    DEFAULT_VARIANCE,
    INTERVALS,
    SMALL_SAMPLE,
    VARIANCES,
)
from aggregator.store.sqlite.reader import StoreReader
from aggregator.survey_file.analyses import EXPLORATORY
from aggregator.survey_file.config import load_surveys
from client.survey import QuestionSpec, SurveySpec

T = TypeVar("T")


def add_design_options(
    parser: argparse.ArgumentParser, *, test: bool, intervals: bool = True
) -> None:
    """--design, --ignore-design and their options (variance method; for a test, the
    correction; for an estimate with ``intervals``, its interval and small-sample mode)."""
    design = parser.add_argument_group(
        "surveys with a sampling design: design-based by default (docs/designs.md)"
    )
    design.add_argument(
        "--design",
        action="store_true",
        help="design-based (weights, strata and PSUs from the survey's sampling frame): the "
        "default for a survey that declares a design; given, a survey without one is refused",
    )
    design.add_argument(
        "--ignore-design",
        action="store_true",
        help="analyse a survey with a sampling design as a simple random sample (the answer "
        "says it ignores the sampling design)",
    )
    design.add_argument(
        "--variance",
        choices=VARIANCES,
        default=DEFAULT_VARIANCE,
        help=f"with --design: the variance method (default {DEFAULT_VARIANCE})",
    )
    design.add_argument(
        "--replicates",
        type=int,
        default=DEFAULT_REPLICATES,
        help="with --variance bootstrap: replicates",
    )
    if not test and intervals:
        design.add_argument(
            "--interval",
            choices=INTERVALS,
            default=DEFAULT_INTERVAL,
            help="the design interval: beta (Korn-Graubard on the reports' share, inside [0, 1]),"
            " logit, or wald (estimate +- t s.e., as R's confint(svymean))",
        )
        design.add_argument(
            "--small-sample",
            choices=SMALL_SAMPLE,
            default=DEFAULT_SMALL_SAMPLE,
            help="bell-mccaffrey: bias-reduced linearization and Satterthwaite degrees of freedom "
            "(intervals that cover with few PSUs); as-r: R's linearization and degf",
        )
    if test:
        design.add_argument(
            "--correction",
            choices=CORRECTIONS,
            default=DEFAULT_CORRECTION,
            help="design-based tests: F-unbiased (default: Rao-Scott second order as F, its "
            "degrees of freedom estimated without bias), F (as R's svychisq), second-order "
            "(Satterthwaite chi-square), first-order, or the adjusted Wald F",
        )


def design_based(args: argparse.Namespace) -> bool:
    """Whether the answer is design-based: with --design, or by default when the survey declares
    a sampling design, unless --ignore-design. Sets ``args.design_ignored`` (the answer then
    says it ignores the design). An unknown survey is False here: the histogram's read names
    it."""
    explicit = getattr(args, "design", False)
    if explicit and args.ignore_design:
        raise UserError("--design and --ignore-design contradict each other: give one")
    args.design_ignored = False
    if explicit:
        return True
    survey = _declared_survey(args)
    declared = survey is not None and survey.design is not None
    args.design_ignored = declared and args.ignore_design
    return declared and not args.ignore_design


def _declared_survey(args: argparse.Namespace) -> SurveySpec | None:
    """The survey --survey names as --config (or, without it, the server) defines it, after
    the checks of where to read (check_source: they come first)."""
    check_source(args)
    if args.config is not None:
        return load_surveys(args.config).get(args.survey)
    with connect(args) as analyst:
        try:
            return analyst.survey(args.survey)
        except RemoteError as exc:
            if exc.code == grpc.StatusCode.NOT_FOUND:
                return None
            raise UserError(str(exc)) from None


def check_design_options(args: argparse.Namespace, *, test: bool = False) -> None:
    """One-line UserError (exit 2) for an option a design-based answer does not take."""
    unused = [
        flag
        for flag, given in (
            ("--simultaneous", getattr(args, "simultaneous", False)),
            ("--estimator unbiased", getattr(args, "estimator", "simplex") != "simplex"),
            ("--method", getattr(args, "method", None)),
            ("--calibration", getattr(args, "calibration", "auto") != "auto"),
        )
        if given
    ]
    if unused:
        why = (
            ""
            if getattr(args, "design", False)
            else f" (survey {args.survey} declares a sampling design)"
        )
        raise UserError(
            f"{unused[0]} is not for a design-based answer{why}; its options: --variance, "
            "--replicates, --seed"
            + (", --correction" if test else "")
            + ("; --ignore-design analyses it as a simple random sample" if why else "")
        )


def load_design(args: argparse.Namespace, *, test: bool = False) -> DesignData:
    """The question's design data on --db (or the shared --store), after the same checks and
    release rule as its histogram (``load_histogram``); one-line UserError (exit 2) for a
    survey without a design."""
    check_design_options(args, test=test)
    shared = getattr(args, "store", None) is not None
    if args.config is None or (args.db is None and not shared):
        raise UserError("a design-based answer needs --config and --db (or --store), or --server")
    survey = load_surveys(args.config).get(args.survey)
    if survey is not None and survey.design is None:
        raise UserError(f"survey {survey.id} has no sampling design (design = {{ table = ... }})")
    question, _ = load_histogram(args, test=test)  # checks, side, group, release rule
    if survey is None:  # load_histogram names the unknown survey first
        raise UserError(f"unknown survey {args.survey!r}")
    group = getattr(args, "group", None) or ""
    if shared:
        return _shared_design(args.store, survey, question, side_of(survey, args.side), group)
    with StoreReader(args.db) as reader:
        return read_design_data(
            reader.connection, survey, question, side_of(survey, args.side), group
        )


def _shared_design(
    url: str, survey: SurveySpec, question: QuestionSpec, side: int, group: str
) -> DesignData:
    """The question's design data in a shared PostgreSQL store (``load_histogram`` checked the
    pinned definitions and the side first)."""
    from aggregator.store.postgres import design
    from aggregator.store.postgres.engine import PostgresStore

    with PostgresStore(url) as store, store.transaction() as conn:
        stats = design.read(conn, survey.id, question.id, side)
    return design_data_of(survey, question, stats, group)


def run_design_estimate(args: argparse.Namespace) -> int:
    try:
        if args.server is not None:
            answer = _remote(args, lambda analyst: analyst.design_estimate(
                args.survey,
                args.question,
                args.confidence,
                variance=args.variance,
                replicates=args.replicates,
                seed=args.seed or 0,
                side=args.side,
                group=args.group,
                interval=args.interval,
                small_sample=args.small_sample,
            ))  # fmt: skip
        else:
            data = load_design(args)
            answer = design_estimate_answer(
                data, args.variance, args.replicates, args.seed or 0, args.confidence,
                args.interval, args.small_sample,
            )  # fmt: skip
    except InsufficientDataError as exc:
        raise UserError(str(exc), status=3) from None
    except InvalidInputError as exc:
        raise UserError(str(exc)) from None
    labels = _side_labels(args)
    if args.json:
        print(json.dumps({**labels, **answer.to_dict()}))
    else:
        _print_side_labels(labels)
        print(_estimate_text(answer))
    return 0


def _side_labels(args: argparse.Namespace) -> dict[str, object]:
    """The labels of a design-based answer on a split survey's side, as the simple answers
    carry them: exploratory on the exploration side, not preregistered on the (sealed)
    confirmation side."""
    survey = _declared_survey(args)
    if survey is None or not survey.split:
        return {}
    if args.side == "confirmation":
        return {"not_preregistered": True, "label": NOT_PREREGISTERED}
    return {"exploratory": True}


def _print_side_labels(labels: dict[str, object]) -> None:
    if labels.get("exploratory"):
        print(EXPLORATORY)
    if labels.get("not_preregistered"):
        print(NOT_PREREGISTERED)


def _remote(args: argparse.Namespace, call: Callable[[RemoteAnalyst], T], test: bool = False) -> T:
    """``call`` on the Analyst service --server names, after the option checks; the server's
    refusals as one-line UserErrors (exit 3 when nothing is released yet)."""
    check_design_options(args, test=test)
    check_source(args)
    with connect(args) as analyst:
        if not server_surveys(args, analyst, args.survey):
            raise UserError(f"unknown survey {args.survey!r} on the server at {args.server}")
        try:
            return call(analyst)
        except NotReleasedError as exc:
            raise UserError(str(exc), status=3) from None
        except RemoteError as exc:
            raise UserError(str(exc)) from None


def _estimate_text(answer: DesignEstimateAnswer) -> str:
    """The table of ``estimate --design``: with the design effects, or (post-stratified) the
    estimates and intervals alone (the calibration changes what a simple random sample would
    be compared with)."""
    width = max(8, *(len(label) for label in answer.labels))
    level = f"{100 * answer.confidence:g}% CI"
    lines = [
        f"design-based estimate [{answer.mechanism}], n = {answer.n}, {answer.design}; "
        f"variance: {answer.variance}, {answer.degrees_of_freedom} design degrees of freedom",
        f"  intervals: {answer.interval_method}",
    ]
    deff, weighting, clustering = answer.deff, answer.weighting_effect, answer.clustering_effect
    if deff is None or weighting is None or clustering is None:
        lines.append(f"  {'category':<{width}}  estimate    s.e.   {level}")
        for j, label in enumerate(answer.labels):
            lines.append(
                f"  {label:<{width}}  {share(answer.estimate[j]):>8}  "
                f"{share(answer.standard_error[j]):>6}   "
                f"{interval(answer.ci_low[j], answer.ci_high[j])}"
            )
        return "\n".join(lines)
    lines.append(
        f"  {'category':<{width}}  estimate    s.e.   {level:<18}   deff  weighting  clustering"
    )
    for j, label in enumerate(answer.labels):
        lines.append(
            f"  {label:<{width}}  {share(answer.estimate[j]):>8}  "
            f"{share(answer.standard_error[j]):>6}   "
            f"{interval(answer.ci_low[j], answer.ci_high[j]):<18}  "
            f"{deff[j]:>5.3g}  {weighting[j]:>9.3g}  {clustering[j]:>10.3g}"
        )
    lines.append(
        "  deff: design variance over a simple random sample's of the same size; weighting "
        "(Kish) x clustering make up the model design effect (docs/designs.md)"
    )
    return "\n".join(lines)


def run_design_test(args: argparse.Namespace) -> int:
    options = (args.alpha, args.correction, args.variance, args.replicates, args.seed or 0)
    try:
        if args.server is not None:
            _check_every_group(args)
            design, result = _remote(args, lambda analyst: analyst.design_test(
                args.survey,
                args.question,
                args.kind,
                _remote_p0(args, analyst),
                *options,
                side=args.side,
                group=args.group,
            ), test=True)  # fmt: skip
        else:
            data = load_design(args, test=True)
            if args.kind == "homogeneity":
                if not data.groups[0] or getattr(args, "group", None):
                    raise UserError(
                        "homogeneity compares the groups of a survey's group label: all of "
                        "them (no --group)"
                    )
                _check_groups_released(args, data)
            p0 = null_distribution(args.p0, data.question) if args.kind == "gof" else None
            design, result = data.description(), design_test(data, args.kind, p0, *options)
    except InsufficientDataError as exc:
        raise UserError(str(exc), status=3) from None
    except InvalidInputError as exc:
        raise UserError(str(exc)) from None
    labels = _side_labels(args)
    if args.json:
        print(json.dumps({**labels, "design": design, **result.to_dict()}))
    else:
        _print_side_labels(labels)
        print(design)
        print(result.summary())
    return 0


def _remote_p0(args: argparse.Namespace, analyst: RemoteAnalyst) -> np.ndarray | None:
    """The null distribution of a gof test, over the server's definition of the question."""
    if args.kind != "gof":
        return None
    return null_distribution(args.p0, analyst.question(args.survey, args.question))


def _check_every_group(args: argparse.Namespace) -> None:
    """A homogeneity test over --server compares every group of the survey's group label (the
    server checks there is one); one line for --group."""
    if args.kind == "homogeneity" and getattr(args, "group", None):
        raise UserError(
            "homogeneity compares the groups of a survey's group label: all of them (no --group)"
        )


def _check_groups_released(args: argparse.Namespace, data: DesignData) -> None:
    """Exit 3 unless every group compared has min_batch_size reports (the release rule)."""
    survey = load_surveys(args.config)[args.survey]
    for group in data.groups:
        n = sum(stat.n for stat in data.keys if stat.group == group)
        withheld = below_release(survey, data.question, n, group)
        if withheld:
            raise UserError(withheld, status=3)


def run_design_homogeneity(args: argparse.Namespace, groups: list[str]) -> int:
    """``k-sample`` and ``two-sample --groups`` of a survey with a sampling design: the
    Rao-Scott homogeneity test of ``groups`` (values of the survey's group label) as domains of
    one design, each group released on its own (--db or --store; over --server two groups)."""
    args.group = None
    options = (args.alpha, args.correction, args.variance, args.replicates, args.seed or 0)
    try:
        if args.server is not None:
            pair = _pair_or_every_group(args, groups)
            design, result = _remote(args, lambda analyst: analyst.design_test(
                args.survey, args.question, "homogeneity", None, *options, side=args.side,
                groups=pair,
            ), test=True)  # fmt: skip
        else:
            data = load_design(args, test=True)
            for group in groups:  # each compared group must be released on its own
                load_histogram(argparse.Namespace(**{**vars(args), "group": group}), test=True)
            keys = tuple(stat for stat in data.keys if stat.group in groups)
            data = DesignData(data.question, data.frame, keys, tuple(groups))
            design, result = data.description(), design_test(data, "homogeneity", None, *options)
    except InsufficientDataError as exc:
        raise UserError(str(exc), status=3) from None
    except InvalidInputError as exc:
        raise UserError(str(exc)) from None
    labels = _side_labels(args)
    if args.json:
        where = {"survey": args.survey, "question": args.question, "groups": groups}
        print(json.dumps({**where, **labels, "design": design, **result.to_dict()}))
    else:
        _print_side_labels(labels)
        print(f"{args.survey}:{args.question} across {len(groups)} groups: {', '.join(groups)}")
        print(design)
        print(result.summary())
    return 0


def _pair_or_every_group(args: argparse.Namespace, groups: list[str]) -> tuple[str, str] | None:
    """What a design-based TwoSample over --server compares: two groups, or (None) every group
    of the label; one line for another subset (read --db or --store)."""
    survey = _declared_survey(args)
    label = None if survey is None else survey.group_label
    if label is not None and set(groups) == set(label.values):
        return None
    if len(groups) == 2:
        return groups[0], groups[1]
    raise UserError(
        "over --server the design-based comparison takes two groups or every group of the "
        "label: read --db (or --store) for another subset"
    )
