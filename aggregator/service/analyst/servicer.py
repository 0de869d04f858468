"""The Analyst servicer: estimates and tests computed from the stored sufficient statistics.

Nothing is released below a survey's minimum batch size; tests refuse questions whose reports
may be clustered by household. The statistics run on the analysis executor (aggregator/service/
analysis.py), never on the threads that serve uploads: estimates on its threads, tests in its
worker processes, each admitted against the concurrency and cost limits and stopped when its
caller goes away.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
import numpy as np

from aggregator.errors import (
    ClusteredReportsError,
    IncompatibleHistogramsError,
)
from aggregator.service.analyst import confirm as confirm_rpcs
from aggregator.service.analyst import design as design_rpc
from aggregator.service.analyst import monitor as monitor_rpc
from aggregator.service.analyst import release
from aggregator.service.analyst.answers import analysed, test_response
from aggregator.service.analyst.execution import (
    AnalysisExecutor,
    analysis_cost,
    call_stats_kw,
    caller_of,
)
from aggregator.service.collector.answers import shortened
from aggregator.service.collector.rejections import abort, status_of
from aggregator.store import ingest
from aggregator.store.contract import AnalysisStore
from aggregator.store.ingest import ReportRejectedError
from aggregator.survey_file.analyses import check_independent
from aggregator.survey_file.groups import (
    check_same_definition,
    group_name,
    two_sample_request_problem,
)
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

if TYPE_CHECKING:
    pass

#: Trailing metadata of a read of a survey with a group label that pools every group.
POOLED_METADATA = ("ldp-groups", "pooled")
#: Trailing metadata of a read of the confirmation side (after sealing): not in the sealed family.
NOT_PREREGISTERED_METADATA = ("ldp-label", "not preregistered")


class Analyst(ldp_pb2_grpc.AnalystServicer):
    """Estimates and tests computed from stored sufficient statistics, on any store engine
    (``store``: aggregator/store/contract.py's Store.analysis)."""

    def __init__(
        self,
        surveys: dict[str, SurveySpec],
        store: AnalysisStore,
        executor: AnalysisExecutor | None = None,
    ) -> None:
        self._surveys = surveys
        self._store = store
        self.executor = executor or AnalysisExecutor()
        self.monitors = monitor_rpc.MonitorCache()  # Monitor's e-processes between calls

    async def _released(
        self,
        context,
        survey_id: str,
        question_id: str,
        side: int = 0,
        group: str = "",
        *,
        test: bool = False,
    ):
        """The question's released histogram (aggregator/service/analyst/release.py) on the
        requested
        side (confirm_rpcs.read_side) and of one public ``group`` ('': all groups pooled: the
        sum of the groups released), once the survey's minimum batch size is reached (by the
        group); for a ``test``, FAILED_PRECONDITION if its reports may be clustered by
        household (privacy-accounting spec §D.3). A group the survey does not declare is
        INVALID_ARGUMENT."""
        try:
            survey, question = ingest.find_question(self._surveys, survey_id, question_id)
            if group:
                ingest.check_group(survey, group)
        except ReportRejectedError as exc:
            await context.abort(status_of(exc.reason), shortened(exc.message))
        if test:
            try:
                check_independent(survey, question)
            except ClusteredReportsError as exc:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, shortened(str(exc)))
        side = await confirm_rpcs.read_side(context, self._store, survey, side, self.executor)
        work = self.executor.in_thread(
            context, release.release, self._store, survey, question_id, side, group
        )
        released = await confirm_rpcs.answered(context, work)
        labels = [NOT_PREREGISTERED_METADATA] if side == ldp_pb2.CONFIRMATION else []
        if released.groups is not None:  # every group pooled: say so, and which were summed
            labels += [POOLED_METADATA, released.groups_metadata()]
            if side == ldp_pb2.EXPLORATION:
                labels.append(confirm_rpcs.EXPLORATORY_METADATA)
        if labels:
            context.set_trailing_metadata(tuple(labels))
        if released.n < survey.min_batch_size:
            refusal = release.too_few(survey, question_id, group)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal)
        return question, ingest.histogram(question, released.n, released.sums)

    async def Estimate(self, request, context):
        if request.HasField("design"):  # design-based (aggregator/service/analyst/design.py)
            return await design_rpc.estimate(self, request, context)
        question, hist = await self._released(
            context, request.survey_id, request.question_id, request.side, request.group
        )
        confidence = request.confidence or 0.95
        est = await self._analyse(context, "estimate", (hist, confidence), heavy=False)
        return ldp_pb2.EstimateResponse(
            n=est.n,
            labels=question.labels,
            frequencies=est.frequencies,
            standard_errors=est.standard_errors,
            ci_low=est.ci_low,
            ci_high=est.ci_high,
            confidence=est.confidence,
            mechanism=est.mechanism,
            projected=est.projected(),
            interval_method=est.interval_method,
        )

    async def GoodnessOfFit(self, request, context):
        if request.HasField("design"):
            return await design_rpc.test(self, request, context, "gof")
        _, hist = await self._released(
            context, request.survey_id, request.question_id, request.side, request.group, test=True
        )
        args = (hist, np.asarray(request.p0, dtype=float), request.alpha or 0.05)
        result = await self._analyse(
            context, "goodness_of_fit", (*args, request.method or None), _calibration(request)
        )
        return test_response(result)

    async def Independence(self, request, context):
        if request.HasField("design"):
            return await design_rpc.test(self, request, context, "independence")
        question, hist = await self._released(
            context, request.survey_id, request.question_id, request.side, request.group, test=True
        )
        if len(question.shape) != 2:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"question {question.id!r} has {len(question.shape)} attribute(s); "
                "independence needs exactly 2",
            )
        args = (hist, question.shape, request.alpha or 0.05, request.method or None)
        result = await self._analyse(context, "independence", args, _calibration(request))
        return test_response(result)

    async def Preregister(self, request, context):
        return await confirm_rpcs.preregister(
            context, self._store, self._surveys, request, self.executor
        )

    async def Confirm(self, request, context):
        return await confirm_rpcs.confirm(
            context, self._store, self._surveys, request, self.executor
        )

    async def HoldoutTest(self, request, context):
        return await confirm_rpcs.holdout_test(
            context, self._store, self._surveys, request, self.executor
        )

    async def TwoSample(self, request, context):
        if request.HasField("design"):
            return await design_rpc.two_groups(self, request, context)
        groups = (request.group_a, request.group_b)
        survey_b = request.survey_b or (request.survey_a if any(groups) else "")
        question_b = request.question_b or (request.question_a if any(groups) else "")
        problem = two_sample_request_problem(
            (request.survey_a, request.question_a, request.group_a),
            (survey_b, question_b, request.group_b),
        )
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        question_a, hist_a = await self._released(
            context, request.survey_a, request.question_a, group=request.group_a, test=True
        )
        question_b, hist_b = await self._released(
            context, survey_b, question_b, group=request.group_b, test=True
        )
        names = (
            group_name(request.survey_a, request.question_a, request.group_a),
            group_name(survey_b, question_b, request.group_b),
        )
        try:
            check_same_definition(question_a, question_b, names)
        except IncompatibleHistogramsError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        args = (hist_a, hist_b, request.alpha or 0.05)
        result = await self._analyse(context, "two_sample", args, _calibration(request))
        return test_response(result)

    async def GetSurvey(self, request, context):
        """The survey's definition, for an analyst client that rebuilds histograms itself."""
        survey = self._surveys.get(request.survey_id)
        if survey is None:
            unknown = shortened(f"unknown survey {request.survey_id!r}")
            await abort(context, grpc.StatusCode.NOT_FOUND, unknown)
        return survey.to_proto()

    async def Statistics(self, request, context):
        """The question's released sufficient statistic (through ``_released``, exactly as
        Estimate reads it): the client computes the same estimates and tests from it."""
        question, hist = await self._released(
            context,
            request.survey_id,
            request.question_id,
            request.side,
            request.group,
            test=request.test,
        )
        return ldp_pb2.StatisticsResponse(
            n=hist.n, values=hist.values, definition_digest=question.digest
        )

    async def Monitor(self, request, context):
        """Anytime-valid monitoring over the release history
        (aggregator/service/analyst/monitor.py)."""
        return await monitor_rpc.monitor(self, request, context)

    async def _analyse(self, context, function: str, args: tuple, kwargs=None, *, heavy=True):
        """``aggregator.stats.<function>(*args, **kwargs)`` on the analysis executor, admitted
        for this caller: a test (``heavy``) in a worker process after its cost is checked
        (args[0] is its histogram), an estimate on the analysis threads."""
        executor = self.executor
        kwargs = kwargs or {}

        async def run():
            async with executor.admitted(caller_of(context)):
                if not heavy:
                    return await executor.in_thread(context, call_stats_kw, function, args, kwargs)
                hist = args[0]
                calibration = kwargs.get("calibration", "auto")
                executor.check_cost(analysis_cost(function, hist.k, hist.n, calibration))
                return await executor.in_process(context, call_stats_kw, function, args, kwargs)

        return await analysed(context, run())


def _calibration(request) -> dict:
    """The calibration and seed arguments of a test request ("auto" when unset)."""
    seed = request.seed if request.HasField("seed") else None
    return {"calibration": request.calibration or "auto", "rng": seed}
