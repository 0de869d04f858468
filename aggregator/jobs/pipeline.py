"""The Beam pipeline: shards (or ranges of a PostgreSQL store's snapshot, postgres_source.py) ->
per-shard numpy pre-aggregation -> CombinePerKey -> results JSON.

Statistics are keyed by (survey, question, group): a survey with a public group label gets a
result per group and one with every group pooled (group ''), like the store's statistics.

Elements are shard files, per-shard partial statistics and, when deduplicating, per-partition
bundles of id/payload matrices; never single reports. Every stage is plain numpy code from the
other modules of this package, so the DirectRunner, Flink, Spark and Dataflow compute the same
numbers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from aggregator.jobs.dedup import deduplicate, split_by_partition
from aggregator.jobs.design import (
    DesignAnalysis,
    DesignInput,
    add_totals,
    attach,
    design_results,
    read_design_file,
)
from aggregator.jobs.framing import DEFAULT_BLOCK_BYTES, iter_blocks
from aggregator.jobs.inputs import ShardInput
from aggregator.jobs.partial import Partial
from aggregator.jobs.records import QuestionKey, QuestionRecords, classify
from aggregator.jobs.results import RESULTS_FORMAT, RESULTS_VERSION, Analysis, question_result
from aggregator.store.checks import ReportRejectedError
from aggregator.store.ingest import decode_payloads
from aggregator.store.shards import ShardFormatError
from aggregator.survey_file.design import IGNORES_DESIGN
from client.survey import SurveySpec

if TYPE_CHECKING:
    from aggregator.jobs.postgres_source import TableRange


@dataclass(frozen=True)
class JobSpec:
    """Everything the pipeline needs. ``dedup_partitions == 0``: the shards are disjoint."""

    surveys: dict[str, SurveySpec]
    shards: tuple[ShardInput, ...]
    out: str
    analysis: Analysis
    dedup_partitions: int = 0
    block_bytes: int = DEFAULT_BLOCK_BYTES
    progress_dir: str | None = None  # a local directory where each shard read leaves a mark
    tables: tuple[TableRange, ...] = ()  # instead of shards: ranges of a PostgreSQL store
    #: Design-based estimates of the surveys with a sampling design (None: none), from the
    #: exports' design statistics files ``designs``.
    design: DesignAnalysis | None = None
    designs: tuple[DesignInput, ...] = ()
    #: surveys with a sampling design read as simple random samples (--ignore-design): their
    #: results say so
    ignores_design: bool = False


def run(spec: JobSpec, beam_args: list[str]) -> dict:
    """Run the job to completion with Beam options ``beam_args``; return the results written."""
    with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
        build(pipeline, spec)
    with FileSystems.open(spec.out, compression_type=CompressionTypes.UNCOMPRESSED) as file:
        return json.loads(file.read())


def build(pipeline: beam.Pipeline, spec: JobSpec) -> None:
    """Add the job's transforms to ``pipeline``."""
    if spec.tables:  # one snapshot of a store: every report once, no deduplication
        from aggregator.jobs.postgres_source import ReadTableRange

        partials = (
            pipeline
            | "ListRanges" >> beam.Create(list(spec.tables))
            | "SpreadRanges" >> beam.Reshuffle()
            | "ReadAndPreaggregate" >> beam.ParDo(ReadTableRange(spec.surveys))
        )
        _merge_and_write(pipeline, partials, spec)
        return
    shards = (
        pipeline
        | "ListShards" >> beam.Create(list(spec.shards))
        | "SpreadShards" >> beam.Reshuffle()
    )
    read = ReadShard(spec.surveys, spec.block_bytes, spec.dedup_partitions, spec.progress_dir)
    if spec.dedup_partitions:
        partials = (
            shards
            | "ReadAndPartition" >> beam.ParDo(read)
            | "GroupPartitions" >> beam.GroupByKey()
            | "Deduplicate" >> beam.ParDo(DeduplicatePartition(spec.surveys))
        )
    else:
        partials = shards | "ReadAndPreaggregate" >> beam.ParDo(read)
    _merge_and_write(pipeline, partials, spec)


