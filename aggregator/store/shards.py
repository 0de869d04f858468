"""Sharded export of a survey's report log, for re-import and for distributed aggregation jobs.

Format ``ldp-report-shards`` version 1 (documented in docs/shard-format.md): a directory with
``manifest.json`` and shard files ``<survey>-<i>-of-<n>.ldpr``. A shard is the 8-byte header
``b"LDPR\\x01\\x00\\x00\\x00"`` followed by records, each a base-128 varint length and the
serialized wire ``ldp.v1.Report``. Length-delimited protobuf was chosen over Parquet because it
needs no dependency beyond protobuf (already required), keeps the exact wire bytes (the same
validation code reads it), streams record by record, and splits into shards trivially. Reports are
assigned to shards by their random report id, so shards are balanced and an id always lands in
the same shard.

A survey with a sampling design adds ``<survey>.design.json``, its per design key statistics
(aggregates keyed by public frame keys, never per report: the shards carry no keys), checksummed
in the manifest like the shards, so an import and the Beam job can restore and merge them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from aggregator.store.design_statistics import KeyStatistics
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2

FORMAT = "ldp-report-shards"
VERSION = 1
HEADER = b"LDPR" + bytes([VERSION, 0, 0, 0])
MAX_RECORD_BYTES = 1 << 20
PROGRESS_EVERY = 4096  # reports between two progress calls of an export
DESIGN_FORMAT = "ldp-design-statistics"
SIDE_NAMES: dict[int, str] = {
    ldp_pb2.EXPLORATION: "exploration",
    ldp_pb2.CONFIRMATION: "confirmation",
}


class ShardFormatError(ValueError):
    """A shard directory or file is not in the expected format (or is corrupt)."""


def side_enum(side: int) -> ldp_pb2.Side:
    """The ``ldp.v1.Side`` of a side number as stored and written in manifests."""
    for value in (ldp_pb2.SIDE_UNSPECIFIED, ldp_pb2.EXPLORATION, ldp_pb2.CONFIRMATION):
        if value == side:
            return value
    raise ShardFormatError(f"no ldp.v1.Side has the number {side}")


@dataclass(frozen=True)
class Manifest:
    survey: SurveySpec
    shards: tuple[tuple[str, int, str], ...]  # (file name, report count, sha256 hex)
    side: int = 0  # the side of a split survey the shards hold (ldp.v1.Side); 0: not split
    design: tuple[str, str] | None = None  # (file name, sha256 hex) of the design statistics

    @property
    def reports(self) -> int:
        return sum(count for _, count, _ in self.shards)


def shard_of(report_id: bytes, shards: int) -> int:
    """The shard a report id belongs to (ids are uniformly random, so shards balance)."""
    return int.from_bytes(report_id[:8], "little") % shards


def shard_name(survey_id: str, index: int, shards: int) -> str:
    return f"{survey_id}-{index:05d}-of-{shards:05d}.ldpr"


#: A survey's per design key statistics: (question id, one group and key's statistics).
DesignRows = list[tuple[str, KeyStatistics]]


class ReportSource(Protocol):
    """What an export reads: a store's reports of one survey in report_id order, from one
    snapshot (ReportStore, StoreReader, or the shared PostgresStore)."""

    def iter_reports(
        self,
        survey_id: str,
        question_id: str | None = None,
        batch: int = 10000,
        side: int | None = None,
    ) -> Iterator[tuple[bytes, str, bytes, str]]: ...


def export_survey(
    store: ReportSource,
    survey: SurveySpec,
    out_dir: Path,
    shards: int,
    progress: Callable[[int], object] | None = None,
    side: int = 0,
    design: DesignRows | None = None,
) -> Manifest:
    """Write every stored report of ``survey`` into ``shards`` shard files plus a manifest;
    ``progress(count)`` hears of the reports written, every ``PROGRESS_EVERY`` of them.
    A split survey is exported one side at a time (``side``, named in the manifest; the caller
    checks that the side may be read: docs/adaptive-analysis.md). A survey with a sampling
    design needs its per-key ``design`` statistics, read from the same snapshot as the reports
    (checked: their counts per question and group must be the reports')."""
    if (survey.design is None) != (design is None):
        raise ValueError(f"survey {survey.id}: design statistics go with a sampling design")
    if shards < 1:
        raise ValueError("shards must be at least 1")
    if survey.split and side not in SIDE_NAMES:
        raise ValueError(f"survey {survey.id} is split: export its exploration or its confirmation")
    if not survey.split and side:
        raise ValueError(f"survey {survey.id} is not split: it has no sides")
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [shard_name(survey.id, i, shards) for i in range(shards)]
    files = [open(out_dir / name, "wb") for name in names]  # noqa: SIM115 - closed below
    counts = [0] * shards
    cells: dict[tuple[str, str], int] = {}  # reports per (question, group)
    written = 0
    try:
        for file in files:
            file.write(HEADER)
        for report_id, question_id, payload, group in store.iter_reports(
            survey.id, side=side or None
        ):
            record = ldp_pb2.Report(
                report_id=report_id,
                survey_id=survey.id,
                question_id=question_id,
                payload=payload,
                group=group,
            ).SerializeToString()
            index = shard_of(report_id, shards)
            files[index].write(_varint(len(record)) + record)
            counts[index] += 1
            cells[question_id, group] = cells.get((question_id, group), 0) + 1
            written += 1
            if progress is not None and written % PROGRESS_EVERY == 0:
                progress(PROGRESS_EVERY)
        if progress is not None:
            progress(written % PROGRESS_EVERY)
    finally:
        for file in files:
            file.close()
    entry = None
    if design is not None:
        if design_counts(design) != cells:
            raise ValueError(
                f"survey {survey.id}: the design statistics do not count the exported reports "
                "(read them from the same snapshot)"
            )
        entry = write_design(out_dir, survey.id, side, design)
    return write_manifest(out_dir, survey, list(zip(names, counts, strict=True)), side, entry)


def write_manifest(
    out_dir: Path,
    survey: SurveySpec,
    shards: list[tuple[str, int]],
    side: int = 0,
    design: tuple[str, str] | None = None,
) -> Manifest:
    """Checksum the written shard files (name, report count) and write ``manifest.json``;
    ``design`` names the design statistics file and its checksum."""
    entries = tuple((name, count, _sha256(out_dir / name)) for name, count in shards)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "survey": json_format.MessageToDict(survey.to_proto()),
        "shards": [{"file": n, "reports": c, "sha256": h} for n, c, h in entries],
    }
    if side:
        manifest["side"] = SIDE_NAMES[side]
    if design is not None:
        manifest["design"] = {"file": design[0], "sha256": design[1]}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return Manifest(survey, entries, side, design)


