"""The Analyst's explore-then-confirm RPCs: Preregister, Confirm and HoldoutTest, and the side
check of the reading RPCs (docs/adaptive-analysis.md; status codes in docs/wire.md §8).

Sealing and holdout queries read a snapshot of the confirmation side off the writer
(AnalysisStore.confirmation_snapshot, on the analysis threads), compute their tests in an
analysis worker process (aggregator/service/analyst/execution.py: admitted, stopped when the
caller goes away), and commit the result in one short write transaction that re-checks the state
(compare-and-set, AnalysisStore.commit_seal / commit_holdout; aggregator/store/contract.py
says where each engine runs it). A seal first prepares (AnalysisStore.prepare_seal: a shared
PostgreSQL store closes the confirmation side on every node before the plan runs; SQLite's
single writer closes it in the commit). A concurrent change (another query, a second seal, a
confirmation-side upload) makes it compute again from a fresh snapshot; a second Confirm that
finds the survey sealed answers the stored record (``already``)."""

from __future__ import annotations

import asyncio

import grpc

from aggregator.errors import ConfirmationError
from aggregator.service.analyst.answers import analysed
from aggregator.service.analyst.execution import AnalysisExecutor, caller_of
from aggregator.service.status import abort, shortened
from aggregator.store import confirmations
from aggregator.store.contract import AnalysisStore
from aggregator.store.errors import StoreUnavailableError
from client.device.transport import RETRY_AFTER_KEY
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2

EXPLORATORY_METADATA = ("ldp-label", "exploratory")
#: The retry hint of a seal or holdout query refused because the store was busy.
STORE_BUSY_RETRY_AFTER_MS = 1000


async def read_side(
    context, store: AnalysisStore, survey: SurveySpec, side: int, executor: AnalysisExecutor
) -> int:
    """The side a reading RPC reads: a split survey's requested side (EXPLORATION when unset;
    CONFIRMATION only once sealed, else FAILED_PRECONDITION), 0 for a survey that is not split
    (a side given for it is INVALID_ARGUMENT). Exploration answers carry the trailing metadata
    ``ldp-label: exploratory``."""
    if not survey.split:
        if side:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"survey {survey.id!r} is not split: no side"
            )
        return 0
    side = side or ldp_pb2.EXPLORATION
    if side not in (ldp_pb2.EXPLORATION, ldp_pb2.CONFIRMATION):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown side {side}")
    check = executor.in_thread(context, store.check_readable, survey, side)
    await answered(context, check)
    if side == ldp_pb2.EXPLORATION:
        context.set_trailing_metadata((EXPLORATORY_METADATA,))
    return side


async def _survey(context, surveys: dict[str, SurveySpec], survey_id: str) -> SurveySpec:
    survey = surveys.get(survey_id)
    if survey is None:
        await abort(context, grpc.StatusCode.NOT_FOUND, shortened(f"unknown survey {survey_id!r}"))
    if not survey.split:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"survey {survey_id!r} is not split: it has no confirmation side",
        )
    return survey


async def answered(context, work):
    """Await ``work``; refusals become status codes: a confirmation refusal FAILED_PRECONDITION,
    a state that kept changing under a seal or query ABORTED (try again), a busy or unreachable
    store UNAVAILABLE with a retry hint, the analysis limits and user errors as
    analyst.analysed says."""

    try:
        return await analysed(context, work)
    except confirmations.StateChangedError as exc:
        await context.abort(grpc.StatusCode.ABORTED, shortened(f"{exc}; try again", 300))
    except ConfirmationError as exc:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, shortened(str(exc), 300))
    except StoreUnavailableError as exc:
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            shortened(f"the report store is unavailable: {exc}", 300),
            trailing_metadata=((RETRY_AFTER_KEY, str(STORE_BUSY_RETRY_AFTER_MS)),),
        )


async def preregister(
    context, store: AnalysisStore, surveys, request, executor: AnalysisExecutor
) -> ldp_pb2.PreregisterResponse:
    survey = await _survey(context, surveys, request.survey_id)
    plan = await answered(context, executor.in_thread(context, _parse_plan, request.plan, surveys))
    if plan.survey_id != survey.id:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the plan is for survey {plan.survey_id!r}, not {survey.id!r}",
        )
    work = executor.in_thread(context, store.preregister, survey, plan.text, plan.sha256)
    when, already = await answered(context, work)
    return ldp_pb2.PreregisterResponse(plan_sha256=plan.sha256, registered_at=when, already=already)


