"""A question's released results from its merged statistic: the same estimate and tests, with
the same functions and defaults, as ``ldp-aggregator estimate/test``; nothing is released below
the survey's ``min_batch_size``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from aggregator.errors import ClusteredReportsError, InsufficientDataError, InvalidInputError
from aggregator.jobs.partial import Partial
from aggregator.stats import estimate, goodness_of_fit, independence
from aggregator.store import ingest
from aggregator.store.shards import SIDE_NAMES
from aggregator.survey_file.analyses import check_independent
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2

RESULTS_FORMAT = "ldp-job-results"
RESULTS_VERSION = 1


@dataclass(frozen=True)
class Analysis:
    """What to compute for each released question. ``gof`` maps (survey, question) to p0."""

    confidence: float = 0.95
    alpha: float = 0.05
    seed: int | None = None
    calibration: str = "auto"
    gof: dict[tuple[str, str], tuple[float, ...]] = field(default_factory=dict)
    #: The side each split survey's shards hold (from their manifests).
    sides: dict[str, int] = field(default_factory=dict)


def question_result(
    survey: SurveySpec, question_id: str, total: Partial, analysis: Analysis, group: str = ""
):
    """The JSON-safe result of one question, of one ``group`` of a survey with a group label
    ('': every group pooled)."""
    question = survey.question(question_id)
    out: dict = {
        "survey": survey.id,
        "question": question.id,
        "labels": question.labels,
        "mechanism": question.mechanism.describe(),
        "n": total.n,
        "duplicates_dropped": total.duplicates,
        "conflicting_ids": total.conflicts,
        "min_batch_size": survey.min_batch_size,
        "released": total.n >= survey.min_batch_size,
    }
    if survey.group_label is not None:
        out["group_label"] = survey.group_label.name
        out["group"] = group  # '': every group pooled
    if survey.split:
        side = analysis.sides.get(survey.id)
        if side is None:
            out["released"] = False
            out["reason"] = (
                f"survey {survey.id} is split, and these shards do not say which side they hold: "
                "read the export directory (its manifest names the side), not file patterns"
            )
            return out
        out["side"] = SIDE_NAMES[side]
        out["exploratory"] = side == ldp_pb2.EXPLORATION
    if not out["released"]:
        out["reason"] = (
            f"{total.n} reports; results are released from {survey.min_batch_size} "
            "(the survey's min_batch_size)"
        )
        return out
    out["sums"] = total.sums.tolist()  # the store's integer statistic (grid units if additive)
    hist = ingest.histogram(question, total.n, total.sums)
    out["estimate"] = _estimated(hist, analysis.confidence)
    tests: dict = {}
    refusal = _clustered(survey, question)
    p0 = analysis.gof.get((survey.id, question.id))
    if p0 is not None:
        tests["gof"] = refusal or _run(
            lambda: goodness_of_fit(
                hist,
                np.array(p0),
                analysis.alpha,
                calibration=analysis.calibration,
                rng=analysis.seed,
            )
        )
    if len(question.shape) == 2:
        tests["independence"] = refusal or _run(
            lambda: independence(
                hist,
                question.shape,
                analysis.alpha,
                calibration=analysis.calibration,
                rng=analysis.seed,
            )
        )
    out["tests"] = tests
    return out


def _estimated(hist, confidence: float) -> dict:
    """The estimate's dict, or {"error": ...} for public-coin one-bit reports, which carry no
    per-category estimate (their goodness of fit still runs)."""
    try:
        return estimate(hist, confidence, estimator="simplex").to_dict()  # the CLI's default
    except InvalidInputError as exc:
        if hist.mechanism.statistic_kind != "groups":
            raise
        return {"error": str(exc)}


def _clustered(survey: SurveySpec, question) -> dict | None:
    """{"error": ...} when the question's reports may be clustered by household
    (privacy-accounting spec §D.3)."""
    try:
        check_independent(survey, question)
    except ClusteredReportsError as exc:
        return {"error": str(exc)}
    return None


def _run(test) -> dict:
    """A test's result dict, or {"error": ...} when the data cannot support it."""
    try:
        return test().to_dict()
    except InsufficientDataError as exc:
        return {"error": str(exc)}