def _merge_and_write(pipeline: beam.Pipeline, partials, spec: JobSpec) -> None:
    """Merge the per-question partials (with zeros for every question), compute the results
    and write them."""
    zeros = pipeline | "EveryQuestion" >> beam.Create(
        [
            ((survey.id, question.id, group), Partial.zero(question.statistic_size))
            for survey in spec.surveys.values()
            for question in survey.questions
            for group in ("", *(survey.group_label.values if survey.group_label else ()))
        ]
    )
    surveys, analysis = spec.surveys, spec.analysis
    results = (
        (partials | "AndPooled" >> beam.FlatMap(with_pooled), zeros)
        | "AllPartials" >> beam.Flatten()
        | "Merge" >> beam.CombinePerKey(MergePartials())
        | "Results"
        >> beam.MapTuple(
            lambda key, total: question_result(surveys[key[0]], key[1], total, analysis, key[2])
        )
        | "Collect" >> beam.combiners.ToList()
    )
    if spec.design is None:
        _ = results | "WriteJson" >> beam.Map(write_results, spec)
        return
    designs = (
        pipeline
        | "ListDesignFiles" >> beam.Create(list(spec.designs))
        | "ReadDesignFiles" >> beam.FlatMap(read_design_file, surveys)
        | "MergeKeys" >> beam.CombinePerKey(add_totals)
        | "ByQuestion" >> beam.MapTuple(lambda cell, totals: (cell[:2], (*cell[2:], totals)))
        | "GroupKeys" >> beam.GroupByKey()
        | "DesignResults" >> beam.FlatMap(design_results, surveys, spec.design)
    )
    _ = results | "WriteJson" >> beam.Map(write_results, spec, beam.pvalue.AsDict(designs))


def with_pooled(element: tuple[QuestionKey, Partial]) -> Iterator[tuple[QuestionKey, Partial]]:
    """A group's partial, and the same partial for its question with every group pooled."""
    key, partial = element
    yield key, partial
    if key[2]:
        yield (key[0], key[1], ""), partial


