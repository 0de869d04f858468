"""Which shard files a job reads, and whether they can overlap.

An input is a shard directory (its ``manifest.json`` lists the shards with their report counts
and checksums, which the job verifies while reading) or a file pattern (``/data/*.ldpr``,
``gs://bucket/run-*/*.ldpr``: anything Beam's FileSystems can match). One export's shards are
disjoint: the store keys reports by id and the export writes each id to exactly one shard. Input
from several sources may repeat ids, so by default the job then deduplicates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from apache_beam.io.filesystems import FileSystems

from aggregator.jobs.design import DesignInput
from aggregator.store import shards
from aggregator.store.definitions import reads_as, survey_change
from client.survey import SurveySpec


class JobInputError(ValueError):
    """The shard inputs are missing, empty or disagree with the survey definitions."""


@dataclass(frozen=True)
class ShardInput:
    """One shard file; ``survey``, ``reports`` and ``sha256`` are known when it came from a
    manifest."""

    path: str
    survey: str | None = None
    reports: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class Inputs:
    shards: tuple[ShardInput, ...]
    may_overlap: bool
    sides: dict[str, int] = field(default_factory=dict)  # split survey -> the side its shards hold
    designs: tuple[DesignInput, ...] = ()  # the export directories' design statistics files


def resolve(sources: list[str], surveys: dict[str, SurveySpec]) -> Inputs:
    """Expand shard directories and patterns into shard files."""
    found: list[ShardInput] = []
    designs: list[DesignInput] = []
    sides: dict[str, int] = {}
    from_patterns = False
    for source in sources:
        if Path(source).is_dir():
            manifest = _manifest(Path(source), surveys)
            survey = manifest.survey.id
            if survey in sides and sides[survey] != manifest.side:
                raise JobInputError(
                    f"{source}: the other side of split survey {survey}; a job reads one side "
                    "of a split survey (export and run each side on its own)"
                )
            if manifest.survey.split:
                sides[survey] = manifest.side
            found += [
                ShardInput(str(Path(source) / name), survey, count, digest)
                for name, count, digest in manifest.shards
            ]
            if manifest.design is not None:
                name, digest = manifest.design
                designs.append(DesignInput(str(Path(source) / name), survey, manifest.side, digest))
            continue
        from_patterns = True
        matches = FileSystems.match([source])[0].metadata_list
        if not matches:
            raise JobInputError(f"no shard files match {source!r}")
        found += [ShardInput(m.path) for m in sorted(matches, key=lambda m: m.path)]
    if not found:
        raise JobInputError("no shard files to read")
    overlap = from_patterns or len(sources) > 1
    return Inputs(tuple(found), may_overlap=overlap, sides=sides, designs=tuple(designs))


def _manifest(directory: Path, surveys: dict[str, SurveySpec]) -> shards.Manifest:
    manifest = shards.read_manifest(directory)
    given = surveys.get(manifest.survey.id)
    if not reads_as(manifest.survey, given):
        raise JobInputError(f"{directory}: {survey_change(manifest.survey, given)}")
    return manifest
