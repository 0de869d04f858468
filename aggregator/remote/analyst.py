"""A running server's Analyst service, from the analyst's side: survey definitions and released
sufficient statistics come over gRPC, and the estimates and tests are computed here by the same
functions as on a report store, so both paths give the same results. Preregistration, sealing
and holdout queries change the server's state, so they run on the server."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from aggregator.analysis.design_answers import DesignEstimateAnswer
from aggregator.analysis.survey_data import SIDES, QuestionData, SurveyData
from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.remote.channel import AnalystCredentials, open_channel
from aggregator.remote.errors import NotReleasedError, RemoteError, remote_error
from aggregator.stats.design.options import (
    DEFAULT_CORRECTION,
    DEFAULT_INTERVAL,
    DEFAULT_REPLICATES,
    DEFAULT_SMALL_SAMPLE,
    DEFAULT_VARIANCE,
)
from aggregator.survey_file.config import ConfigError
from client.survey import QuestionSpec, SurveyError, SurveySpec
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

if TYPE_CHECKING:
    from aggregator.stats.design.rao_scott import DesignTestResult
    from aggregator.stats.estimate import Estimate
    from aggregator.stats.result import TestResult

#: Seconds one call may take (a seal runs every test of a plan on the server).
DEFAULT_TIMEOUT = 300.0
#: Trailing metadata of a pooled read: the JSON list of the groups whose releases it sums.
RELEASED_GROUPS_KEY = "ldp-released-groups"


@dataclass(frozen=True)
class Released:
    """What one Statistics call released: the histogram, and for a pooled read of a survey
    with a group label the groups the server summed (docs/wire.md §8.4; None otherwise)."""

    histogram: Histogram
    groups: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Registration:
    """A preregistered plan: its hash, when it was registered, and whether it was already."""

    plan_sha256: str
    registered_at: str
    already: bool


@dataclass(frozen=True)
class HoldoutAnswer:
    """One holdout query: the bit, the level it ran at, and the holdout's state after it
    (alpha, m, budget, answered, rejections: aggregator.confirm.sparse_validate)."""

    reject: bool
    level: float
    state: dict[str, Any]


class RemoteAnalyst:
    """The Analyst service of the server at ``address``; a context manager (closes the
    channel). Every failed call raises RemoteError (NotReleasedError below the release
    threshold) with one line of text."""

    def __init__(
        self,
        address: str,
        credentials: AnalystCredentials | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        credentials = credentials or AnalystCredentials()
        self.address = address
        self._channel = open_channel(address, credentials)
        self._stub = ldp_pb2_grpc.AnalystStub(self._channel)
        self._metadata = credentials.metadata()
        self._timeout = timeout
        self._surveys: dict[str, SurveySpec] = {}

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> RemoteAnalyst:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: Callable[..., Any], request: Any) -> Any:
        return self._call_with_trailer(method, request)[0]

    def _call_with_trailer(
        self, method: Any, request: Any
    ) -> tuple[Any, tuple[tuple[str, str | bytes], ...]]:
        """The answer and the call's trailing metadata."""
        try:
            answer, call = method.with_call(request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise remote_error(exc, self.address) from None
        return answer, tuple(call.trailing_metadata() or ())

    def survey(self, survey_id: str) -> SurveySpec:
        """The survey's definition as the server holds it (asked once per survey)."""
        if survey_id not in self._surveys:
            request = ldp_pb2.GetSurveyRequest(survey_id=survey_id)
            message = self._call(self._stub.GetSurvey, request)
            self._surveys[survey_id] = SurveySpec.from_proto(message)
        return self._surveys[survey_id]

    def question(self, survey_id: str, question_id: str) -> QuestionSpec:
        """The question's definition as the server holds it (RemoteError NOT_FOUND if none)."""
        try:
            return self.survey(survey_id).question(question_id)
        except KeyError:
            raise RemoteError(
                f"survey {survey_id!r} has no question {question_id!r}",
                grpc.StatusCode.NOT_FOUND,
            ) from None

    def released(
        self,
        survey_id: str,
        question_id: str,
        side: str | None = None,
        group: str | None = None,
        *,
        test: bool = False,
    ) -> Released:
        """What the server releases of the question on ``side`` of a split survey (exploration
        by default) and of one ``group`` (None: the released groups summed); ``test``: read
        for a test (refused for reports clustered by household). NotReleasedError when
        nothing is released yet."""
        question = self.question(survey_id, question_id)
        request = ldp_pb2.StatisticsRequest(
            survey_id=survey_id,
            question_id=question_id,
            test=test,
            side=_side_number(side),
            group=group or "",
        )
        answer, trailer = self._call_with_trailer(self._stub.Statistics, request)
        if answer.definition_digest != question.digest:
            raise RemoteError(
                f"{survey_id}/{question_id}: the server's definition changed while it was read; "
                "try again",
                grpc.StatusCode.ABORTED,
            )
        values = np.array(answer.values, dtype=float)
        hist = Histogram(question.mechanism, int(answer.n), values, question)
        summed = dict(trailer).get(RELEASED_GROUPS_KEY)
        groups = None if summed is None else tuple(json.loads(summed))
        return Released(hist, groups)

    def histogram(
        self,
        survey_id: str,
        question_id: str,
        side: str | None = None,
        group: str | None = None,
        *,
        test: bool = False,
    ) -> Histogram:
        """The released histogram (see ``released``)."""
        return self.released(survey_id, question_id, side, group, test=test).histogram

    def open_survey(
        self, survey: str, side: str | None = None, group: str | None = None
    ) -> SurveyData:
        """Every question of ``survey`` with its released histogram, as
        aggregator.analysis.survey_data.open_survey gives them from a report store; a question below
        ``min_batch_size`` is withheld (its ``histogram`` raises InsufficientDataError with the
        server's reason; the server does not say how many reports it has). ConfigError
        for a side of a survey that is not split or a group it does not declare, as there."""
        spec = self.survey(survey)
        if side is not None and not spec.split:
            raise ConfigError(f"survey {spec.id} is not split: it has no sides")
        if group:
            try:
                spec.check_group(group)
            except SurveyError as exc:
                raise ConfigError(str(exc)) from None
        questions: dict[str, QuestionData] = {}
        for question in spec.questions:
            try:
                hist = self.histogram(spec.id, question.id, side, group)
            except NotReleasedError as exc:
                empty = Histogram.empty(question.mechanism)
                questions[question.id] = QuestionData(question, empty, False, str(exc))
            else:
                designed = spec.design is not None  # its answers: design_estimate, design_test
                questions[question.id] = QuestionData(question, hist, True, "", None, designed)
        read = (side or "exploration") if spec.split else ""
        return SurveyData(spec, questions, read, group or "")

    def estimate(
        self,
        survey_id: str,
        question_id: str,
        confidence: float = 0.95,
        *,
        simultaneous: bool = False,
        side: str | None = None,
        group: str | None = None,
    ) -> Estimate:
        """aggregator.stats.estimate of the question's released histogram."""
        from aggregator.stats import estimate

        hist = self.histogram(survey_id, question_id, side, group)
        return estimate(hist, confidence, simultaneous=simultaneous)

    def goodness_of_fit(
        self,
        survey_id: str,
        question_id: str,
        p0: Sequence[float],
        alpha: float = 0.05,
        method: str | None = None,
        *,
        calibration: str = "auto",
        rng: int | None = None,
        side: str | None = None,
        group: str | None = None,
    ) -> TestResult:
        """aggregator.stats.goodness_of_fit of the question's released histogram."""
        from aggregator.stats import goodness_of_fit

        hist = self.histogram(survey_id, question_id, side, group, test=True)
        null = np.asarray(p0, dtype=float)
        return goodness_of_fit(hist, null, alpha, method, calibration=calibration, rng=rng)

    def independence(
        self,
        survey_id: str,
        question_id: str,
        alpha: float = 0.05,
        method: str | None = None,
        *,
        calibration: str = "auto",
        rng: int | None = None,
        side: str | None = None,
        group: str | None = None,
    ) -> TestResult:
        """aggregator.stats.independence of a two-attribute question's released histogram."""
        from aggregator.stats import independence

        shape = self.question(survey_id, question_id).table_shape
        if shape is None:
            raise InvalidInputError(f"question {question_id} does not have exactly 2 attributes")
        hist = self.histogram(survey_id, question_id, side, group, test=True)
        return independence(hist, shape, alpha, method, calibration=calibration, rng=rng)

    def design_estimate(
        self,
        survey_id: str,
        question_id: str,
        confidence: float = 0.95,
        *,
        variance: str = DEFAULT_VARIANCE,
        replicates: int = DEFAULT_REPLICATES,
        seed: int = 0,
        side: str | None = None,
        group: str | None = None,
        interval: str = DEFAULT_INTERVAL,
        small_sample: str = DEFAULT_SMALL_SAMPLE,
    ) -> DesignEstimateAnswer:
        """The design-based estimate of a survey with a sampling design, computed on the server
        from the design rows released with the question's histogram (docs/designs.md): at a
        release point the same as ``estimate --design`` on the store."""
        question = self.question(survey_id, question_id)
        request = ldp_pb2.EstimateRequest(
            survey_id=survey_id,
            question_id=question_id,
            confidence=confidence,
            side=_side_number(side),
            group=group or "",
            design=ldp_pb2.DesignOptions(
                variance=variance,
                replicates=replicates,
                seed=seed,
                interval=interval,
                small_sample=small_sample,
            ),
        )
        answer = self._call(self._stub.Estimate, request)
        deff, weighting, clustering = (
            np.array(values, dtype=float) if len(values) else None
            for values in (answer.deff, answer.weighting_effect, answer.clustering_effect)
        )
        return DesignEstimateAnswer(
            question.id,
            list(answer.labels),
            answer.mechanism,
            answer.design,
            answer.variance,
            int(answer.n),
            int(answer.design_df),
            answer.confidence,
            np.array(answer.frequencies, dtype=float),
            np.array(answer.standard_errors, dtype=float),
            np.array(answer.ci_low, dtype=float),
            np.array(answer.ci_high, dtype=float),
            deff,
            weighting,
            clustering,
            post_strata=dict(zip(answer.post_strata, answer.population, strict=True)),
            interval_method=answer.interval_method,
            small_sample=answer.small_sample,
            interval_df=answer.interval_df or None,
        )

    def design_test(
        self,
        survey_id: str,
        question_id: str,
        kind: str,
        p0: Sequence[float] | np.ndarray | None = None,
        alpha: float = 0.05,
        correction: str = DEFAULT_CORRECTION,
        variance: str = DEFAULT_VARIANCE,
        replicates: int = DEFAULT_REPLICATES,
        seed: int = 0,
        *,
        side: str | None = None,
        group: str | None = None,
        groups: tuple[str, str] | None = None,
    ) -> tuple[str, DesignTestResult]:
        """The Rao-Scott test ``kind`` ("gof" against ``p0``, "independence", or "homogeneity"
        of two ``groups`` of the survey's group label) of a survey with a sampling design, on
        the server from its released design rows: the design it rests on and the result."""
        from aggregator.stats.design.rao_scott import DesignTestResult

        options = ldp_pb2.DesignOptions(
            variance=variance, replicates=replicates, seed=seed, correction=correction
        )
        if kind == "gof":
            answer = self._call(
                self._stub.GoodnessOfFit,
                ldp_pb2.GoodnessOfFitRequest(
                    survey_id=survey_id,
                    question_id=question_id,
                    p0=[] if p0 is None else [float(x) for x in p0],
                    alpha=alpha,
                    side=_side_number(side),
                    group=group or "",
                    design=options,
                ),
            )
        elif kind == "independence":
            answer = self._call(
                self._stub.Independence,
                ldp_pb2.IndependenceRequest(
                    survey_id=survey_id,
                    question_id=question_id,
                    alpha=alpha,
                    side=_side_number(side),
                    group=group or "",
                    design=options,
                ),
            )
        elif kind == "homogeneity":
            first, second = groups or ("", "")  # none: every group of the label
            answer = self._call(
                self._stub.TwoSample,
                ldp_pb2.TwoSampleRequest(
                    survey_a=survey_id,
                    question_a=question_id,
                    group_a=first,
                    group_b=second,
                    alpha=alpha,
                    design=options,
                ),
            )
        else:
            raise InvalidInputError(
                f"the server's design tests are gof, independence and homogeneity, not {kind}"
            )
        result = DesignTestResult(
            statistic=answer.statistic,
            pvalue=answer.pvalue,
            dof=answer.dof if answer.HasField("dof") else None,
            method=answer.method,
            n=int(answer.n),
            alpha=answer.alpha,
            reject=answer.reject,
            expected=np.array(answer.expected, dtype=float),
            observed=np.array(answer.observed, dtype=float),
            mechanism=answer.mechanism,
            inconclusive=answer.inconclusive,
            reason=answer.reason,
            calibration=answer.calibration,
            calibration_reason=answer.calibration_reason,
            pearson=answer.pearson,
            eigenvalues=np.array(answer.eigenvalues, dtype=float),
            numerator_df=answer.numerator_df,
            denominator_df=answer.denominator_df if answer.HasField("denominator_df") else None,
            design_df=int(answer.design_df),
        )
        return answer.design, result

    def monitor(
        self,
        survey_id: str,
        question_id: str,
        analysis: str = "frequencies",
        *,
        p0: Sequence[float] | None = None,
        alpha: float = 0.05,
        max_n: int | None = None,
        side: str | None = None,
        group: str | None = None,
        groups: tuple[str, str] | None = None,
        with_path: bool = False,
        scores: Sequence[float] | None = None,
    ) -> ldp_pb2.MonitorResponse:
        """Anytime-valid monitoring of the question on the server, over its release history
        (docs/monitoring.md): ``analysis`` is frequencies, goodness_of_fit (``p0``),
        independence, two_sample (``groups``, two values of the group label) or mean_score
        (``scores``, one per category; default 1..k). Computed on
        the server, so every caller sees the same looks; NotReleasedError before a release.
        ``with_path``: also the confidence sequence at every look (MonitorLook.low/high)."""
        request = ldp_pb2.MonitorRequest(
            survey_id=survey_id,
            question_id=question_id,
            analysis=analysis,
            p0=[] if p0 is None else [float(x) for x in p0],
            alpha=alpha,
            max_n=max_n or 0,
            side=_side_number(side),
            group=group or "",
            group_a=groups[0] if groups else "",
            group_b=groups[1] if groups else "",
            with_path=with_path,
            scores=[] if scores is None else [float(x) for x in scores],
        )
        return self._call(self._stub.Monitor, request)

    def preregister(self, survey_id: str, plan: str) -> Registration:
        """Register a confirmatory plan (its exact text) on the server."""
        request = ldp_pb2.PreregisterRequest(survey_id=survey_id, plan=plan)
        answer = self._call(self._stub.Preregister, request)
        return Registration(answer.plan_sha256, answer.registered_at, answer.already)

    def confirm(self, survey_id: str) -> tuple[dict[str, Any], bool]:
        """Seal the registered plan's results on the server (once): the sealed record, and
        whether it was sealed by an earlier call."""
        answer = self._call(self._stub.Confirm, ldp_pb2.ConfirmRequest(survey_id=survey_id))
        return json.loads(answer.results_json), answer.already

    def holdout(
        self,
        survey_id: str,
        question_id: str,
        test: str,
        p0: Sequence[float] | np.ndarray | None = None,
    ) -> HoldoutAnswer:
        """One SparseValidate query (``test``: "goodness_of_fit" or "independence") on the
        server; a holdout opened by it gets the default alpha, m and B."""
        request = ldp_pb2.HoldoutRequest(
            survey_id=survey_id,
            question_id=question_id,
            test=test,
            p0=[] if p0 is None else [float(x) for x in p0],
        )
        answer = self._call(self._stub.HoldoutTest, request)
        state = {
            "alpha": answer.alpha,
            "m": answer.max_queries,
            "budget": answer.max_rejections,
            "answered": answer.query,
            "rejections": answer.rejections,
        }
        return HoldoutAnswer(answer.reject, answer.level, state)


def _side_number(side: str | None) -> ldp_pb2.Side:
    """The wire value of a side name (SIDE_UNSPECIFIED: unset)."""
    if side is None:
        return ldp_pb2.SIDE_UNSPECIFIED
    if side not in SIDES:
        raise ConfigError(f"side must be one of {', '.join(SIDES)}, got {side!r}")
    return ldp_pb2.Side.Value(side.upper())
