"""``estimate --design`` and ``test --design``: design-based estimates with design effects and
Rao-Scott tests of one question of a survey with a sampling design, from the store's per design
key statistics joined to the survey's frame (read only; docs/designs.md)."""

from __future__ import annotations

import argparse
import json

import numpy as np

from aggregator.cli.common import UserError, load_histogram, null_distribution, side_of
from aggregator.design_data import DesignData, design_data_of, read_design_data
from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.loader import below_release
from aggregator.presentation.numbers import interval, share
from aggregator.store.reader import StoreReader
from aggregator.survey_file.config import load_surveys
from client.survey import QuestionSpec, SurveySpec

VARIANCES = ("linearization", "jackknife", "bootstrap")
CORRECTIONS = ("F", "second-order", "first-order", "wald")


def add_design_options(parser: argparse.ArgumentParser, *, test: bool) -> None:
    """--design and its options (variance method; for a test, the correction)."""
    design = parser.add_argument_group("surveys with a sampling design (docs/designs.md)")
    design.add_argument(
        "--design",
        action="store_true",
        help="design-based: weights, strata and PSUs from the survey's sampling frame",
    )
    design.add_argument(
        "--variance",
        choices=VARIANCES,
        default="linearization",
        help="with --design: the variance method (default linearization)",
    )
    design.add_argument(
        "--replicates", type=int, default=200, help="with --variance bootstrap: replicates"
    )
    if test:
        design.add_argument(
            "--correction",
            choices=CORRECTIONS,
            default="F",
            help="with --design: Rao-Scott second order as F (default), second-order "
            "(Satterthwaite chi-square), first-order, or the adjusted Wald F",
        )


def load_design(args: argparse.Namespace, *, test: bool = False) -> DesignData:
    """The question's design data, after the same checks and release rule as its histogram
    (``load_histogram``); one-line UserError (exit 2) for a survey without a design or a read
    over --server."""
    if args.server is not None:
        raise UserError("--design reads --db; the Analyst service does not serve design analyses")
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
        raise UserError(
            f"{unused[0]} is not for --design (its options: --variance, --replicates, --seed"
            + (", --correction)" if test else ")")
        )
    shared = getattr(args, "store", None) is not None
    if args.config is None or (args.db is None and not shared):
        raise UserError("--design needs --config and --db (or --store)")
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
    from aggregator.stats.design_estimate import design_estimate

    data = load_design(args)
    if data.post_strata:
        return _post_stratified(args, data)
    try:
        est = design_estimate(
            data.cells(), data.question.mechanism, args.variance, args.replicates, args.seed or 0
        )
    except InsufficientDataError as exc:
        raise UserError(str(exc), status=3) from None
    except InvalidInputError as exc:
        raise UserError(str(exc)) from None
    low, high = est.intervals(args.confidence)
    labels = data.question.labels
    columns = {
        "estimate": est.estimate[0],
        "standard_error": est.standard_error[0],
        "ci_low": low[0],
        "ci_high": high[0],
        "deff": est.deff[0],
        "weighting_effect": np.full(len(labels), est.weighting_effect[0]),
        "clustering_effect": est.clustering_effect[0],
    }
    if args.json:
        print(
            json.dumps(
                {
                    "question": data.question.id,
                    "labels": labels,
                    "design": data.description(),
                    "variance": est.variance_method,
                    "n": est.n,
                    "degrees_of_freedom": est.degrees_of_freedom,
                    "confidence": args.confidence,
                    **{name: _floats(values) for name, values in columns.items()},
                }
            )
        )
        return 0
    width = max(8, *(len(label) for label in labels))
    level = f"{100 * args.confidence:g}% CI"
    print(
        f"design-based estimate [{data.question.mechanism.describe()}], n = {est.n}, "
        f"{data.description()}; variance: {est.variance_method}, {est.degrees_of_freedom} "
        "design degrees of freedom"
    )
    print(f"  {'category':<{width}}  estimate    s.e.   {level:<18}   deff  weighting  clustering")
    for j, label in enumerate(labels):
        print(
            f"  {label:<{width}}  {share(est.estimate[0, j]):>8}  "
            f"{share(est.standard_error[0, j]):>6}   {interval(low[0, j], high[0, j]):<18}  "
            f"{est.deff[0, j]:>5.3g}  {est.weighting_effect[0]:>9.3g}  "
            f"{est.clustering_effect[0, j]:>10.3g}"
        )
    print(
        "  deff: design variance over a simple random sample's of the same size; weighting "
        "(Kish) x clustering make up the model design effect (docs/designs.md)"
    )
    return 0


