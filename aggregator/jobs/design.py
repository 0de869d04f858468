"""Design-based estimates in the job: the exports' per design key statistics (their
``<survey>.design.json``, docs/shard-format.md) merged by key, joined to the survey's sampling
frame and estimated as ``ldp-aggregator estimate --design --json`` does (docs/designs.md).

Elements are one key's totals, keyed by (survey, question, group, key): exports of disjoint
stores add up per key exactly as an import into one store does."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from aggregator.analysis.design_answers import design_estimate_answer
from aggregator.analysis.design_data import DesignData
from aggregator.errors import LdpError
from aggregator.stats.design.options import DEFAULT_REPLICATES, DEFAULT_VARIANCE
from aggregator.store import shards
from aggregator.store.design_statistics import KeyStatistics
from aggregator.store.shards import ShardFormatError
from aggregator.survey_file.design import SamplingFrame
from client.survey import SurveySpec

#: (survey, question, group, design key)
KeyCell = tuple[str, str, str, str]
#: One key's reports: (n, int64 sums, float64 sums of squares).
KeyTotals = tuple[int, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class DesignInput:
    """One export's design statistics file, with its checksum and side from the manifest."""

    path: str
    survey: str
    side: int
    sha256: str


@dataclass(frozen=True)
class DesignAnalysis:
    """How to estimate: the variance method and its options, as ``estimate --design``."""

    variance: str = DEFAULT_VARIANCE
    replicates: int = DEFAULT_REPLICATES
    seed: int = 0
    confidence: float = 0.95


def read_design_file(
    item: DesignInput, surveys: dict[str, SurveySpec]
) -> Iterator[tuple[KeyCell, KeyTotals]]:
    """Every (group, key) row of one design file, verified against its manifest checksum and
    checked against the configured survey and its frame."""
    with FileSystems.open(item.path, compression_type=CompressionTypes.UNCOMPRESSED) as file:
        text = file.read()
    if hashlib.sha256(text).hexdigest() != item.sha256:
        raise ShardFormatError(f"{item.path}: checksum does not match the manifest")
    for question_id, stat in shards.parse_design(text, surveys[item.survey], item.side, item.path):
        yield (item.survey, question_id, stat.group, stat.key), (stat.n, stat.sums, stat.squares)


def add_totals(parts: Iterable[KeyTotals]) -> KeyTotals:
    """The sum of one key's totals from several exports (int64 sums checked for overflow)."""
    totals = list(parts)
    n = sum(t[0] for t in totals)
    sums = [sum(int(t[1][j]) for t in totals) for j in range(len(totals[0][1]))]
    if any(abs(x) > 2**63 - 1 for x in sums):
        raise OverflowError("design key sums overflow int64")
    squares = np.sum([t[2] for t in totals], axis=0)
    return n, np.array(sums, dtype=np.int64), squares


def design_results(
    element: tuple[tuple[str, str], list[tuple[str, str, KeyTotals]]],
    surveys: dict[str, SurveySpec],
    analysis: DesignAnalysis,
) -> Iterator[tuple[tuple[str, str, str], dict]]:
    """One question's merged keys -> its design-based result with every group pooled ('') and
    per group, keyed like the job's results (survey, question, group)."""
    (survey_id, question_id), rows = element
    survey = surveys[survey_id]
    assert isinstance(survey.design, SamplingFrame)  # a design file is read only for these
    keys = sorted(
        (KeyStatistics(group, key, n, sums, squares) for group, key, (n, sums, squares) in rows),
        key=lambda stat: (stat.group, stat.key),
    )
    groups = survey.group_label.values if survey.group_label else ("",)
    data = DesignData(survey.question(question_id), survey.design, tuple(keys), tuple(groups))
    yield (survey_id, question_id, ""), estimate_dict(data, analysis)
    for group in groups if survey.group_label else ():
        mine = tuple(stat for stat in keys if stat.group == group)
        if mine:
            one = DesignData(data.question, data.frame, mine, data.groups)
            yield (survey_id, question_id, group), estimate_dict(one, analysis)


def estimate_dict(data: DesignData, analysis: DesignAnalysis) -> dict:
    """``estimate --design --json``'s numbers for one question's design data (without
    ``question`` and ``labels``), or {"error": ...} when the data cannot support it."""
    try:
        answer = design_estimate_answer(
            data, analysis.variance, analysis.replicates, analysis.seed, analysis.confidence
        )
    except LdpError as exc:  # too little data, a lonely PSU, margins raking cannot reach
        return {"error": str(exc)}
    result = answer.to_dict()
    del result["question"], result["labels"]
    return result


def attach(result: dict, design: dict | None) -> None:
    """Add a released result's design-based estimate (``design``: its merged keys' result), or
    say why there is none: no design statistics, or exports that overlap (deduplicated reports
    cannot be taken out of per-key sums)."""
    if not result["released"]:
        return
    if result["duplicates_dropped"] or result["conflicting_ids"]:
        result["design"] = {
            "error": "the shards repeat report ids: per-key design statistics of overlapping "
            "exports cannot be deduplicated (give exports of disjoint stores)"
        }
    elif design is None:
        result["design"] = {"error": "no design statistics (give export directories)"}
    elif design.get("n", result["n"]) != result["n"]:
        result["design"] = {
            "error": f"the design statistics count {design['n']} reports, the shards {result['n']}"
        }
    else:
        result["design"] = design
