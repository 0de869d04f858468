"""What the Analyst's RPCs read, and the one way they read a question: its released histogram
(aggregator/service/analyst/release.py), after the checks every reading RPC makes.

The servicer owns one ReleasedReads and hands it to the RPC modules (design.py, monitor.py):
through it they see the surveys served, the store's AnalysisStore (its design rows and release
history, released with the histogram) and the analysis executor the reads run on, and never
the servicer itself.
"""

from __future__ import annotations

import grpc

from aggregator.errors import ClusteredReportsError
from aggregator.histogram import Histogram
from aggregator.service.analyst import confirm as confirm_rpcs
from aggregator.service.analyst import release
from aggregator.service.analyst.execution import AnalysisExecutor
from aggregator.service.status import shortened, status_of
from aggregator.store import checks, ingest
from aggregator.store.checks import ReportRejectedError
from aggregator.store.contract import AnalysisStore
from aggregator.survey_file.analyses import check_independent
from client.survey import QuestionSpec, SurveySpec
from protos.ldp.v1 import ldp_pb2

#: Trailing metadata of a read of a survey with a group label that pools every group.
POOLED_METADATA = ("ldp-groups", "pooled")
#: Trailing metadata of a read of the confirmation side (after sealing): not in the sealed family.
NOT_PREREGISTERED_METADATA = ("ldp-label", "not preregistered")
#: Trailing metadata of an answer that analyses a survey with a sampling design as a simple
#: random sample, as its caller asked (ignore_design).
DESIGN_IGNORED_METADATA = ("ldp-design", "ignored")


class ReleasedReads:
    """The surveys served, the store's analysis side (``store``: aggregator/store/contract.py's
    analysis_of) and the executor its reads run on; ``histogram`` releases a question."""

    def __init__(
        self, surveys: dict[str, SurveySpec], store: AnalysisStore, executor: AnalysisExecutor
    ) -> None:
        self.surveys = surveys
        self.store = store
        self.executor = executor

    async def histogram(
        self,
        context,
        survey_id: str,
        question_id: str,
        side: int = 0,
        group: str = "",
        *,
        test: bool = False,
        design_ignored: bool = False,
    ) -> tuple[QuestionSpec, Histogram]:
        """The question's released histogram (aggregator/service/analyst/release.py) on the
        requested side (confirm_rpcs.read_side) and of one public ``group`` ('': all groups
        pooled: the sum of the groups released), once the survey's minimum batch size is
        reached (by the group); for a ``test``, FAILED_PRECONDITION if its reports may be
        clustered by household (privacy-accounting spec §D.3). A group the survey does not
        declare is INVALID_ARGUMENT. ``design_ignored``: the caller analyses a survey with a
        sampling design as a simple random sample, and the answer's trailer says so."""
        try:
            survey, question = checks.find_question(self.surveys, survey_id, question_id)
            if group:
                checks.check_group(survey, group)
        except ReportRejectedError as exc:
            await context.abort(status_of(exc.reason), shortened(exc.message))
        if test:
            try:
                check_independent(survey, question)
            except ClusteredReportsError as exc:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, shortened(str(exc)))
        side = await confirm_rpcs.read_side(context, self.store, survey, side, self.executor)
        work = self.executor.in_thread(
            context, release.release, self.store, survey, question_id, side, group
        )
        released = await confirm_rpcs.answered(context, work)
        labels = [NOT_PREREGISTERED_METADATA] if side == ldp_pb2.CONFIRMATION else []
        if design_ignored and survey.design is not None:
            labels.append(DESIGN_IGNORED_METADATA)
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
