"""The Analyst's design-based answers: Estimate, GoodnessOfFit, Independence and TwoSample (two
groups of one question, or every group of its survey's label) with ``design`` set
(docs/designs.md, docs/wire.md §8.4).

A call releases as every reading RPC does (ReleasedReads.histogram in
aggregator/service/analyst/reads.py: the same checks, the same refusal below ``min_batch_size``,
a due snapshot moves), then reads the design rows snapshotted with those releases
(design_releases.py of aggregator/store/sqlite/ and aggregator/store/postgres/: every node of a
shared store reads the same rows) and never the live per key statistics: its n is the released
n, and its answer moves only when the release does. The analysis runs in an analysis worker
process (a bootstrap or replicate variance may recompute it thousands of times), admitted for
the caller and stopped at its deadline.
"""

from __future__ import annotations

import grpc
import numpy as np

from aggregator.analysis.design_answers import (
    DesignEstimateAnswer,
    design_estimate_answer,
    design_test,
)
from aggregator.analysis.design_data import DesignData
from aggregator.service.analyst.answers import analysed, test_response
from aggregator.service.analyst.execution import caller_of
from aggregator.service.analyst.reads import ReleasedReads
from aggregator.service.status import abort, shortened, status_of
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
from aggregator.store import checks
from aggregator.store.checks import ReportRejectedError
from aggregator.store.contract import ReleasesDesigns
from aggregator.survey_file.design import SamplingFrame
from aggregator.survey_file.groups import two_sample_request_problem
from protos.ldp.v1 import ldp_pb2

#: The most bootstrap replicates one call may ask for (each recomputes the analysis).
MAX_REPLICATES = 10_000


async def estimate(reads: ReleasedReads, request, context) -> ldp_pb2.EstimateResponse:
    """The design-based estimate of the released design rows."""

    variance, replicates, seed, _ = await _options(context, request.design)
    interval = request.design.interval or DEFAULT_INTERVAL
    if interval not in INTERVALS:
        await abort(
            context,
            grpc.StatusCode.INVALID_ARGUMENT,
            f"design interval must be one of {', '.join(INTERVALS)}, got {interval!r}",
        )
    small_sample = request.design.small_sample or DEFAULT_SMALL_SAMPLE
    if small_sample not in SMALL_SAMPLE:
        await abort(
            context,
            grpc.StatusCode.INVALID_ARGUMENT,
            f"design small_sample must be one of {', '.join(SMALL_SAMPLE)}, got {small_sample!r}",
        )
    data = await _released_design(
        reads,
        context,
        request.survey_id,
        request.question_id,
        request.side,
        request.group,
        test=False,
    )
    confidence = request.confidence or 0.95
    executor = reads.executor

    async def run():
        from aggregator.stats.design.raking import RakingError

        async with executor.admitted(caller_of(context)):
            args = (data, variance, replicates, seed, confidence, interval, small_sample)
            try:
                return await executor.in_process(context, design_estimate_answer, *args)
            except RakingError as exc:  # the released sample cannot carry the margins
                await abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    return estimate_response(await analysed(context, run()))


async def test(reads: ReleasedReads, request, context, kind: str) -> ldp_pb2.TestResponse:
    """The Rao-Scott test ``kind`` ("gof" with the request's p0, or "independence")."""
    variance, replicates, seed, correction = await _options(context, request.design)
    data = await _released_design(
        reads, context, request.survey_id, request.question_id, request.side, request.group
    )
    p0 = np.asarray(request.p0, dtype=float) if kind == "gof" else None
    if kind == "independence" and len(data.question.shape) != 2:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"question {data.question.id!r} has {len(data.question.shape)} attribute(s); "
            "independence needs exactly 2",
        )
    options = (request.alpha or 0.05, correction, variance, replicates, seed)
    return await _tested(reads, context, data, kind, p0, options)


test.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


async def two_groups(reads: ReleasedReads, request, context) -> ldp_pb2.TestResponse:
    """The Rao-Scott homogeneity test of groups of one question, each group's released design
    rows a domain of one design: ``group_a`` and ``group_b``, or, neither given, every group of
    the survey's label (the k-sample test of ``test homogeneity --design --db``)."""
    variance, replicates, seed, correction = await _options(context, request.design)
    groups = await _compared_groups(reads, request, context)
    parts = [
        await _released_design(reads, context, request.survey_a, request.question_a, 0, group)
        for group in groups
    ]
    keys = tuple(key for part in parts for key in part.keys)
    data = DesignData(parts[0].question, parts[0].frame, keys, groups)
    options = (request.alpha or 0.05, correction, variance, replicates, seed)
    return await _tested(reads, context, data, "homogeneity", None, options)