def _post_stratified(args: argparse.Namespace, data: DesignData) -> int:
    """``estimate --design`` of a frame with post-strata: post-stratified to their known
    population counts (no design effects: the calibration changes what a simple random sample
    would be compared with)."""
    from aggregator.stats.design_calibration import post_stratified_estimate

    try:
        est = post_stratified_estimate(
            data.cells(by_post_stratum=True),
            data.population(),
            args.variance,
            args.replicates,
            args.seed or 0,
        )
    except InsufficientDataError as exc:
        raise UserError(str(exc), status=3) from None
    except InvalidInputError as exc:
        raise UserError(str(exc)) from None
    low, high = est.intervals(args.confidence)
    labels = data.question.labels
    if args.json:
        columns = {"standard_error": est.standard_error, "ci_low": low, "ci_high": high}
        print(
            json.dumps(
                {
                    "question": data.question.id,
                    "labels": labels,
                    "design": data.description(),
                    "post_strata": data.frame.population,
                    "variance": est.variance_method,
                    "n": data.n,
                    "degrees_of_freedom": est.degrees_of_freedom,
                    "confidence": args.confidence,
                    "estimate": _floats(est.estimate),
                    **{name: _floats(values) for name, values in columns.items()},
                }
            )
        )
        return 0
    width = max(8, *(len(label) for label in labels))
    print(
        f"design-based estimate [{data.question.mechanism.describe()}], n = {data.n}, "
        f"{data.description()}; variance: {est.variance_method}, {est.degrees_of_freedom} "
        "design degrees of freedom"
    )
    print(f"  {'category':<{width}}  estimate    s.e.   {100 * args.confidence:g}% CI")
    for j, label in enumerate(labels):
        print(
            f"  {label:<{width}}  {share(est.estimate[j]):>8}  "
            f"{share(est.standard_error[j]):>6}   {interval(low[j], high[j])}"
        )
    return 0


def run_design_test(args: argparse.Namespace) -> int:
    from aggregator.stats import design_tests

    data = load_design(args, test=True)
    question = data.question
    options = {
        "correction": args.correction,
        "alpha": args.alpha,
        "method": args.variance,
        "replicates": args.replicates,
        "seed": args.seed or 0,
    }
    try:
        if args.kind == "gof":
            p0 = null_distribution(args.p0, question)
            result = design_tests.design_goodness_of_fit(
                data.cells(), question.mechanism, p0, **options
            )
        elif args.kind == "independence":
            if len(question.shape) != 2:
                raise UserError(f"question {question.id} does not have exactly 2 attributes")
            rows, columns = question.shape
            result = design_tests.design_independence(
                data.cells(), question.mechanism, rows, columns, **options
            )
        else:
            if not data.groups[0] or getattr(args, "group", None):
                raise UserError(
                    "homogeneity compares the groups of a survey's group label: all of them "
                    "(no --group)"
                )
            _check_groups_released(args, data)
            result = design_tests.design_k_sample(
                data.cells(by_group=True), question.mechanism, **options
            )
    except InsufficientDataError as exc:
        raise UserError(str(exc), status=3) from None
    except InvalidInputError as exc:
        raise UserError(str(exc)) from None
    if args.json:
        print(json.dumps({"design": data.description(), **result.to_dict()}))
    else:
        print(data.description())
        print(result.summary())
    return 0


def _check_groups_released(args: argparse.Namespace, data: DesignData) -> None:
    """Exit 3 unless every group compared has min_batch_size reports (the release rule)."""
    survey = load_surveys(args.config)[args.survey]
    for group in data.groups:
        n = sum(stat.n for stat in data.keys if stat.group == group)
        withheld = below_release(survey, data.question, n, group)
        if withheld:
            raise UserError(withheld, status=3)


def _floats(values: np.ndarray) -> list[float | None]:
    """JSON numbers, None for NaN (a design effect undefined for a category)."""
    return [None if np.isnan(v) else float(v) for v in np.asarray(values, dtype=float)]