async def confirm(
    context, store: AnalysisStore, surveys, request, executor: AnalysisExecutor
) -> ldp_pb2.ConfirmResponse:
    survey = await _survey(context, surveys, request.survey_id)

    async def run():
        async with executor.admitted(caller_of(context)):
            prepared = False
            try:
                for attempt in range(1, confirmations.ATTEMPTS + 1):
                    snap = await executor.in_thread(context, store.confirmation_snapshot, survey)
                    plan = confirmations.seal_plan(snap, survey)
                    if plan is not None and not prepared:  # then read again: the final counts
                        await executor.in_thread(context, store.prepare_seal, survey)
                        prepared = True
                        snap = await executor.in_thread(
                            context, store.confirmation_snapshot, survey
                        )
                        plan = confirmations.seal_plan(snap, survey)
                    if plan is None:  # sealed before: its record is the answer
                        return snap.state, True
                    record = await executor.in_process(
                        context, sealed_record, plan, surveys, survey.id, snap
                    )
                    try:
                        return await executor.in_thread(
                            context, store.commit_seal, survey, snap, record
                        )
                    except confirmations.StateChangedError:
                        if attempt == confirmations.ATTEMPTS:
                            raise
            except BaseException:
                if prepared:  # no seal: the side closed for it opens again
                    await asyncio.to_thread(store.abandon_seal, survey)
                raise
        raise AssertionError("unreachable")

    sealed, already = await answered(context, run())
    return ldp_pb2.ConfirmResponse(
        plan_sha256=sealed.plan_sha256,
        sealed_at=sealed.sealed_at,
        results_json=sealed.sealed,
        already=already,
    )


async def holdout_test(
    context, store: AnalysisStore, surveys, request, executor: AnalysisExecutor
) -> ldp_pb2.HoldoutResponse:
    """One SparseValidate query; a holdout opened by this call gets the default alpha, m and B
    (confirmations.DEFAULT_HOLDOUT); ``ldp-aggregator holdout`` can open it with others."""
    survey = await _survey(context, surveys, request.survey_id)
    p0 = list(request.p0) or None
    query = (request.question_id, request.test)

    async def run():
        async with executor.admitted(caller_of(context)):
            for attempt in range(1, confirmations.ATTEMPTS + 1):
                snap = await executor.in_thread(context, store.confirmation_snapshot, survey)
                held = confirmations.holdout_state(snap, survey, None)
                answer = await executor.in_process(
                    context, holdout_answer, held, survey, snap, *query, p0
                )
                try:
                    state = await executor.in_thread(
                        context,
                        store.commit_holdout,
                        survey,
                        snap,
                        held,
                        query,
                        answer,
                    )
                    return state, answer
                except confirmations.StateChangedError:
                    if attempt == confirmations.ATTEMPTS:
                        raise
        raise AssertionError("unreachable")

    state, (_, reject, level) = await answered(context, run())
    guarantee = await answered(context, executor.in_thread(context, _guarantee, state))
    return ldp_pb2.HoldoutResponse(
        reject=reject,
        level=level,
        query=state["answered"],
        max_queries=state["m"],
        rejections=state["rejections"],
        max_rejections=state["budget"],
        alpha=state["alpha"],
        guarantee=guarantee,
    )


def sealed_record(plan: str, surveys, survey_id: str, snap: confirmations.Snapshot) -> dict:
    """The record a seal stores (runs in an analysis worker process): design-based for a
    survey with a sampling design, as the plan says."""
    from aggregator.analysis.design_data import side_design_data
    from aggregator.confirm.run import sealed_record as record_of

    survey = surveys[survey_id]
    designs = side_design_data(survey, snap.designs)
    return record_of(_parse_plan(plan, surveys), survey, snap.histograms, 0, designs)


def holdout_answer(held, survey, snap: confirmations.Snapshot, question_id, test, p0):
    """(new state, reject, level) of one holdout query (runs in an analysis worker process):
    design-based for a survey with a sampling design."""
    from aggregator.analysis.design_data import side_design_data
    from aggregator.confirm.run import holdout_answer as answer_of

    designs = side_design_data(survey, snap.designs)
    return answer_of(held, survey, snap.histograms, question_id, test, p0, 0, designs)


def _parse_plan(text: str, surveys):
    from aggregator.confirm.plan import parse_plan

    return parse_plan(text, surveys)


def _guarantee(state: dict) -> str:
    from aggregator.confirm.sparse_validate import SparseValidate

    return SparseValidate(**state).guarantee()