class ReadShard(beam.DoFn):
    """Read one shard block by block, verify it against its manifest entry, and emit either
    (question, Partial) per question, or (partition, records) bundles for deduplication. With a
    ``progress_dir`` (local runners only), a shard read to the end leaves an empty file there,
    named by its path's hash, so that a retried bundle marks it once: the command line counts
    them for its progress bar."""

    def __init__(
        self,
        surveys: dict[str, SurveySpec],
        block_bytes: int,
        partitions: int,
        progress_dir: str | None = None,
    ) -> None:
        self.surveys = surveys
        self.block_bytes = block_bytes
        self.partitions = partitions
        self.progress_dir = progress_dir

    def process(self, shard: ShardInput) -> Iterator[tuple]:
        with FileSystems.open(shard.path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
            file = _HashingReader(raw)
            try:
                yield from self._read(shard, file)
            except (ShardFormatError, ReportRejectedError) as exc:
                file.read_to_end()  # a damaged file is better named by its checksum
                _verify(shard, None, file.hexdigest())
                if isinstance(exc, ReportRejectedError):
                    raise ShardFormatError(
                        f"{shard.path}: invalid report ({exc.reason.value}): {exc}"
                    ) from None
                raise
        if self.progress_dir is not None:
            name = hashlib.sha256(shard.path.encode()).hexdigest()[:32]
            Path(self.progress_dir, name).touch()

    def _read(self, shard: ShardInput, file: _HashingReader) -> Iterator[tuple]:
        totals: dict[QuestionKey, Partial] = {}
        count = 0
        for block in iter_blocks(file, shard.path, self.block_bytes):
            count += len(block)
            records = classify(block, self.surveys, shard.path)
            if self.partitions:  # validated here, summed after dedup
                for part in records:
                    decode_payloads(_question(self.surveys, part.key), part.payloads)
                yield from split_by_partition(records, self.partitions).items()
                continue
            for part in records:
                partial = Partial.of_payloads(_question(self.surveys, part.key), part.payloads)
                totals[part.key] = totals[part.key] + partial if part.key in totals else partial
        _verify(shard, count, file.hexdigest())
        yield from totals.items()


def _question(surveys: dict[str, SurveySpec], key: QuestionKey):
    return surveys[key[0]].question(key[1])


class DeduplicatePartition(beam.DoFn):
    """Count each id of one partition once, then pre-aggregate per question."""

    def __init__(self, surveys: dict[str, SurveySpec]) -> None:
        self.surveys = surveys

    def process(self, element: tuple[int, list[list[QuestionRecords]]]) -> Iterator[tuple]:
        _, bundles = element
        kept, counts = deduplicate([part for bundle in bundles for part in bundle])
        by_key: dict[QuestionKey, list[QuestionRecords]] = {}
        for part in kept:
            by_key.setdefault(part.key, []).append(part)
        for key, (duplicates, conflicts) in counts.items():
            question = _question(self.surveys, key)
            payloads = [p.payloads for p in by_key.get(key, [])]
            yield (
                key,
                Partial.of_payloads(
                    question,
                    _stack(payloads, question.mechanism.payload_size),
                    duplicates,
                    conflicts,
                ),
            )


class MergePartials(beam.CombineFn):
    """Sum per-question statistics; the accumulator is the numpy Partial (None = nothing yet)."""

    def create_accumulator(self) -> Partial | None:
        return None

    def add_input(self, accumulator: Partial | None, element: Partial) -> Partial:
        return element if accumulator is None else accumulator + element

    def merge_accumulators(self, accumulators) -> Partial | None:
        total = None
        for accumulator in accumulators:
            if accumulator is not None:
                total = accumulator if total is None else total + accumulator
        return total

    def extract_output(self, accumulator: Partial | None) -> Partial | None:
        return accumulator


def _label_simple_answers(result: dict) -> None:
    """The estimate and tests the job computes from a designed survey's histogram treat its
    reports as a simple random sample: each says it ignores the design (the design-based
    estimate is the result's ``design`` entry)."""
    answers = [result.get("estimate"), *result.get("tests", {}).values()]
    for answer in answers:
        if isinstance(answer, dict) and "error" not in answer:
            answer["ignores_design"] = True


def write_results(results: list[dict], spec: JobSpec, designs: dict | None = None) -> None:
    """Write the results document: every question of each survey named by a manifest or seen in
    the shards (other configured surveys are left out), sorted by survey and question id; with
    ``designs`` (survey, question, group) -> design-based estimate, each released result of a
    survey with a sampling design gets its ``design`` entry; with ``ignores_design`` set each
    result of such a survey says it ignores the design."""
    for result in results:
        if spec.surveys[result["survey"]].design is None:
            continue
        _label_simple_answers(result)
        if designs is not None:
            key = (result["survey"], result["question"], result.get("group", ""))
            attach(result, designs.get(key))
        elif spec.ignores_design:
            result |= {"ignores_design": True, "design_label": IGNORES_DESIGN}
    seen = {r["survey"] for r in results if r["n"] or r["duplicates_dropped"]}
    wanted = seen | {s.survey for s in spec.shards if s.survey is not None}
    wanted |= {t.survey_id for t in spec.tables}
    document = {
        "format": RESULTS_FORMAT,
        "version": RESULTS_VERSION,
        "shards": len(spec.shards),
        "deduplicated": bool(spec.dedup_partitions),
        "dedup_partitions": spec.dedup_partitions,
        "results": sorted(
            (r for r in results if r["survey"] in wanted),
            key=lambda r: (r["survey"], r["question"], r.get("group", "")),
        ),
    }
    with FileSystems.create(spec.out, compression_type=CompressionTypes.UNCOMPRESSED) as file:
        file.write((json.dumps(document, indent=2) + "\n").encode())


class _HashingReader:
    """A file wrapper that hashes everything read through it."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self._digest = hashlib.sha256()

    def read(self, size: int) -> bytes:
        data = self._file.read(size)
        self._digest.update(data)
        return data

    def read_to_end(self) -> None:
        while self.read(1 << 20):
            pass

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def _verify(shard: ShardInput, count: int | None, digest: str) -> None:
    if shard.sha256 is not None and digest != shard.sha256:
        raise ShardFormatError(f"{shard.path}: checksum does not match the manifest")
    if count is not None and shard.reports is not None and count != shard.reports:
        raise ShardFormatError(
            f"{shard.path}: holds {count} reports, the manifest says {shard.reports}"
        )


def _stack(payloads: list[np.ndarray], width: int) -> np.ndarray:
    return np.concatenate(payloads) if payloads else np.zeros((0, width), dtype=np.uint8)
