"""Coverage-guided fuzzing (atheris, libFuzzer) of everything the aggregator does with untrusted
bytes: protobuf decoding of an upload, report validation (``validate`` and ``validate_batch``),
mechanism ``decode`` with arbitrary parameters, and the shard file reader.

Expected outcomes are only the documented typed errors: ``DecodeError`` from protobuf,
``ReportRejectedError`` with INVALID_ARGUMENT / NOT_FOUND / OUT_OF_RANGE, ``ValueError`` or
``ReportRangeError`` from a mechanism's decode, ``ShardFormatError`` from the shard reader. Anything
else is a finding: another exception, ``validate`` and ``validate_batch`` disagreeing, an accepted
contribution outside the mechanism's range, or an accepted payload that does not re-encode to the
same bytes. libFuzzer then stops and writes the input to ``crash-<sha1>``; commit it to
tests/fuzz_corpus/ (tests/scripts/test_fuzz_ingest_script.py replays every file there).

The first input byte picks the target (0: upload, 1: shard file, 2: mechanism decode); the rest is
the target's input, so the seeds are plain serialized requests and shards.

Usage (``pip install -e '.[aggregator,fuzz]'``; the first directory collects new inputs, keep
it scratch)::

    python scripts/fuzz_ingest.py /tmp/corpus tests/fuzz_corpus -max_total_time=600  # nightly
    python scripts/fuzz_ingest.py -runs=2000 /tmp/corpus tests/fuzz_corpus           # smoke
    python scripts/fuzz_ingest.py crash-1234abcd                                      # reproduce
    python scripts/fuzz_ingest.py --write-seeds tests/fuzz_corpus                    # seeds
"""

from __future__ import annotations

import inspect
import struct
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FunctionType

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from aggregator.service.status import status_of
from aggregator.store import ingest, shards
from aggregator.store.checks import Rejection, ReportRejectedError
from client.mechanisms import (
    FlipComponents,
    GaussianNoise,
    LaplaceNoise,
    Mechanism,
    RandomizedResponse,
)
from client.survey import Attribute, GroupLabel, QuestionSpec, SurveySpec, build_question
from protos.ldp.v1 import ldp_pb2

REJECTION_CODES = {  # docs/wire.md §8.2
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.FAILED_PRECONDITION,  # another definition digest, a side that does not fit
}
UPLOAD, SHARD, DECODE = 0, 1, 2
PROJECT_PACKAGES = ("aggregator", "client", "protos")
_WRAPPED = ("__func__", "fget", "func")  # static/class methods, properties, cached properties


def _attribute(name: str, size: int) -> tuple[Attribute, ...]:
    return (Attribute(name, tuple(f"c{i}" for i in range(size))),)


def fuzz_surveys() -> dict[str, SurveySpec]:
    """Every mechanism, with the payload edge cases: k = 2, padding bits (k = 5, 9), no padding
    (k = 8), the coarsest and finest additive grids."""
    questions = (
        build_question("rr", "", _attribute("rr", 4), "randomized_response", 1.0),
        build_question("rr2", "", _attribute("rr2", 2), "randomized_response", 0.5),
        build_question("fc5", "", _attribute("fc5", 5), "flip_components", 1.0),
        build_question("fc8", "", _attribute("fc8", 8), "flip_components", 2.0),
        build_question("fc9", "", _attribute("fc9", 9), "flip_components", 4.0),
        build_question("gauss", "", _attribute("gauss", 3), "gaussian", 0.5),
        build_question("gauss0", "", _attribute("gauss0", 2), "gaussian", 2.0, 0),
        build_question("lap", "", _attribute("lap", 4), "laplace", 1.0),
        build_question("lap20", "", _attribute("lap20", 2), "laplace", 0.1, 20),
    )
    grouped = (build_question("rr", "", _attribute("rr", 3), "randomized_response", 1.0),)
    label = GroupLabel("arm", ("a", "b"))  # every report of g1 must carry "a" or "b"
    return {
        "s1": SurveySpec("s1", "fuzz", questions, 1),
        "g1": SurveySpec("g1", "fuzz, public groups", grouped, 1, group_label=label),
    }


SURVEYS = fuzz_surveys()


def check_contribution(mech: Mechanism, contribution: np.ndarray) -> None:
    """An accepted contribution is an int64 vector of length k inside the mechanism's range."""
    assert contribution.dtype == np.int64 and contribution.shape == (mech.k,), contribution
    if isinstance(mech, RandomizedResponse):
        assert contribution.min() >= 0 and contribution.sum() == 1, contribution
    elif isinstance(mech, FlipComponents):
        assert contribution.min() >= 0 and contribution.max() <= 1, contribution
    else:
        limit = mech.accepted_bound
        assert np.abs(contribution).max() <= limit, contribution


