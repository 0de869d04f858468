"""Bulk validation equals report-by-report validation, and names the first bad report."""

from __future__ import annotations

import os

import grpc
import numpy as np
import pytest

from aggregator.service.status import status_of
from aggregator.store import checks, ingest
from aggregator.survey_file.config import load_surveys
from protos.ldp.v1 import ldp_pb2


@pytest.fixture
def surveys(survey_file):
    return load_surveys(survey_file)


def mixed_reports(surveys, count=400):
    rng = np.random.default_rng(8)
    questions = surveys["s1"].questions
    out = []
    for _ in range(count):
        question = questions[int(rng.integers(len(questions)))]
        mech = question.mechanism
        payload = mech.encode(mech.simulate(np.array([rng.integers(mech.k)]), rng)[0])
        out.append(
            ldp_pb2.Report(
                report_id=os.urandom(16), survey_id="s1", question_id=question.id, payload=payload
            )
        )
    return out


def test_bulk_equals_one_by_one(surveys):
    reports = mixed_reports(surveys)
    bulk = ingest.validate_batch(reports, surveys)
    single = [ingest.validate(r, surveys) for r in reports]
    for a, b in zip(bulk, single, strict=True):
        assert (a.report_id, a.question_id, a.payload) == (b.report_id, b.question_id, b.payload)
        np.testing.assert_array_equal(a.contribution, b.contribution)
        assert a.contribution.dtype == np.int64


@pytest.mark.parametrize(
    ("corrupt", "code"),
    [
        (lambda r: setattr(r, "payload", (9).to_bytes(4, "little")), "OUT_OF_RANGE"),
        (lambda r: setattr(r, "report_id", b"x"), "INVALID_ARGUMENT"),
        (lambda r: setattr(r, "payload", r.payload + b"\0"), "INVALID_ARGUMENT"),
        (lambda r: setattr(r, "question_id", "nope"), "NOT_FOUND"),
    ],
)
def test_first_bad_report_is_named(surveys, corrupt, code):
    reports = mixed_reports(surveys, 50)
    victims = [i for i, r in enumerate(reports) if r.question_id == "rr"]
    for i in victims[1:3]:
        corrupt(reports[i])
    with pytest.raises(checks.ReportRejectedError) as info:
        ingest.validate_batch(reports, surveys)
    assert status_of(info.value.reason) == getattr(grpc.StatusCode, code)
    assert info.value.message.startswith(f"report[{victims[1]}]:")
