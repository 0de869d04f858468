"""The Analyst's explore-then-confirm RPCs: Preregister, Confirm and HoldoutTest, and the side
check of the reading RPCs (docs/adaptive-analysis.md; status codes in docs/wire.md §8).

They write through the store's writer thread (ReportStore.run_in_writer), so sealing and holdout
queries are atomic with respect to uploads; a ``--workers`` server's worker writes in a
transaction of its own connection (RemoteStore.run_in_writer), which SQLite serializes with the
writer's, and the writer refuses confirmation-side reports from the next transaction on. The
plan and holdout logic (aggregator.confirm) and the statistics are imported on first use, in a
worker thread, like the other analyses."""

from __future__ import annotations

import asyncio

import grpc

from aggregator.errors import ConfirmationError, InsufficientDataError, InvalidInputError
from aggregator.service.answers import shortened
from aggregator.service.rejections import abort
from aggregator.store import confirmations
from aggregator.survey_file.config import ConfigError
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2

EXPLORATORY_METADATA = ("ldp-label", "exploratory")


async def read_side(context, store, survey: SurveySpec, side: int) -> int:
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
    try:
        await asyncio.to_thread(confirmations.check_readable_at, store.path, survey, side)
    except ConfirmationError as exc:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, shortened(str(exc), 300))
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


async def _writing(context, store, function, *args):
    """Run a confirmations operation off the event loop; refusals become status codes."""
    try:
        return await asyncio.to_thread(function, store, *args)
    except (ConfirmationError, InsufficientDataError) as exc:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, shortened(str(exc), 300))
    except (InvalidInputError, ConfigError, ValueError) as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, shortened(str(exc), 300))


async def preregister(context, store, surveys, request) -> ldp_pb2.PreregisterResponse:
    survey = await _survey(context, surveys, request.survey_id)
    try:
        plan = await asyncio.to_thread(_parse_plan, request.plan, surveys)
    except ConfigError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, shortened(str(exc), 300))
    if plan.survey_id != survey.id:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the plan is for survey {plan.survey_id!r}, not {survey.id!r}",
        )
    when, already = await _writing(
        context, store, confirmations.preregister, survey, plan.text, plan.sha256
    )
    return ldp_pb2.PreregisterResponse(plan_sha256=plan.sha256, registered_at=when, already=already)


async def confirm(context, store, surveys, request) -> ldp_pb2.ConfirmResponse:
    survey = await _survey(context, surveys, request.survey_id)

    def compute(plan: str, histograms) -> dict:
        from aggregator.confirm.run import sealed_record

        return sealed_record(_parse_plan(plan, surveys), survey, histograms)

    sealed, already = await _writing(context, store, confirmations.seal, survey, compute)
    return ldp_pb2.ConfirmResponse(
        plan_sha256=sealed.plan_sha256,
        sealed_at=sealed.sealed_at,
        results_json=sealed.sealed,
        already=already,
    )


async def holdout_test(context, store, surveys, request) -> ldp_pb2.HoldoutResponse:
    """One SparseValidate query; a holdout opened by this call gets the default alpha, m and B
    (confirmations.DEFAULT_HOLDOUT); ``ldp-aggregator holdout`` can open it with others."""
    survey = await _survey(context, surveys, request.survey_id)
    answer: list = []
    p0 = list(request.p0) or None

    def compute(held: dict, histograms):
        from aggregator.confirm.run import holdout_answer

        answer.append(
            holdout_answer(held, survey, histograms, request.question_id, request.test, p0)
        )
        return answer[0]

    query = (request.question_id, request.test)
    state = await _writing(
        context, store, confirmations.holdout_query, survey, None, query, compute
    )
    _, reject, level = answer[0]
    guarantee = await asyncio.to_thread(_guarantee, state)
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


def _parse_plan(text: str, surveys):
    from aggregator.confirm.plan import parse_plan

    return parse_plan(text, surveys)


def _guarantee(state: dict) -> str:
    from aggregator.confirm.sparse_validate import SparseValidate

    return SparseValidate(**state).guarantee()
