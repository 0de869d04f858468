"""Optimized unary encoding and Hadamard response end to end: devices answer through the real
client over gRPC on loopback into a real SQLite store; bad payloads get their specific status;
the Analyst RPCs equal the library on the devices' own reports; the Beam job over exported
shards counts exactly what the store counted."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import ServerThread

from aggregator.histogram import Histogram
from aggregator.service.status import status_of
from aggregator.stats import estimate, goodness_of_fit
from aggregator.store import checks, ingest, shards
from aggregator.store.sqlite.report_store import ReportStore
from aggregator.survey_file.config import load_surveys
from client.device.ledger import Budget
from client.device.reporter import Reporter
from client.device.transport import Transport
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

SURVEYS = """
[[survey]]
id = "big"
title = "large domains"
min_batch_size = 5

[[survey.question]]
id = "oue"
categories = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]
mechanism = "optimized_unary"
epsilon = 1.0

[[survey.question]]
id = "hr"
categories = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]
mechanism = "hadamard_response"
epsilon = 1.0

[[survey.question]]
id = "ss"
categories = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]
mechanism = "subset_selection"
epsilon = 1.0

[[survey.question]]
id = "olh"
categories = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]
mechanism = "local_hashing"
epsilon = 1.0
"""
QUESTIONS = ("oue", "hr", "ss", "olh")


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "surveys.toml"
    path.write_text(SURVEYS)
    return path


@pytest.fixture
def server(tmp_path: Path, config: Path):
    running = ServerThread(config, tmp_path / "reports.sqlite").start()
    yield running
    running.stop()


def wire(question: str, payload: bytes) -> ldp_pb2.Report:
    return ldp_pb2.Report(
        report_id=os.urandom(16), survey_id="big", question_id=question, payload=payload
    )


@pytest.mark.parametrize("question_id", QUESTIONS)
def test_devices_to_estimate_and_test(server, tmp_path, question_id: str) -> None:
    question = server.surveys["big"].question(question_id)
    mech = question.mechanism
    rng = np.random.default_rng(1)
    payloads = []
    with Transport(server.target) as transport:
        for device in range(30):
            reporter = Reporter(transport, tmp_path / f"d{device}.sqlite", Budget(5.0))
            reporter.answer_index("big", question_id, int(rng.integers(question.k)))
            payloads.append(reporter.outbox.pending()[0].payload)
            assert reporter.flush().accepted == 1
            reporter.close()
    local = Histogram.from_reports(mech, np.array([mech.decode(p) for p in payloads]))
    channel = grpc.insecure_channel(server.analyst_target)
    analyst = ldp_pb2_grpc.AnalystStub(channel)
    response = analyst.Estimate(ldp_pb2.EstimateRequest(survey_id="big", question_id=question_id))
    assert response.n == 30
    np.testing.assert_allclose(response.frequencies, estimate(local).frequencies, rtol=1e-12)
    np.testing.assert_allclose(response.ci_low, estimate(local).ci_low, rtol=1e-12, atol=1e-15)
    p0 = [0.1] * 10
    remote = analyst.GoodnessOfFit(
        ldp_pb2.GoodnessOfFitRequest(
            survey_id="big", question_id=question_id, p0=p0, calibration="monte-carlo", seed=3
        )
    )
    mine = goodness_of_fit(local, np.array(p0), calibration="monte-carlo", rng=3)
    assert remote.pvalue == mine.pvalue and remote.statistic == pytest.approx(mine.statistic)


@pytest.mark.parametrize(
    "question_id, payload, code",
    [
        ("oue", b"\x00", grpc.StatusCode.INVALID_ARGUMENT),  # 1 byte, not 2
        ("oue", b"\x00\x04", grpc.StatusCode.INVALID_ARGUMENT),  # padding bit 10 set
        ("hr", (16).to_bytes(4, "little"), grpc.StatusCode.OUT_OF_RANGE),  # K = 16 columns
        ("hr", b"\x00\x00", grpc.StatusCode.INVALID_ARGUMENT),
        ("ss", b"\x03\x00", grpc.StatusCode.OUT_OF_RANGE),  # 2 categories, not d = 3
        ("ss", b"\x03\x04", grpc.StatusCode.INVALID_ARGUMENT),  # padding bit 10 set
        ("olh", bytes(8) + (4).to_bytes(4, "little"), grpc.StatusCode.OUT_OF_RANGE),  # g = 4
        ("olh", bytes(11), grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_bad_payloads_get_their_status(server, question_id, payload, code) -> None:
    collector = ldp_pb2_grpc.CollectorStub(grpc.insecure_channel(server.target))
    with pytest.raises(grpc.RpcError) as info:
        collector.Upload(ldp_pb2.UploadRequest(reports=[wire(question_id, payload)]), timeout=10)
    assert info.value.code() == code
    good = {"oue": bytes(2), "hr": (15).to_bytes(4, "little"), "ss": b"\x07\x00", "olh": bytes(12)}
    one = wire(question_id, good[question_id])
    assert collector.Upload(ldp_pb2.UploadRequest(reports=[one])).results[0].status == (
        ldp_pb2.ACCEPTED
    )


@pytest.mark.slow
def test_an_upload_too_large_to_expand_is_refused(tmp_path: Path) -> None:
    """A k = 65,535 Hadamard question: 4-byte payloads, but each report expands to k counts, so
    one upload may carry at most MAX_SUPPORT_CELLS / k of them (RESOURCE_EXHAUSTED beyond)."""
    config = tmp_path / "wide.toml"
    labels = ", ".join(f'"c{j}"' for j in range(2**16 - 1))
    config.write_text(
        f'[[survey]]\nid = "wide"\ntitle = "t"\n\n[[survey.question]]\nid = "hr"\n'
        f'categories = [{labels}]\nmechanism = "hadamard_response"\nepsilon = 1.0\n'
    )
    surveys = load_surveys(config)
    allowed = ingest.MAX_SUPPORT_CELLS // (2**16 - 1)
    messages = [
        ldp_pb2.Report(
            report_id=os.urandom(16), survey_id="wide", question_id="hr", payload=bytes(4)
        )
        for _ in range(allowed + 1)
    ]
    assert allowed == 512 and len(ingest.validate_batch(messages[:2], surveys)) == 2
    with pytest.raises(checks.ReportRejectedError) as refused:
        ingest.validate_batch(messages, surveys)
    assert status_of(refused.value.reason) == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.slow
def test_store_shards_and_beam_job_agree(tmp_path: Path, config: Path) -> None:
    pytest.importorskip("apache_beam", reason="needs the [beam] extra")
    from aggregator.jobs import inputs, pipeline
    from aggregator.jobs.results import Analysis

    surveys = load_surveys(config)
    rng = np.random.default_rng(2)
    messages = []
    for question_id in QUESTIONS:
        mech = surveys["big"].question(question_id).mechanism
        for report in mech.simulate(rng.integers(0, mech.k, size=600), rng):
            messages.append(wire(question_id, mech.encode(report)))
    db = tmp_path / "store.sqlite"
    with ReportStore(db) as store:
        for question in surveys["big"].questions:
            store.register_question("big", question.id, question.k)
        store.put(ingest.validate_batch(messages, surveys))
        expected = {q: store.statistics("big", q) for q in QUESTIONS}
        shards.export_survey(store, surveys["big"], tmp_path / "shards", 3)
    for question_id in QUESTIONS:
        mech = surveys["big"].question(question_id).mechanism
        payloads = [m.payload for m in messages if m.question_id == question_id]
        direct = mech.aggregate(np.array([mech.decode(p) for p in payloads]))
        assert expected[question_id][0] == 600
        np.testing.assert_array_equal(expected[question_id][1], direct)
    found = inputs.resolve([str(tmp_path / "shards")], surveys)
    spec = pipeline.JobSpec(surveys, found.shards, str(tmp_path / "out.json"), Analysis(seed=1), 0)
    document = pipeline.run(spec, ["--runner=DirectRunner"])
    results = {r["question"]: r for r in document["results"]}
    for question_id in QUESTIONS:
        assert results[question_id]["n"] == 600
        assert results[question_id]["sums"] == expected[question_id][1].tolist()