def read_manifest(directory: Path) -> Manifest:
    """Parse and check a shard directory's manifest (not the shard contents)."""
    try:
        data = json.loads((directory / "manifest.json").read_text())
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: absurd nesting
        raise ShardFormatError(f"cannot read {directory / 'manifest.json'}: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ShardFormatError(f"{directory} is not {FORMAT} version {VERSION}")
    try:
        survey = SurveySpec.from_proto(json_format.ParseDict(data["survey"], ldp_pb2.Survey()))
        shards = tuple(_shard_entry(entry) for entry in data["shards"])
        side = _side(data.get("side"), survey)
        design = _design_entry(data.get("design"), survey)
    except (
        KeyError,
        TypeError,
        ValueError,
        OverflowError,
        RecursionError,
        json_format.ParseError,
    ) as exc:
        raise ShardFormatError(f"{directory}: malformed manifest: {exc}") from exc
    return Manifest(survey, shards, side, design)


def _side(name: object, survey: SurveySpec) -> int:
    """The manifest's side: required for a split survey, absent otherwise."""
    if not survey.split:
        if name is not None:
            raise ValueError(f"a side for survey {survey.id}, which is not split")
        return 0
    sides = {value: side for side, value in SIDE_NAMES.items()}
    if name not in sides:
        raise ValueError(f"survey {survey.id} is split: side must be one of {sorted(sides)}")
    return sides[name]


def _design_entry(entry: object, survey: SurveySpec) -> tuple[str, str] | None:
    """The manifest's design statistics entry (file, sha256): only for a survey with a design."""
    if entry is None:
        return None
    if survey.design is None:
        raise ValueError(f"design statistics for survey {survey.id}, which has no design")
    if not isinstance(entry, dict):
        raise TypeError("design must be an object")
    return _plain_file(entry["file"], entry["sha256"])


def _shard_entry(entry: dict) -> tuple[str, int, str]:
    """One manifest shard entry; the file must be a plain name inside the shard directory."""
    name, digest = _plain_file(entry["file"], entry["sha256"])
    return name, int(entry["reports"]), digest


def _plain_file(name: object, digest: object) -> tuple[str, str]:
    """A (file, sha256) of a manifest entry: a plain name inside the shard directory."""
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "\0" in name
        or Path(name).name != name
    ):
        raise ValueError(f"shard file {name!r} is not a plain file name")
    if not isinstance(digest, str):
        raise ValueError(f"sha256 of {name} is not a string")
    return name, digest


def design_name(survey_id: str) -> str:
    return f"{survey_id}.design.json"


def design_counts(rows: DesignRows) -> dict[tuple[str, str], int]:
    """Reports per (question, group) that per-key statistics count."""
    counts: dict[tuple[str, str], int] = {}
    for question_id, stat in rows:
        counts[question_id, stat.group] = counts.get((question_id, stat.group), 0) + stat.n
    return counts


def write_design(out_dir: Path, survey_id: str, side: int, rows: DesignRows) -> tuple[str, str]:
    """Write the design statistics file (JSON: integers exact, float64 squares round-trip
    exactly through ``repr``); its (file name, sha256)."""
    document = {
        "format": DESIGN_FORMAT,
        "version": VERSION,
        "survey": survey_id,
        "rows": [
            {
                "question": question_id,
                "group": stat.group,
                "key": stat.key,
                "n": int(stat.n),
                "sums": [int(v) for v in stat.sums],
                "squares": [float(v) for v in stat.squares],
            }
            for question_id, stat in rows
        ],
    }
    if side:
        document["side"] = SIDE_NAMES[side]
    name = design_name(survey_id)
    (out_dir / name).write_text(json.dumps(document, indent=1) + "\n")
    return name, _sha256(out_dir / name)