def _first_reuse(reports) -> int | None:
    """The first report whose id an earlier report has with other content, if any."""
    first: dict[bytes, tuple[str, str, bytes]] = {}
    for i, report in enumerate(reports):
        content = (report.survey_id, report.question_id, report.payload)
        if first.setdefault(report.report_id, content) != content:
            return i
    return None


def check_upload(data: bytes) -> None:
    """Decode an UploadRequest; validate and validate_batch must agree and stay in range."""
    try:
        reports = ldp_pb2.UploadRequest.FromString(data).reports
    except DecodeError:
        return
    singles: list[ingest.StoredReport | ReportRejectedError] = []
    for report in reports:
        try:
            stored = ingest.validate(report, SURVEYS)
        except ReportRejectedError as exc:
            assert status_of(exc.reason) in REJECTION_CODES, exc.reason
            singles.append(exc)
            continue
        question = SURVEYS[stored.survey_id].question(stored.question_id)
        check_contribution(question.mechanism, stored.contribution)
        singles.append(stored)
    bad = [i for i, s in enumerate(singles) if isinstance(s, ReportRejectedError)]
    reused = _first_reuse(reports)
    try:
        batch = ingest.validate_batch(reports, SURVEYS)
    except ReportRejectedError as exc:
        if not bad and reused is not None:  # an id reused for other content: docs/wire.md §6
            assert exc.reason is Rejection.REUSED_ID, exc.reason
            assert exc.message.startswith(f"report[{reused}]: "), exc.message
            return
        assert bad, f"validate_batch rejected a valid batch: {exc}"
        assert exc.reason == singles[bad[0]].reason, (exc.reason, singles[bad[0]])  # type: ignore[union-attr]
        assert exc.message.startswith(f"report[{bad[0]}]: "), exc.message
        return
    assert not bad, f"validate_batch accepted report[{bad[0]}]"
    assert reused is None, f"validate_batch accepted report[{reused}], which reuses an id"
    for single, stored in zip(singles, batch, strict=True):
        assert np.array_equal(single.contribution, stored.contribution)  # type: ignore[union-attr]
        assert stored.contribution.dtype == np.int64


def check_shard(data: bytes, path: Path) -> None:
    """Read a shard file; every record that comes out meets the upload validation."""
    path.write_bytes(shards.HEADER + data)
    try:
        reports = list(shards.read_shard(path))
    except shards.ShardFormatError:
        return
    for report in reports:
        try:
            ingest.validate(report, SURVEYS)
        except ReportRejectedError as exc:
            assert status_of(exc.reason) in REJECTION_CODES, exc.reason


def mechanism_from(header: bytes) -> Mechanism:
    """A mechanism with parameters taken from 8 input bytes (kind, k, parameter, grid)."""
    kind, k, exponent, mantissa, bits = struct.unpack("<BBhHH", header)
    parameter = (1 + mantissa / 65536) * 2.0 ** (exponent % 60 - 30)  # 2**-30 .. 2**30
    k = 2 + k % 40
    grid = bits % 21
    return [
        lambda: RandomizedResponse(k, parameter),
        lambda: FlipComponents(k, parameter),
        lambda: GaussianNoise(k, parameter, granularity_bits=grid),
        lambda: LaplaceNoise(k, parameter, granularity_bits=grid),
    ][kind % 4]()


def check_decode(data: bytes) -> None:
    """Decode a payload under arbitrary parameters: a typed error, or an in-range report whose
    encoding is the payload itself and which the service accepts unless it is outside the
    (narrower) accepted range of additive noise."""
    if len(data) < 8:
        return
    mech, payload = mechanism_from(data[:8]), data[8:]
    try:
        report = mech.decode(payload)
    except ValueError:  # ReportRangeError is a ValueError too
        return
    assert mech.encode(report) == payload, "accepted payload is not canonical"
    question = QuestionSpec("q", "", _attribute("q", 2), mech)
    try:
        contribution = ingest.contribution(question, payload)
    except ReportRejectedError as exc:  # decodable, but outside the range the service accepts
        limit = mech.accepted_bound
        assert exc.reason is Rejection.OUT_OF_RANGE, exc
        assert np.abs(np.asarray(report)).max() > limit, "rejected inside the accepted range"
        return
    check_contribution(mech, contribution)