async def _compared_groups(reads: ReleasedReads, request, context) -> tuple[str, ...]:
    """The groups a design-based TwoSample compares, each to be released on its own: the two
    named, or every value of the survey's group label. INVALID_ARGUMENT for one group, the same
    group twice or two questions; FAILED_PRECONDITION for a survey without a group label."""
    a = (request.survey_a, request.question_a, request.group_a)
    b = (
        request.survey_b or request.survey_a,
        request.question_b or request.question_a,
        request.group_b,
    )
    if request.group_a or request.group_b:
        problem = two_sample_request_problem(a, b)
        if problem:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, problem)
        return request.group_a, request.group_b
    if a[:2] != b[:2]:
        await abort(
            context,
            grpc.StatusCode.INVALID_ARGUMENT,
            "a design-based two-sample test compares groups of one question: survey and "
            "question of B must be empty or equal to those of A",
        )
    try:
        survey, _ = checks.find_question(reads.surveys, request.survey_a, request.question_a)
    except ReportRejectedError as exc:
        await abort(context, status_of(exc.reason), shortened(exc.message))
    if survey.group_label is None:
        await abort(
            context,
            grpc.StatusCode.FAILED_PRECONDITION,
            f"survey {survey.id!r} has no group label: a design-based homogeneity test "
            "compares its groups",
        )
    return survey.group_label.values


async def _tested(
    reads: ReleasedReads,
    context,
    data: DesignData,
    kind: str,
    p0: np.ndarray | None,
    options: tuple,
) -> ldp_pb2.TestResponse:
    """design_answers.design_test in a worker process, admitted for the caller; its result as a
    TestResponse with the design's fields."""

    executor = reads.executor

    async def run():
        async with executor.admitted(caller_of(context)):
            return await executor.in_process(context, design_test, data, kind, p0, *options)

    result = await analysed(context, run())
    message = test_response(result)
    message.design = data.description()
    message.pearson = result.pearson
    message.eigenvalues.extend(result.eigenvalues.tolist())
    message.numerator_df = result.numerator_df
    if result.denominator_df is not None:
        message.denominator_df = result.denominator_df
    message.design_df = result.design_df
    return message


async def _options(context, design: ldp_pb2.DesignOptions) -> tuple[str, int, int, str]:
    """(variance, replicates, seed, correction) of the request, defaults for the unset;
    INVALID_ARGUMENT for a method or correction that does not exist, or too many replicates."""
    variance = design.variance or DEFAULT_VARIANCE
    correction = design.correction or DEFAULT_CORRECTION
    if variance not in VARIANCES:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"design variance must be one of {', '.join(VARIANCES)}, got {variance!r}",
        )
    if correction not in CORRECTIONS:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"design correction must be one of {', '.join(CORRECTIONS)}, got {correction!r}",
        )
    if design.replicates > MAX_REPLICATES:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"design replicates must be at most {MAX_REPLICATES:,}, got {design.replicates:,}",
        )
    return variance, design.replicates or DEFAULT_REPLICATES, design.seed, correction


async def _released_design(
    reads: ReleasedReads,
    context,
    survey_id: str,
    question_id: str,
    side: int,
    group: str,
    *,
    test: bool = True,
) -> DesignData:
    """The question's released design rows (of ``group``, or of every released group pooled),
    after the release and its checks (for a ``test``: those of a test). FAILED_PRECONDITION
    for a survey without a design, or a release older than design snapshots."""

    survey = reads.surveys.get(survey_id)
    if survey is not None and not isinstance(survey.design, SamplingFrame):
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"survey {survey.id!r} has no sampling design; ask without design",
        )
    question, _ = await reads.histogram(context, survey_id, question_id, side, group, test=test)
    assert survey is not None and isinstance(
        survey.design, SamplingFrame
    )  # reads.histogram checked
    store = reads.store
    assert isinstance(store, ReleasesDesigns)  # every engine's AnalysisStore
    side = (side or ldp_pb2.EXPLORATION) if survey.split else 0
    label = survey.group_label
    groups = tuple(label.values) if label is not None else ("",)
    read = groups if label is not None and not group else (group,)
    cells = [(survey.id, question.id, side, value) for value in read]
    released = await analysed(
        context, reads.executor.in_thread(context, store.design_release, cells)
    )
    keys = []
    for n, rows in released.values():
        if sum(row.n for row in rows) != n:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{survey.id}/{question.id}: this release predates design snapshots; the "
                f"design-based answer starts at the next release ({survey.min_batch_size} "
                "more reports)",
            )
        keys += rows
    return DesignData(question, survey.design, tuple(keys), groups)


def estimate_response(answer: DesignEstimateAnswer) -> ldp_pb2.EstimateResponse:
    """The EstimateResponse of a design-based estimate."""
    message = ldp_pb2.EstimateResponse(
        n=answer.n,
        labels=answer.labels,
        frequencies=answer.estimate.tolist(),
        standard_errors=answer.standard_error.tolist(),
        ci_low=answer.ci_low.tolist(),
        ci_high=answer.ci_high.tolist(),
        confidence=answer.confidence,
        mechanism=answer.mechanism,
        interval_method=answer.interval_method,
        small_sample=answer.small_sample,
        interval_df=answer.interval_df or 0.0,
        design=answer.design,
        variance=answer.variance,
        design_df=answer.degrees_of_freedom,
        post_strata=list(answer.post_strata),
        population=list(answer.post_strata.values()),
    )
    for name in ("deff", "weighting_effect", "clustering_effect"):
        values = getattr(answer, name)
        if values is not None:
            getattr(message, name).extend(np.asarray(values, dtype=float).tolist())
    return message
