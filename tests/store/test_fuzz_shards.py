"""Hostile shard directories (issue 4, item 4): random and mutated shard files and manifests
through the import path of ``aggregator/store/shards.py``. The only allowed outcomes are success or
a clean ``ShardFormatError``; reports read from a shard then meet the same validation as uploads."""

from __future__ import annotations

import contextlib
import json
import struct

import pytest
from fuzz_support import FUZZ_SETTINGS, FUZZ_SURVEYS, damaged, mutated_reports, reference_verdict
from google.protobuf import json_format
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.service.status import status_of
from aggregator.store import ingest, shards
from aggregator.store.checks import ReportRejectedError
from protos.ldp.v1 import ldp_pb2

pytestmark = pytest.mark.slow  # hypothesis fuzzing (docs/fuzzing.md)

SURVEY = FUZZ_SURVEYS["s1"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("shards")


def varint(value: int) -> bytes:
    """Base-128 varint, written here from the format description (docs/shard-format.md)."""
    out = bytearray()
    while value > 0x7F:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)
    return bytes(out)


def shard_bytes(reports: list[ldp_pb2.Report]) -> bytes:
    body = b"".join(varint(len(r.SerializeToString())) + r.SerializeToString() for r in reports)
    return shards.HEADER + body


shard_reports = st.lists(mutated_reports(FUZZ_SURVEYS), max_size=6)
hostile_shards = st.one_of(
    st.binary(max_size=400),
    st.binary(max_size=400).map(lambda tail: shards.HEADER + tail),
    damaged(shard_reports.map(shard_bytes)),
    # A length prefix that claims more than the format allows, or than the file holds.
    st.integers(0, 2**70).map(lambda n: shards.HEADER + varint(n) + b"\x0a\x10"),
)


@FUZZ_SETTINGS
@given(data=hostile_shards)
def test_hostile_shard_file(workdir, data: bytes) -> None:
    path = workdir / "hostile.ldpr"
    path.write_bytes(data)
    try:
        reports = list(shards.read_shard(path))
    except shards.ShardFormatError as exc:
        assert str(exc).startswith(str(path))
        return
    for report in reports:  # what import does next: the upload validation, same verdicts
        expected = reference_verdict(report, FUZZ_SURVEYS)
        try:
            ingest.validate(report, FUZZ_SURVEYS)
        except ReportRejectedError as exc:
            assert status_of(exc.reason) == expected.code
        else:
            assert expected.accepted


@settings(FUZZ_SETTINGS, max_examples=200)  # a round trip, not a hostile-input property
@given(reports=shard_reports)
def test_intact_shard_reads_back_every_record(workdir, reports: list[ldp_pb2.Report]) -> None:
    path = workdir / "intact.ldpr"
    path.write_bytes(shard_bytes(reports))
    assert list(shards.read_shard(path)) == reports


def valid_manifest() -> dict:
    return {
        "format": shards.FORMAT,
        "version": shards.VERSION,
        "survey": json_format.MessageToDict(SURVEY.to_proto()),
        "shards": [{"file": "s1-00000-of-00001.ldpr", "reports": 3, "sha256": "ab" * 32}],
    }


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


@st.composite
def mutated_manifests(draw) -> str:
    """Manifest text: a valid manifest with one value replaced or removed, hostile file names,
    non-object JSON, deep nesting, or plain garbage."""
    kind = draw(st.sampled_from(["replace", "delete", "file", "top", "nested", "garbage"]))
    manifest = valid_manifest()
    if kind in ("replace", "delete"):
        paths = _paths(manifest)
        parent, key = draw(st.sampled_from(paths))
        if kind == "delete" and isinstance(parent, dict):
            del parent[key]
        else:
            parent[key] = draw(json_values)
    elif kind == "file":
        manifest["shards"][0]["file"] = draw(
            st.one_of(
                st.sampled_from(["../escape.ldpr", "/etc/passwd", "", ".", "..", "a/b.ldpr"]),
                st.text(max_size=20),
            )
        )
    elif kind == "top":
        return json.dumps(draw(json_values))
    elif kind == "nested":
        depth = draw(st.integers(1, 100_000))
        return "[" * depth + "]" * draw(st.integers(0, depth))
    else:
        return draw(st.text(max_size=200))
    return json.dumps(manifest)


def _paths(value, out=None) -> list[tuple[object, object]]:
    """Every (container, key) pair inside a JSON value."""
    out = [] if out is None else out
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in items:
        out.append((value, key))
        if isinstance(child, dict | list) and child:
            _paths(child, out)
    return out


@FUZZ_SETTINGS
@given(text=mutated_manifests())
def test_hostile_manifest(workdir, text: str) -> None:
    directory = workdir / "manifest"
    directory.mkdir(exist_ok=True)
    (directory / "manifest.json").write_text(text)
    try:
        manifest = shards.read_manifest(directory)
    except shards.ShardFormatError:
        return
    assert manifest.survey.id and all(isinstance(count, int) for _, count, _ in manifest.shards)
    for name, _, _ in manifest.shards:  # never a path that leaves the shard directory
        assert (directory / name).parent == directory
    with contextlib.suppress(shards.ShardFormatError, OSError):  # a shard may be missing
        shards.verify(directory, manifest)


def test_reading_stops_at_the_size_limit(workdir) -> None:
    path = workdir / "big.ldpr"
    path.write_bytes(shards.HEADER + varint(shards.MAX_RECORD_BYTES + 1) + struct.pack("<I", 0))
    with pytest.raises(shards.ShardFormatError, match="too large"):
        list(shards.read_shard(path))