def check_input(data: bytes, scratch: Path) -> None:
    """One fuzz input: the first byte picks the target."""
    if not data:
        return
    target, rest = data[0] % 3, data[1:]
    if target == UPLOAD:
        check_upload(rest)
    elif target == SHARD:
        check_shard(rest, scratch / "input.ldpr")
    else:
        check_decode(rest)


def edge_payload(question: QuestionSpec) -> bytes:
    """A valid payload on the edge of the range (last category, all bits set, grid values at
    +-limit): one small mutation away from invalid, where off-by-one bugs show. Range checks run
    in numpy, invisible to libFuzzer's comparison tracing, so the seeds must bring the edges."""
    mech, k = question.mechanism, question.k
    if isinstance(mech, RandomizedResponse):
        return mech.encode(k - 1)
    if isinstance(mech, FlipComponents):
        return mech.encode(np.ones(k, dtype=np.uint8))
    limit = mech.accepted_bound
    grid = np.zeros(k, dtype=np.int64)
    grid[0], grid[-1] = limit, -limit
    return mech.encode(grid)


def _seed_id(i: int) -> bytes:
    """Distinct report ids within a seed request (one id for other content is refused)."""
    return bytes([i]) + bytes(range(1, 16))


def seeds() -> dict[str, bytes]:
    """Valid inputs for every target: one upload per question, one of edge values, a shard,
    decode inputs."""
    rng = np.random.default_rng(4)
    out: dict[str, bytes] = {}
    reports = []
    for i, question in enumerate(SURVEYS["s1"].questions):
        mech = question.mechanism
        payload = mech.encode(mech.simulate(np.array([1]), rng)[0])
        report = ldp_pb2.Report(
            report_id=_seed_id(i), survey_id="s1", question_id=question.id, payload=payload
        )
        reports.append(report)
        request = ldp_pb2.UploadRequest(reports=[report]).SerializeToString()
        out[f"upload-{question.id}"] = bytes([UPLOAD]) + request
    out["upload-all"] = bytes([UPLOAD]) + ldp_pb2.UploadRequest(reports=reports).SerializeToString()
    edges = [
        ldp_pb2.Report(
            report_id=_seed_id(i), survey_id="s1", question_id=q.id, payload=edge_payload(q)
        )
        for i, q in enumerate(SURVEYS["s1"].questions)
    ]
    out["upload-edges"] = bytes([UPLOAD]) + ldp_pb2.UploadRequest(reports=edges).SerializeToString()
    grouped = [
        ldp_pb2.Report(
            report_id=_seed_id(i), survey_id="g1", question_id="rr", payload=payload, group=group
        )
        for i, (group, payload) in enumerate((("a", b"\2\0\0\0"), ("b", b"\0\0\0\0")))
    ]
    out["upload-grouped"] = (
        bytes([UPLOAD]) + ldp_pb2.UploadRequest(reports=grouped).SerializeToString()
    )
    records = b"".join(
        shards._varint(len(r.SerializeToString())) + r.SerializeToString() for r in reports
    )
    out["shard-all"] = bytes([SHARD]) + records
    out["decode-rr"] = bytes([DECODE]) + struct.pack("<BBhHH", 0, 2, 30, 0, 0) + b"\1\0\0\0"
    out["decode-fc"] = bytes([DECODE]) + struct.pack("<BBhHH", 1, 7, 31, 0, 0) + b"\x15\x01"
    out["decode-laplace"] = bytes([DECODE]) + struct.pack("<BBhHH", 3, 0, 30, 0, 10) + bytes(16)
    return out


def project_functions() -> Iterator[FunctionType]:
    """Every function and method defined in this script and the project's packages: what
    coverage guidance should see."""
    for name, module in list(sys.modules.items()):
        if name != __name__ and name.split(".")[0] not in PROJECT_PACKAGES:
            continue
        for value in list(vars(module).values()):
            if getattr(value, "__module__", None) != name:
                continue
            members = list(vars(value).values()) if inspect.isclass(value) else [value]
            for member in members:
                for function in (member, *(getattr(member, a, None) for a in _WRAPPED)):
                    if inspect.isfunction(function):
                        yield function


def main(argv: list[str]) -> None:
    if len(argv) == 3 and argv[1] == "--write-seeds":
        directory = Path(argv[2])
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in seeds().items():
            (directory / name).write_bytes(data)
        print(f"wrote {len(seeds())} seeds to {directory}")
        return
    import atheris  # the [fuzz] extra; imported here so tests can use check_input without it

    scratch = Path(tempfile.mkdtemp(prefix="fuzz-ingest-"))
    for function in project_functions():  # not instrument_all(): numpy and co. take minutes
        atheris.instrument_func(function)
    atheris.Setup(argv, lambda data: check_input(data, scratch))
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
