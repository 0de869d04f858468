"""Design-based answers as both ways of reading give them: computed from a question's design
data (``estimate --design`` on ``--db``, and the Analyst service from its released design
rows), or rebuilt from the Analyst's reply (``--server``), so both print the same
(docs/designs.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from aggregator.stats.design.options import DEFAULT_INTERVAL, DEFAULT_SMALL_SAMPLE

if TYPE_CHECKING:
    from aggregator.analysis.design_data import DesignData
    from aggregator.stats.design.rao_scott import DesignTestResult


@dataclass(frozen=True)
class DesignEstimateAnswer:
    """A design-based estimate of one question: per category the unbiased (Hajek) estimate,
    which under local noise may lie outside [0, 1], its standard error and interval (inside
    [0, 1] unless by "wald"; ``interval_method`` says how it was made, empty when a server did
    not say), and (not for a post-stratified estimate) the design effects; which design,
    variance method and design degrees of freedom (R's degf) it rests on; the small-sample
    mode and the degrees of freedom of the intervals' t reference (``small_sample`` empty and
    ``interval_df`` None when a server did not say; ``interval_method`` names both)."""

    question: str
    labels: list[str]
    mechanism: str
    design: str
    variance: str
    n: int
    degrees_of_freedom: int
    confidence: float
    estimate: np.ndarray
    standard_error: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    deff: np.ndarray | None = None  # with the two below: None for a post-stratified estimate
    weighting_effect: np.ndarray | None = None
    clustering_effect: np.ndarray | None = None
    post_strata: dict[str, float] = field(default_factory=dict)
    interval_method: str = ""
    small_sample: str = ""
    interval_df: float | None = None

    def to_dict(self) -> dict:
        """The JSON of ``estimate --design --json`` (and of the Beam job's design results):
        NaN (a design effect undefined for a category) as null."""
        head: dict[str, object] = {
            "question": self.question,
            "labels": self.labels,
            "design": self.design,
        }
        if self.post_strata:
            head["post_strata"] = self.post_strata
        columns = {
            "standard_error": self.standard_error,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
        }
        for name in ("deff", "weighting_effect", "clustering_effect"):
            values = getattr(self, name)
            if values is not None:
                columns[name] = values
        return {
            **head,
            "variance": self.variance,
            "n": self.n,
            "degrees_of_freedom": self.degrees_of_freedom,
            "confidence": self.confidence,
            "interval_method": self.interval_method,
            "small_sample": self.small_sample,
            "interval_df": self.interval_df,
            "estimate": _floats(self.estimate),
            **{name: _floats(values) for name, values in columns.items()},
        }


def design_estimate_answer(
    data: DesignData,
    variance: str,
    replicates: int,
    seed: int,
    confidence: float,
    interval: str = DEFAULT_INTERVAL,
    small_sample: str = DEFAULT_SMALL_SAMPLE,
) -> DesignEstimateAnswer:
    """The design-based estimate of ``data`` (post-stratified when its frame has post-strata,
    raked when it has margins), its intervals by ``interval`` (``options.INTERVALS``), its
    variance and t reference by ``small_sample`` (``options.SMALL_SAMPLE``).
    InsufficientDataError / InvalidInputError / RakingError as the statistics raise them."""
    from aggregator.stats.design.calibration import post_stratified_estimate
    from aggregator.stats.design.estimate import design_estimate
    from aggregator.stats.design.intervals import check_interval, interval_name, report_share
    from aggregator.stats.design.raking import raked_estimate
    from aggregator.stats.design.small_sample import check_small_sample

    check_interval(interval)
    check_small_sample(small_sample)
    question = data.question
    labels, mechanism = list(question.labels), question.mechanism.describe()
    described = data.description()
    share = report_share(question.mechanism)
    if data.post_strata or data.raking:
        options = (variance, replicates, seed)
        post = (
            post_stratified_estimate(
                data.cells(by_post_stratum=True),
                data.population(),
                *options,
                share=share,
                small_sample=small_sample,
            )
            if data.post_strata
            else raked_estimate(
                data.raking_cells(),
                data.margins(),
                *options,
                share=share,
                small_sample=small_sample,
            )
        )
        low, high = post.intervals(confidence, interval)
        return DesignEstimateAnswer(
            question.id,
            labels,
            mechanism,
            described,
            post.variance_method,
            data.n,
            post.degrees_of_freedom,
            confidence,
            estimate=np.asarray(post.estimate),
            standard_error=np.asarray(post.standard_error),
            ci_low=np.asarray(low),
            ci_high=np.asarray(high),
            post_strata=dict(data.frame.population),
            interval_method=interval_name(interval, share, post.interval_df, small_sample),
            small_sample=small_sample,
            interval_df=post.interval_df,
        )
    est = design_estimate(
        data.cells(), question.mechanism, variance, replicates, seed, small_sample
    )
    interval_df = float(est.interval_df[0].min())
    low, high = est.intervals(confidence, interval)
    return DesignEstimateAnswer(
        question.id,
        labels,
        mechanism,
        described,
        est.variance_method,
        est.n,
        est.degrees_of_freedom,
        confidence,
        estimate=est.estimate[0],
        standard_error=est.standard_error[0],
        ci_low=low[0],
        ci_high=high[0],
        deff=est.deff[0],
        weighting_effect=np.full(len(question.labels), est.weighting_effect[0]),
        clustering_effect=est.clustering_effect[0],
        interval_method=interval_name(interval, share, interval_df, small_sample),
        small_sample=small_sample,
        interval_df=interval_df,
    )


def design_test(
    data: DesignData,
    kind: str,
    p0: np.ndarray | None,
    alpha: float,
    correction: str,
    variance: str,
    replicates: int,
    seed: int,
) -> DesignTestResult:
    """The Rao-Scott test ``kind`` ("gof" against ``p0``, "independence" of a two-attribute
    question, "homogeneity" of the survey's groups) of ``data``. InvalidInputError for an
    independence test of a question without exactly 2 attributes."""
    from aggregator.errors import InvalidInputError
    from aggregator.stats.design import rao_scott as design_tests

    question = data.question
    options = (correction, alpha, variance, replicates, seed)
    if kind == "gof":
        if p0 is None:
            raise InvalidInputError("a goodness-of-fit test needs p0")
        return design_tests.design_goodness_of_fit(data.cells(), question.mechanism, p0, *options)
    if kind == "independence":
        if len(question.shape) != 2:
            raise InvalidInputError(f"question {question.id} does not have exactly 2 attributes")
        rows, columns = question.shape
        return design_tests.design_independence(
            data.cells(), question.mechanism, rows, columns, *options
        )
    return design_tests.design_k_sample(data.cells(by_group=True), question.mechanism, *options)


def _floats(values: np.ndarray) -> list[float | None]:
    """JSON numbers, None for NaN."""
    return [None if np.isnan(v) else float(v) for v in np.asarray(values, dtype=float)]
