"""Shared parts of the hostile-input tests: the surveys under attack, an independent reference
validator (the oracle the product's validation must agree with), and Hypothesis strategies for
random and mutated wire reports.

The reference validator is written from the wire contract in protos/ldp/v1/ldp.proto (payload
layouts) and the status-code table of the service conventions, with plain ``struct`` and bit
arithmetic, so it shares no decoding code with ``aggregator.store.ingest`` or the mechanisms.
The only thing it takes from the product is the documented accepted range of additive-noise grid
values (the mechanism's ``accepted_bound``: docs/threat-model.md derives it).
"""

from __future__ import annotations

import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from aggregator.survey_file.config import load_surveys
from client.mechanisms import (
    FlipComponents,
    GaussianNoise,
    LaplaceNoise,
    Mechanism,
    RandomizedResponse,
)
from client.survey import QuestionSpec, SurveySpec
from protos.ldp.v1 import ldp_pb2

#: Every fuzz property runs this many examples in CI, deterministically (same inputs every run).
FUZZ_SETTINGS = settings(
    max_examples=1000,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

#: Questions covering every mechanism and the payload edge cases: padding bits (k = 5, 9), no
#: padding (k = 8), k = 2, a joint question, the coarsest and finest additive grids.
FUZZ_SURVEYS_TOML = """
[[survey]]
id = "s1"
title = "fuzz target"
min_batch_size = 1

[[survey.question]]
id = "rr"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.question]]
id = "rr2"
categories = ["no", "yes"]
mechanism = "randomized_response"
epsilon = 0.5

[[survey.question]]
id = "fc5"
categories = ["a", "b", "c", "d", "e"]
mechanism = "flip_components"
epsilon = 1.0

[[survey.question]]
id = "fc8"
categories = ["a", "b", "c", "d", "e", "f", "g", "h"]
mechanism = "flip_components"
epsilon = 2.0

[[survey.question]]
id = "fc9"
categories = ["a", "b", "c", "d", "e", "f", "g", "h", "i"]
mechanism = "flip_components"
epsilon = 4.0

[[survey.question]]
id = "gauss"
categories = ["a", "b", "c"]
mechanism = "gaussian"
rho = 0.5

[[survey.question]]
id = "gauss0"
categories = ["a", "b"]
mechanism = "gaussian"
rho = 2.0
granularity_bits = 0

[[survey.question]]
id = "lap"
categories = ["a", "b", "c", "d"]
mechanism = "laplace"
epsilon = 1.0

[[survey.question]]
id = "lap20"
categories = ["a", "b"]
mechanism = "laplace"
epsilon = 0.1
granularity_bits = 20

[[survey]]
id = "s2"
title = "second survey"
min_batch_size = 1

[[survey.question]]
id = "joint"
mechanism = "randomized_response"
epsilon = 2.0
attributes = [
    { name = "x", categories = ["x0", "x1"] },
    { name = "y", categories = ["y0", "y1", "y2"] },
]
"""


def write_fuzz_surveys(directory: Path) -> tuple[Path, dict[str, SurveySpec]]:
    """Write the fuzz survey file into ``directory``; return its path and the parsed surveys."""
    path = directory / "fuzz-surveys.toml"
    path.write_text(FUZZ_SURVEYS_TOML)
    return path, load_surveys(path)


def _parse_fuzz_surveys() -> dict[str, SurveySpec]:
    with tempfile.TemporaryDirectory() as directory:
        return write_fuzz_surveys(Path(directory))[1]


#: The parsed fuzz surveys, for strategies built at import time.
FUZZ_SURVEYS = _parse_fuzz_surveys()


# --- the oracle --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What validation must do with one report: reject with ``code``, or accept it with exactly
    this ``contribution`` (int64, length k)."""

    code: grpc.StatusCode | None
    contribution: np.ndarray | None = None

    @property
    def accepted(self) -> bool:
        return self.code is None


def grid_limit(mechanism: GaussianNoise | LaplaceNoise) -> int:
    """Largest grid magnitude an additive-noise report may carry (the accepted range)."""
    return mechanism.accepted_bound


def reference_verdict(report: ldp_pb2.Report, surveys: dict[str, SurveySpec]) -> Verdict:
    """The verdict of the wire contract, checked in the documented order: report id, survey,
    question, the definition digest (a report randomized under another definition may have
    another payload length: the device must fetch the survey again, docs/wire.md §2), the side
    and the group, then the payload."""
    if len(report.report_id) != 16:
        return Verdict(grpc.StatusCode.INVALID_ARGUMENT)
    survey = surveys.get(report.survey_id)
    if survey is None or report.question_id not in {q.id for q in survey.questions}:
        return Verdict(grpc.StatusCode.NOT_FOUND)
    question = survey.question(report.question_id)
    digest = bytes(report.definition_digest)
    if (digest and digest != question.digest) or (not digest and question.household_shared):
        return Verdict(grpc.StatusCode.FAILED_PRECONDITION)
    if report.side != ldp_pb2.SIDE_UNSPECIFIED:  # no fuzzed survey is split (§3.10)
        return Verdict(grpc.StatusCode.FAILED_PRECONDITION)
    if report.group:  # no fuzzed survey has a group label (§3.11)
        return Verdict(grpc.StatusCode.INVALID_ARGUMENT)
    return payload_verdict(question.mechanism, bytes(report.payload))


def decode_limit(mechanism: GaussianNoise | LaplaceNoise) -> int:
    """Largest grid magnitude the device library's ``decode`` takes (wider than accepted)."""
    return mechanism.scale + mechanism.noise_bound


def payload_verdict(mech: Mechanism, payload: bytes, *, decoding: bool = False) -> Verdict:
    """The verdict on one payload: its length, then its values (ldp.proto payload layouts);
    ``decoding``: the device library's decoding range instead of the accepted range."""
    k = mech.k
    if isinstance(mech, RandomizedResponse):
        if len(payload) != 4:
            return Verdict(grpc.StatusCode.INVALID_ARGUMENT)
        (index,) = struct.unpack("<I", payload)
        if index >= k:
            return Verdict(grpc.StatusCode.OUT_OF_RANGE)
        one_hot = np.zeros(k, dtype=np.int64)
        one_hot[index] = 1
        return Verdict(None, one_hot)
    if isinstance(mech, FlipComponents):
        if len(payload) != (k + 7) // 8:
            return Verdict(grpc.StatusCode.INVALID_ARGUMENT)
        bits = [(payload[i // 8] >> (i % 8)) & 1 for i in range(8 * len(payload))]
        if any(bits[k:]):
            return Verdict(grpc.StatusCode.INVALID_ARGUMENT)
        return Verdict(None, np.array(bits[:k], dtype=np.int64))
    assert isinstance(mech, GaussianNoise | LaplaceNoise)
    if len(payload) != 8 * k:
        return Verdict(grpc.StatusCode.INVALID_ARGUMENT)
    values = struct.unpack(f"<{k}q", payload)
    limit = decode_limit(mech) if decoding else grid_limit(mech)
    if any(abs(v) > limit for v in values):
        return Verdict(grpc.StatusCode.OUT_OF_RANGE)
    return Verdict(None, np.array(values, dtype=np.int64))


# --- strategies --------------------------------------------------------------------------------


def _all_questions(surveys: dict[str, SurveySpec]) -> list[tuple[str, QuestionSpec]]:
    return [(s.id, q) for s in surveys.values() for q in s.questions]


def valid_payloads(question: QuestionSpec) -> st.SearchStrategy[bytes]:
    """Payloads a correct device could send for ``question``, with boundary values favoured."""
    mech, k = question.mechanism, question.k
    if isinstance(mech, RandomizedResponse):
        index = st.one_of(st.sampled_from([0, k - 1]), st.integers(0, k - 1))
        return index.map(lambda i: struct.pack("<I", i))
    if isinstance(mech, FlipComponents):
        bits = st.lists(st.integers(0, 1), min_size=k, max_size=k)
        return bits.map(lambda b: np.packbits(np.array(b, np.uint8), bitorder="little").tobytes())
    limit = grid_limit(mech)  # type: ignore[arg-type]
    value = st.one_of(
        st.sampled_from([-limit, limit, 0, mech.scale]),  # type: ignore[attr-defined]
        st.integers(-limit, limit),
    )
    return st.lists(value, min_size=k, max_size=k).map(lambda v: struct.pack(f"<{k}q", *v))


def hostile_payload_values(question: QuestionSpec) -> st.SearchStrategy[bytes]:
    """Well-sized payloads with values just or far outside the valid range."""
    mech, k = question.mechanism, question.k
    if isinstance(mech, RandomizedResponse):
        index = st.one_of(st.sampled_from([k, 2**31, 2**32 - 1]), st.integers(k, 2**32 - 1))
        return index.map(lambda i: struct.pack("<I", i))
    if isinstance(mech, FlipComponents):
        size = (k + 7) // 8
        return st.binary(min_size=size, max_size=size)
    limit = grid_limit(mech)  # type: ignore[arg-type]
    huge = st.one_of(
        st.sampled_from([limit + 1, -limit - 1, 2**63 - 1, -(2**63)]),
        st.integers(-(2**63), 2**63 - 1),
    )
    return st.lists(huge, min_size=k, max_size=k).map(lambda v: struct.pack(f"<{k}q", *v))


@st.composite
def valid_reports(draw, surveys: dict[str, SurveySpec], report_ids=None) -> ldp_pb2.Report:
    """A report a correct device could send (``report_ids``: an optional id strategy)."""
    survey_id, question = draw(st.sampled_from(_all_questions(surveys)))
    ids = report_ids if report_ids is not None else st.binary(min_size=16, max_size=16)
    return ldp_pb2.Report(
        report_id=draw(ids),
        survey_id=survey_id,
        question_id=question.id,
        payload=draw(valid_payloads(question)),
    )


def _flip_bit(payload: bytes, position: int) -> bytes:
    if not payload:
        return payload
    position %= 8 * len(payload)
    out = bytearray(payload)
    out[position // 8] ^= 1 << (position % 8)
    return bytes(out)


@st.composite
def mutated_reports(draw, surveys: dict[str, SurveySpec], report_ids=None) -> ldp_pb2.Report:
    """A valid report with zero to three fields replaced by hostile values: wrong id lengths,
    unknown or unicode survey/question ids, truncated/extended/bit-flipped payloads, huge values."""
    report = draw(valid_reports(surveys, report_ids))
    survey_ids = sorted(surveys)
    question_ids = sorted({q.id for _, q in _all_questions(surveys)})
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(
            st.sampled_from(
                ["id", "survey", "question", "truncate", "extend", "flip", "values", "random"]
            )
        )
        if kind == "id":
            report.report_id = draw(st.binary(max_size=40))
        elif kind == "survey":
            report.survey_id = draw(st.one_of(st.sampled_from(survey_ids), st.text(max_size=70)))
        elif kind == "question":
            report.question_id = draw(
                st.one_of(st.sampled_from(question_ids), st.text(max_size=70))
            )
        elif kind == "truncate":
            report.payload = report.payload[: draw(st.integers(0, max(len(report.payload) - 1, 0)))]
        elif kind == "extend":
            report.payload += draw(st.binary(min_size=1, max_size=16))
        elif kind == "flip":
            report.payload = _flip_bit(report.payload, draw(st.integers(0, 2**16)))
        else:
            survey = surveys.get(report.survey_id)
            if survey is None or report.question_id not in {q.id for q in survey.questions}:
                continue
            question = survey.question(report.question_id)
            if kind == "values":
                report.payload = draw(hostile_payload_values(question))
            else:
                size = question.mechanism.payload_size
                report.payload = draw(st.binary(min_size=size, max_size=size))
    return report


@st.composite
def damaged(draw, wire: st.SearchStrategy[bytes]) -> bytes:
    """Serialized bytes with byte-level damage: truncated, a flipped bit, inserted garbage, or
    left intact."""
    out = bytearray(draw(wire))
    kind = draw(st.sampled_from(["truncate", "flip", "insert", "none"]))
    position = draw(st.integers(0, len(out)))
    if kind == "truncate":
        del out[position:]
    elif kind == "flip" and position < len(out):
        out[position] ^= 1 << draw(st.integers(0, 7))
    elif kind == "insert":
        out[position:position] = draw(st.binary(min_size=1, max_size=8))
    return bytes(out)


def hostile_upload_bytes(surveys: dict[str, SurveySpec]) -> st.SearchStrategy[bytes]:
    """Raw request bytes: random, or a damaged serialized UploadRequest of mutated reports."""
    requests = st.lists(mutated_reports(surveys), min_size=1, max_size=4).map(
        lambda reports: ldp_pb2.UploadRequest(reports=reports).SerializeToString()
    )
    return st.one_of(st.binary(max_size=600), damaged(requests))


def hostile_report_bytes(surveys: dict[str, SurveySpec]) -> st.SearchStrategy[bytes]:
    """Raw report bytes: random, or a damaged serialized mutated Report."""
    reports = mutated_reports(surveys).map(lambda report: report.SerializeToString())
    return st.one_of(st.binary(max_size=300), damaged(reports))