def read_design(directory: Path, manifest: Manifest, survey: SurveySpec) -> DesignRows:
    """The export's design statistics, checked against the manifest's checksum and the
    configured ``survey`` (its questions, groups, statistic sizes and frame's keys).
    ShardFormatError for an export of a survey with a design that has none (written before
    design statistics were exported)."""
    if manifest.design is None:
        raise ShardFormatError(
            f"{directory}: survey {survey.id} has a sampling design but the export carries no "
            "design statistics (export it again)"
        )
    name, digest = manifest.design
    if _sha256(directory / name) != digest:
        raise ShardFormatError(f"{directory / name}: checksum does not match the manifest")
    return parse_design((directory / name).read_bytes(), survey, manifest.side, directory / name)


def parse_design(text: bytes, survey: SurveySpec, side: int, where: object) -> DesignRows:
    """Parse and check a design statistics file's bytes (``where`` names it in errors)."""
    try:
        data = json.loads(text)
        if data["format"] != DESIGN_FORMAT or data["version"] != VERSION:
            raise ValueError(f"not {DESIGN_FORMAT} version {VERSION}")
        if data["survey"] != survey.id or data.get("side") != SIDE_NAMES.get(side):
            raise ValueError("its survey or side is not the manifest's")
        rows = [_design_row(row, survey) for row in data["rows"]]
    except (KeyError, TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise ShardFormatError(f"{where}: malformed design statistics: {exc}") from exc
    if len({(q, s.group, s.key) for q, s in rows}) != len(rows):
        raise ShardFormatError(f"{where}: a (question, group, key) is listed twice")
    return rows


def _design_row(row: dict, survey: SurveySpec) -> tuple[str, KeyStatistics]:
    question = survey.question(str(row["question"]))
    group, key, n = row["group"], row["key"], row["n"]
    if not isinstance(group, str) or not isinstance(key, str) or type(n) is not int or n < 1:
        raise ValueError("group and key must be strings and n a positive integer")
    survey.check_group(group)
    survey.check_design_key(key)
    sums = np.array([_integer(v) for v in row["sums"]], dtype=np.int64)
    squares = np.array(row["squares"], dtype=np.float64)
    k = question.statistic_size
    if sums.shape != (k,) or squares.shape != (k,):
        raise ValueError(f"question {question.id} has statistics of length {k}")
    if not np.all(np.isfinite(squares)) or np.any(squares < 0):
        raise ValueError("sums of squares must be finite and non-negative")
    return question.id, KeyStatistics(group, key, n, sums, squares)


def _integer(value: object) -> int:
    if type(value) is not int:
        raise ValueError(f"{value!r} is not an integer")
    return value


def check_header(header: bytes, name: object) -> None:
    """Refuse a file that does not start with this format's header."""
    if header != HEADER:
        raise ShardFormatError(f"{name}: not a version-{VERSION} report shard")


def decode_length(buffer: bytes | bytearray, position: int, name: object) -> tuple[int, int] | None:
    """The record length prefixed at ``position`` and where the record starts, or None if the
    buffer ends inside the prefix. A malformed or too large length is a ShardFormatError."""
    length, shift = 0, 0
    while position < len(buffer):
        byte = buffer[position]
        position += 1
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if length > MAX_RECORD_BYTES:
                raise ShardFormatError(f"{name}: record of {length} bytes is too large")
            return length, position
        shift += 7
        if shift > 63:
            raise ShardFormatError(f"{name}: malformed length prefix")
    return None


def read_shard(path: Path) -> Iterator[ldp_pb2.Report]:
    """Stream the reports of one shard file."""
    with open(path, "rb") as file:
        check_header(file.read(len(HEADER)), path)
        while True:
            length = _read_length(file, path)
            if length is None:
                return
            record = file.read(length)
            if len(record) != length:
                raise ShardFormatError(f"{path}: truncated record")
            try:
                report = ldp_pb2.Report.FromString(record)
            except DecodeError as exc:
                raise ShardFormatError(f"{path}: record is not an ldp.v1.Report") from exc
            yield report


def verify(directory: Path, manifest: Manifest) -> None:
    """Check every shard's checksum against the manifest."""
    for name, _, digest in manifest.shards:
        if _sha256(directory / name) != digest:
            raise ShardFormatError(f"{directory / name}: checksum does not match the manifest")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_length(file, path: Path) -> int | None:
    """The next record's length from a file, None at a clean end of the file."""
    prefix = bytearray()
    while True:
        byte = file.read(1)
        if not byte:
            if prefix:
                raise ShardFormatError(f"{path}: truncated length prefix")
            return None
        prefix += byte
        if not byte[0] & 0x80 or len(prefix) > 10:
            decoded = decode_length(prefix, 0, path)  # a complete prefix, or one too long
            if decoded is None:  # decode_length raised for one too long
                raise ShardFormatError(f"{path}: malformed length prefix")
            return decoded[0]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
