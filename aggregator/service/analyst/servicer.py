"""The Analyst servicer: estimates and tests computed from the stored sufficient statistics.

Every RPC reads a question through the servicer's ReleasedReads (aggregator/service/analyst/
reads.py): nothing is released below a survey's minimum batch size, and tests refuse questions
whose reports may be clustered by household. The design-based, confirmation and monitoring RPCs
are answered by their own modules (design.py, confirm.py, monitor.py), which this one imports.
The statistics (statistics.py) run on the analysis executor (execution.py), never on the threads
that serve uploads: simple estimates on its threads, tests in its worker processes, each admitted
against the concurrency and cost limits and stopped when its caller goes away.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, TypeVarTuple

import grpc
import numpy as np

from aggregator.analysis.monitoring import MonitorCache
from aggregator.errors import IncompatibleHistogramsError
from aggregator.service.analyst import confirm as confirm_rpcs
from aggregator.service.analyst import design as design_rpc
from aggregator.service.analyst import monitor as monitor_rpc
from aggregator.service.analyst import statistics
from aggregator.service.analyst.answers import analysed, test_response
from aggregator.service.analyst.execution import AnalysisExecutor, analysis_cost, caller_of
from aggregator.service.analyst.reads import ReleasedReads
from aggregator.service.status import abort, shortened
from aggregator.store.contract import AnalysisStore
from aggregator.survey_file.groups import (
    check_same_definition,
    group_name,
    two_sample_request_problem,
)
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

T = TypeVar("T")
Args = TypeVarTuple("Args")


class Analyst(ldp_pb2_grpc.AnalystServicer):
    """Estimates and tests computed from stored sufficient statistics, on any store engine
    (``store``: aggregator/store/contract.py's Store.analysis)."""

    def __init__(
        self,
        surveys: dict[str, SurveySpec],
        store: AnalysisStore,
        executor: AnalysisExecutor | None = None,
    ) -> None:
        self.executor = executor or AnalysisExecutor()
        self._reads = ReleasedReads(surveys, store, self.executor)
        self.monitors = MonitorCache()  # Monitor's e-processes between calls

    async def Estimate(self, request, context):
        if await self._design_based(context, request, request.survey_id):
            return await design_rpc.estimate(self._reads, request, context)
        question, hist = await self._reads.histogram(
            context,
            request.survey_id,
            request.question_id,
            request.side,
            request.group,
            design_ignored=request.ignore_design,
        )
        confidence = request.confidence or 0.95
        est = await self._estimated(context, statistics.estimate, hist, confidence)
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
        if await self._design_based(context, request, request.survey_id, tested=True):
            return await design_rpc.test(self._reads, request, context, "gof")
        _, hist = await self._reads.histogram(
            context,
            request.survey_id,
            request.question_id,
            request.side,
            request.group,
            test=True,
            design_ignored=request.ignore_design,
        )
        calibration, seed = _calibration(request)
        result = await self._tested(
            context,
            analysis_cost("goodness_of_fit", hist.k, hist.n, calibration),
            statistics.goodness_of_fit,
            hist,
            np.asarray(request.p0, dtype=float),
            request.alpha or 0.05,
            request.method or None,
            calibration,
            seed,
        )
        return test_response(result)

    async def Independence(self, request, context):
        if await self._design_based(context, request, request.survey_id, tested=True):
            return await design_rpc.test(self._reads, request, context, "independence")
        question, hist = await self._reads.histogram(
            context,
            request.survey_id,
            request.question_id,
            request.side,
            request.group,
            test=True,
            design_ignored=request.ignore_design,
        )
        if len(question.shape) != 2:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"question {question.id!r} has {len(question.shape)} attribute(s); "
                "independence needs exactly 2",
            )
        calibration, seed = _calibration(request)
        result = await self._tested(
            context,
            analysis_cost("independence", hist.k, hist.n, calibration),
            statistics.independence,
            hist,
            question.table_shape,
            request.alpha or 0.05,
            request.method or None,
            calibration,
            seed,
        )
        return test_response(result)

    async def Preregister(self, request, context):
        reads = self._reads
        return await confirm_rpcs.preregister(
            context, reads.store, reads.surveys, request, self.executor
        )

    async def Confirm(self, request, context):
        reads = self._reads
        return await confirm_rpcs.confirm(
            context, reads.store, reads.surveys, request, self.executor
        )

    async def HoldoutTest(self, request, context):
        reads = self._reads
        return await confirm_rpcs.holdout_test(
            context, reads.store, reads.surveys, request, self.executor
        )

    async def TwoSample(self, request, context):
        if await self._design_based(context, request, request.survey_a, tested=True):
            return await design_rpc.two_groups(self._reads, request, context)
        groups = (request.group_a, request.group_b)
        survey_b = request.survey_b or (request.survey_a if any(groups) else "")
        question_b = request.question_b or (request.question_a if any(groups) else "")
        problem = two_sample_request_problem(
            (request.survey_a, request.question_a, request.group_a),
            (survey_b, question_b, request.group_b),
        )
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        ignored = request.ignore_design
        spec_a, hist_a = await self._reads.histogram(
            context,
            request.survey_a,
            request.question_a,
            group=request.group_a,
            test=True,
            design_ignored=ignored,
        )
        spec_b, hist_b = await self._reads.histogram(
            context, survey_b, question_b, group=request.group_b, test=True, design_ignored=ignored
        )
        names = (
            group_name(request.survey_a, request.question_a, request.group_a),
            group_name(survey_b, question_b, request.group_b),
        )
        try:
            check_same_definition(spec_a, spec_b, names)
        except IncompatibleHistogramsError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        calibration, seed = _calibration(request)
        result = await self._tested(
            context,
            analysis_cost("two_sample", hist_a.k, hist_a.n, calibration),
            statistics.two_sample,
            hist_a,
            hist_b,
            request.alpha or 0.05,
            calibration,
            seed,
        )
        return test_response(result)

    async def GetSurvey(self, request, context):
        """The survey's definition, for an analyst client that rebuilds histograms itself."""
        survey = self._reads.surveys.get(request.survey_id)
        if survey is None:
            unknown = shortened(f"unknown survey {request.survey_id!r}")
            await abort(context, grpc.StatusCode.NOT_FOUND, unknown)
        return survey.to_proto()

    async def Statistics(self, request, context):
        """The question's released sufficient statistic (through ReleasedReads.histogram, exactly
        as Estimate reads it): the client computes the same estimates and tests from it."""
        question, hist = await self._reads.histogram(
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
        return await monitor_rpc.monitor(self._reads, self.monitors, request, context)

    async def _design_based(
        self, context, request, survey_id: str, *, tested: bool = False
    ) -> bool:
        """Whether ``request`` is answered design-based: its ``design`` options present, or by
        default for a survey that declares a sampling design, unless ``ignore_design``.
        INVALID_ARGUMENT for both at once, and for a test's method or calibration sent where
        the answer is design-based by default (it would go unused)."""
        if request.HasField("design"):
            if request.ignore_design:
                await abort(
                    context,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "design and ignore_design contradict each other: send one",
                )
            return True
        survey = self._reads.surveys.get(survey_id)
        if survey is None or survey.design is None or request.ignore_design:
            return False
        fields = request.DESCRIPTOR.fields_by_name
        unused = [
            name
            for name in ("method", "calibration")
            if tested and name in fields and getattr(request, name)
        ]
        if unused:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"survey {survey_id!r} declares a sampling design, so the answer is "
                f"design-based, which takes no {unused[0]}; set ignore_design to analyse it as "
                "a simple random sample",
            )
        return True

    async def _estimated(self, context, function: Callable[[*Args], T], *args: *Args) -> T:
        """``function(*args)`` (an estimate of aggregator/service/analyst/statistics.py) on the
        analysis threads, admitted for this caller."""
        executor = self.executor

        async def run() -> T:
            async with executor.admitted(caller_of(context)):
                return await executor.in_thread(context, function, *args)

        return await analysed(context, run())

    async def _tested(
        self, context, cost: float, function: Callable[[*Args], T], *args: *Args
    ) -> T:
        """``function(*args)`` (a test of aggregator/service/analyst/statistics.py) in an
        analysis worker process, admitted for this caller once its ``cost`` (analysis_cost) is
        under the ceiling."""
        executor = self.executor

        async def run() -> T:
            async with executor.admitted(caller_of(context)):
                executor.check_cost(cost)
                return await executor.in_process(context, function, *args)

        return await analysed(context, run())


def _calibration(request) -> tuple[str, int | None]:
    """The calibration ("auto" when unset) and seed (None when unset) of a test request."""
    seed = request.seed if request.HasField("seed") else None
    return request.calibration or "auto", seed
