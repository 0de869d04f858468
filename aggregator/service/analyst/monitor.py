"""The Analyst's Monitor RPC: anytime-valid monitoring of one question over its release history
(docs/monitoring.md, docs/wire.md §8.8).

The call first releases as every reading RPC does (aggregator/service/analyst/release.py: a snapshot
that is due moves, and is appended to the history in the same transaction), then reads the
history of the cells it watches on the analysis threads and advances the kept Monitor of the
analysis to the new looks in an analysis worker process (aggregator/analysis/monitoring.py:
admitted for the caller, stopped when the caller goes away, the kept Monitor unchanged then),
answered as a MonitorResponse. The looks are the snapshots every caller could have seen, so the
answer is the same for every caller and reveals nothing below ``min_batch_size``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from aggregator.analysis.monitor_answers import MonitorAnswer, monitor_answer
from aggregator.analysis.monitoring import (
    MonitorCache,
    advanced,
    cells,
    history_looks,
    monitored,
)
from aggregator.service.analyst.answers import analysed
from aggregator.service.analyst.execution import caller_of
from aggregator.stats.anytime.names import ANALYSES, SEQUENCES_ONLY
from aggregator.survey_file.design import design_refusal
from aggregator.survey_file.groups import two_sample_request_problem
from protos.ldp.v1 import ldp_pb2

if TYPE_CHECKING:
    from aggregator.service.analyst.reads import ReleasedReads
    from aggregator.stats.anytime.status import MonitorStatus


async def monitor(
    reads: ReleasedReads, monitors: MonitorCache, request, context
) -> ldp_pb2.MonitorResponse:
    """Answer one MonitorRequest (status codes: docs/wire.md §8.8), continuing the e-processes
    kept in ``monitors``."""

    analysis = request.analysis or "frequencies"
    if analysis not in ANALYSES:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"analysis must be one of {', '.join(ANALYSES)}, got {analysis!r}",
        )
    test = analysis not in SEQUENCES_ONLY
    known = reads.surveys.get(request.survey_id)
    if known is not None and known.design is not None:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, design_refusal(known.id))
    if analysis == "two_sample":
        a = (request.survey_id, request.question_id, request.group_a)
        b = (request.survey_id, request.question_id, request.group_b)
        problem = two_sample_request_problem(a, b)
        if problem or not request.group_a or request.group:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                problem or "two_sample monitors two groups: give group_a and group_b, not group",
            )
        groups = [request.group_a, request.group_b]
    else:
        if request.group_a or request.group_b:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "group_a and group_b go with two_sample"
            )
        groups = [request.group]
    question = None
    for group in groups:  # release (moves due snapshots) and refuse what is not released
        question, _ = await reads.histogram(
            context, request.survey_id, request.question_id, request.side, group, test=test
        )
    assert question is not None
    if analysis == "independence" and len(question.shape) != 2:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"question {question.id!r} has {len(question.shape)} attribute(s); "
            "independence needs exactly 2",
        )
    if analysis == "mean_score" and len(question.attributes) != 1:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"question {question.id!r} has {len(question.attributes)} attributes; "
            "a mean score needs exactly 1",
        )
    survey = reads.surveys[request.survey_id]
    streams = [cells(survey, question.id, request.side, group) for group in groups]
    watched = monitored(
        analysis,
        question,
        streams,
        alpha=request.alpha or 0.05,
        p0=list(request.p0) if analysis == "goodness_of_fit" else None,
        max_n=request.max_n or None,
        scores=list(request.scores) or None,
    )
    executor = reads.executor

    async def run() -> MonitorStatus:
        async with executor.admitted(caller_of(context)):
            looks = await executor.in_thread(
                context, history_looks, reads.store.release_history, watched
            )
            kept = monitors.get(watched.key)
            args = (watched, kept, looks, request.with_path)
            monitor, status = await executor.in_process(context, advanced, *args)
            monitors.put(watched.key, monitor)
            return status

    status = await analysed(context, run())
    return response(monitor_answer(status, question))


def response(answer: MonitorAnswer) -> ldp_pb2.MonitorResponse:
    """The MonitorResponse of ``answer``."""
    message = ldp_pb2.MonitorResponse(
        n=answer.n,
        labels=answer.labels,
        estimate=answer.estimate,
        low=answer.low,
        high=answer.high,
        interval_guarantee=answer.interval_guarantee,
        decision=answer.decision,
        alpha=answer.alpha,
        max_n=answer.max_n,
    )
    test = answer.test
    if test is not None:
        message.evalue = test.evalue
        message.max_evalue = test.max_evalue
        message.pvalue = test.pvalue
        message.test_guarantee = test.guarantee
        message.method = test.method
        if test.rejected_at is not None:
            message.rejected_at = test.rejected_at
    for look in answer.looks:
        sent = message.looks.add(n=look.n)
        if look.log_evalue is not None:
            sent.log_evalue = look.log_evalue
        sent.estimate.extend(look.estimate)
        sent.low.extend(look.low)
        sent.high.extend(look.high)
    return message
