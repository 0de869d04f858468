"""The bulk upload path: the hand-written UploadResponse encoding equals protobuf's, and a request
mixing questions, new reports and resends gets its statuses in request order and exact counts."""

from __future__ import annotations

import os
import random

import grpc

from aggregator.service.collector.answers import encode_upload_response
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc


def test_encoding_equals_protobuf():
    rng = random.Random(5)
    for count in (0, 1, 7, 1000):
        ids = [os.urandom(16) for _ in range(count)]
        fresh = [rng.random() < 0.7 for _ in range(count)]
        expected = ldp_pb2.UploadResponse(
            results=[
                ldp_pb2.ReportResult(
                    report_id=i, status=ldp_pb2.ACCEPTED if new else ldp_pb2.DUPLICATE
                )
                for i, new in zip(ids, fresh, strict=True)
            ]
        )
        encoded = encode_upload_response(ids, fresh)
        assert encoded == expected.SerializeToString()
        assert ldp_pb2.UploadResponse.FromString(encoded) == expected


def test_mixed_questions_and_resends_in_request_order(server):
    channel = grpc.insecure_channel(server.target)
    collector = ldp_pb2_grpc.CollectorStub(channel)
    analyst = ldp_pb2_grpc.AnalystStub(grpc.insecure_channel(server.analyst_target))
    rr = server.surveys["s1"].question("rr").mechanism
    rr64 = server.surveys["big"].question("rr64").mechanism

    def report(survey: str, question: str, payload: bytes) -> ldp_pb2.Report:
        return ldp_pb2.Report(
            report_id=os.urandom(16), survey_id=survey, question_id=question, payload=payload
        )

    earlier = [report("big", "rr64", rr64.encode(3)) for _ in range(3)]
    collector.Upload(ldp_pb2.UploadRequest(reports=earlier))
    rng = random.Random(11)
    mixed, expected = [], []
    for i in range(60):
        choice = rng.random()
        if choice < 0.4:
            mixed.append(report("s1", "rr", rr.encode(i % 4)))
            expected.append(ldp_pb2.ACCEPTED)
        elif choice < 0.8:
            mixed.append(report("big", "rr64", rr64.encode(i % 8)))
            expected.append(ldp_pb2.ACCEPTED)
        elif choice < 0.9:
            mixed.append(rng.choice(earlier))  # stored by an earlier upload
            expected.append(ldp_pb2.DUPLICATE)
        elif mixed:
            mixed.append(rng.choice(mixed))  # repeated within this request
            expected.append(ldp_pb2.DUPLICATE)
    response = collector.Upload(ldp_pb2.UploadRequest(reports=mixed))
    assert [r.report_id for r in response.results] == [r.report_id for r in mixed]
    assert [r.status for r in response.results] == expected
    fresh = {r.report_id: r for r, s in zip(mixed, expected, strict=True) if s == ldp_pb2.ACCEPTED}
    for survey, question, extra in (("s1", "rr", 0), ("big", "rr64", len(earlier))):
        request = ldp_pb2.EstimateRequest(survey_id=survey, question_id=question)
        n = analyst.Estimate(request).n
        assert n == extra + sum(r.question_id == question for r in fresh.values())
