"""The collection service end to end: a real grpc.aio server on loopback, a real SQLite store,
and the real client library (reporter, ledger, outbox, transport)."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import textwrap
import threading
import time

import grpc
import numpy as np
import pytest
from conftest import ServerThread
from grpc_health.v1 import health_pb2, health_pb2_grpc

from aggregator.histogram import Histogram
from aggregator.stats import estimate, goodness_of_fit
from client.device.ledger import Budget, BudgetExceeded
from client.device.reporter import Reporter
from client.device.transport import Transport, TransportError
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

# Room for pure reports and for Gaussian (zCDP) reports.
MIXED_BUDGET = Budget(20.0, pointwise=5.0)  # rho cap 2.72


def report(survey: str, question: str, payload: bytes, report_id: bytes | None = None):
    return ldp_pb2.Report(
        report_id=report_id or os.urandom(16),
        survey_id=survey,
        question_id=question,
        payload=payload,
    )


def stubs(server: ServerThread):
    """The Collector on the device listener, the Analyst on its own (loopback) listener."""
    analyst = ldp_pb2_grpc.AnalystStub(grpc.insecure_channel(server.analyst_target))
    return ldp_pb2_grpc.CollectorStub(grpc.insecure_channel(server.target)), analyst


@pytest.mark.parametrize(  # the fast tier keeps rr and joint; test_mechanisms covers the others
    "question_id",
    ["rr", *(pytest.param(q, marks=pytest.mark.slow) for q in ("fc", "gauss", "lap")), "joint"],
)
def test_end_to_end_every_mechanism(server, tmp_path, question_id):
    """Devices answer through the real client; the server's statistics equal the histogram of
    exactly the reports the devices produced, and the estimate RPC matches a local estimate."""
    transport = Transport(server.target)
    question = server.surveys["s1"].question(question_id)
    rng = np.random.default_rng(1)
    payloads = []
    for device in range(40):
        reporter = Reporter(transport, tmp_path / f"device{device}.sqlite", MIXED_BUDGET)
        reporter.answer_index("s1", question_id, int(rng.integers(question.k)))
        payloads.append(reporter.outbox.pending()[0].payload)
        result = reporter.flush()
        assert (result.accepted, result.pending, result.error) == (1, 0, "")
        reporter.close()
    mech = question.mechanism
    local = Histogram.from_reports(mech, np.array([mech.decode(p) for p in payloads]))
    _, analyst = stubs(server)
    response = analyst.Estimate(ldp_pb2.EstimateRequest(survey_id="s1", question_id=question_id))
    assert response.n == 40
    assert list(response.labels) == question.labels
    np.testing.assert_allclose(response.frequencies, estimate(local).frequencies, rtol=1e-12)
    np.testing.assert_allclose(response.ci_high, estimate(local).ci_high, rtol=1e-12)


def test_tests_over_rpc(server):
    """GOF and independence RPCs on a populated survey; results well-formed and correct."""
    collector, analyst = stubs(server)
    rng = np.random.default_rng(2)
    question = server.surveys["s1"].question("joint")
    mech = question.mechanism
    truth = rng.choice(6, size=3000, p=[0.3, 0.1, 0.1, 0.05, 0.15, 0.3])  # dependent
    reports = [report("s1", "joint", mech.encode(v)) for v in mech.simulate(truth, rng)]
    collector.Upload(ldp_pb2.UploadRequest(reports=reports))
    result = analyst.Independence(ldp_pb2.IndependenceRequest(survey_id="s1", question_id="joint"))
    assert result.reject and result.pvalue < 1e-6 and result.dof == 2 and result.n == 3000
    gof = analyst.GoodnessOfFit(
        ldp_pb2.GoodnessOfFitRequest(survey_id="s1", question_id="joint", p0=[1 / 6] * 6)
    )
    assert gof.reject and gof.HasField("dof")
    assert gof.calibration == "asymptotic" and not gof.HasField("n_draws")


def test_calibration_over_rpc_matches_the_library(server):
    """A Monte Carlo p-value asked for over the Analyst RPC, with a seed, equals the library's
    on the same histogram; the response says how it was calibrated. A bad calibration name is
    INVALID_ARGUMENT."""
    collector, analyst = stubs(server)
    rng = np.random.default_rng(5)
    question = server.surveys["s1"].question("joint")
    mech = question.mechanism
    truth = rng.choice(6, size=400, p=[1 / 6] * 6)
    values = mech.simulate(truth, rng)
    collector.Upload(
        ldp_pb2.UploadRequest(reports=[report("s1", "joint", mech.encode(v)) for v in values])
    )
    request = ldp_pb2.GoodnessOfFitRequest(
        survey_id="s1", question_id="joint", p0=[1 / 6] * 6, calibration="monte-carlo", seed=7
    )
    remote = analyst.GoodnessOfFit(request)
    local = goodness_of_fit(
        Histogram.from_reports(mech, values), np.full(6, 1 / 6), calibration="monte-carlo", rng=7
    )
    assert remote.calibration == "monte-carlo" and remote.n_draws == local.n_draws > 0
    assert remote.pvalue == local.pvalue and not remote.HasField("dof")
    independence = analyst.Independence(
        ldp_pb2.IndependenceRequest(survey_id="s1", question_id="joint", seed=3)
    )
    assert independence.calibration in ("asymptotic", "monte-carlo")
    assert independence.calibration_reason
    with pytest.raises(grpc.RpcError) as refused:
        analyst.GoodnessOfFit(
            ldp_pb2.GoodnessOfFitRequest(
                survey_id="s1", question_id="joint", p0=[1 / 6] * 6, calibration="exact"
            )
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "calibration" in refused.value.details()


def test_idempotent_upload_counts_exactly(server):
    """10,000 reports each sent 1-5 times in random order: exactly 10,000 accepted, every
    resend a duplicate, and the stored counts equal the counts of the unique reports."""
    collector, _ = stubs(server)
    mech = server.surveys["big"].question("rr64").mechanism
    rng = random.Random(3)
    unique = []
    for _ in range(10_000):
        value = rng.randrange(mech.k)
        unique.append((report("big", "rr64", mech.encode(value)), value))
    sends = [r for r, _ in unique for _ in range(rng.randint(1, 5))]
    rng.shuffle(sends)
    accepted = duplicate = 0
    for start in range(0, len(sends), 700):
        response = collector.Upload(ldp_pb2.UploadRequest(reports=sends[start : start + 700]))
        accepted += sum(r.status == ldp_pb2.ACCEPTED for r in response.results)
        duplicate += sum(r.status == ldp_pb2.DUPLICATE for r in response.results)
    assert accepted == 10_000 and duplicate == len(sends) - 10_000
    n, sums = server_statistics(server, "big", "rr64")
    expected = np.bincount([mech.decode(r.payload) for r, _ in unique], minlength=mech.k)
    assert n == 10_000
    np.testing.assert_array_equal(sums, expected)


def server_statistics(server: ServerThread, survey: str, question: str):
    from aggregator.store.sqlite.report_store import ReportStore

    store = ReportStore(server.db)
    try:
        return store.statistics(survey, question)
    finally:
        store.close()


def test_restart_keeps_every_acknowledged_report(tmp_path, survey_file):
    running = ServerThread(survey_file, tmp_path / "store.sqlite").start()
    collector, _ = stubs(running)
    mech = running.surveys["big"].question("rr64").mechanism
    acked = []
    for _ in range(20):
        batch = [report("big", "rr64", mech.encode(i % mech.k)) for i in range(50)]
        collector.Upload(ldp_pb2.UploadRequest(reports=batch))
        acked += batch
    running.stop()
    running.start()
    try:
        collector, analyst = stubs(running)
        response = collector.Upload(ldp_pb2.UploadRequest(reports=acked[:10]))
        assert all(r.status == ldp_pb2.DUPLICATE for r in response.results)
        estimate_response = analyst.Estimate(
            ldp_pb2.EstimateRequest(survey_id="big", question_id="rr64")
        )
        assert estimate_response.n == len(acked)
    finally:
        running.stop()


def test_killed_client_resends_the_same_report(server, tmp_path):
    """A device process dies after randomizing (outbox written) but before sending; the next
    run sends that exact report and charges nothing new."""
    state = tmp_path / "device.sqlite"
    script = textwrap.dedent(
        f"""
        import os
        from client.device.ledger import Budget
        from client.device.reporter import Reporter
        from client.device.transport import Transport
        reporter = Reporter(Transport({server.target!r}), {str(state)!r}, Budget(5.0))
        report_id = reporter.answer("s1", "rr", "c")
        print(report_id.hex(), flush=True)
        os.kill(os.getpid(), 9)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == -9
    report_id = bytes.fromhex(done.stdout.strip())
    reporter = Reporter(Transport(server.target), state)
    pending = reporter.outbox.pending()
    assert [item.report_id for item in pending] == [report_id]
    spent_before = reporter.ledger.spent()
    result = reporter.flush()
    assert (result.accepted, result.pending) == (1, 0)
    assert reporter.ledger.spent() == spent_before == (1.0, 0.0)
    # Resending it again (e.g. a lost acknowledgement) is a duplicate, counted once.
    collector, _ = stubs(server)
    again = collector.Upload(
        ldp_pb2.UploadRequest(reports=[report("s1", "rr", pending[0].payload, report_id)])
    )
    assert again.results[0].status == ldp_pb2.DUPLICATE
    assert server_statistics(server, "s1", "rr")[0] == 1
    reporter.close()


def test_budget_refuses_before_randomizing(server, tmp_path):
    reporter = Reporter(Transport(server.target), tmp_path / "d.sqlite", Budget(2.5))
    reporter.answer_index("s1", "rr", 0)
    reporter.answer_index("s1", "fc", 1)
    with pytest.raises(BudgetExceeded):
        reporter.answer_index("s1", "lap", 2)
    assert len(reporter.outbox) == 2
    reporter.close()


def test_memoized_answer_replays_without_new_cost(server, tmp_path):
    transport = Transport(server.target)
    reporter = Reporter(transport, tmp_path / "d.sqlite", Budget(1.0), memoize=True)
    first = reporter.answer("s1", "rr", "b")
    reporter.flush()
    second = reporter.answer("s1", "rr", "b")  # same question, same answer: no new charge
    assert second == first and reporter.ledger.spent() == (1.0, 0.0)
    result = reporter.flush()
    assert result.duplicate == 1
    # A changed answer resends the first report too: the first answer stands, nothing is charged
    assert reporter.answer("s1", "rr", "c") == first and reporter.ledger.spent() == (1.0, 0.0)
    reporter.close()


def test_budget_and_outbox_survive_restart(server, tmp_path):
    state = tmp_path / "d.sqlite"
    reporter = Reporter(Transport(server.target), state, Budget(3.0))
    reporter.answer_index("s1", "rr", 1)
    reporter.close()
    reopened = Reporter(Transport(server.target), state)
    assert reopened.ledger.budget.epsilon == 3.0 and reopened.ledger.spent() == (1.0, 0.0)
    assert len(reopened.outbox) == 1
    reopened.close()


# --- status codes (service conventions table) ------------------------------------------------


def upload_code(server, reports) -> grpc.StatusCode:
    collector, _ = stubs(server)
    with pytest.raises(grpc.RpcError) as info:
        collector.Upload(ldp_pb2.UploadRequest(reports=reports), timeout=10)
    return info.value.code()


def rr_payload(value: int) -> bytes:
    return value.to_bytes(4, "little")


def test_status_codes_of_upload(server):
    good = report("s1", "rr", rr_payload(1))
    assert upload_code(server, [report("nope", "rr", rr_payload(1))]) == grpc.StatusCode.NOT_FOUND
    assert upload_code(server, [report("s1", "nope", rr_payload(1))]) == grpc.StatusCode.NOT_FOUND
    assert upload_code(server, [report("s1", "rr", rr_payload(4))]) == grpc.StatusCode.OUT_OF_RANGE
    bad_id = report("s1", "rr", rr_payload(1), b"short")
    assert upload_code(server, [bad_id]) == grpc.StatusCode.INVALID_ARGUMENT
    assert upload_code(server, [report("s1", "rr", b"\x01")]) == grpc.StatusCode.INVALID_ARGUMENT
    assert upload_code(server, []) == grpc.StatusCode.INVALID_ARGUMENT
    huge = [report("s1", "gauss", b"\x00" * 2_000_000) for _ in range(3)]
    assert upload_code(server, huge) == grpc.StatusCode.RESOURCE_EXHAUSTED
    many = [report("s1", "rr", rr_payload(0)) for _ in range(10_001)]
    assert upload_code(server, many) == grpc.StatusCode.RESOURCE_EXHAUSTED
    # All-or-nothing: the good report of a rejected batch was not stored.
    assert upload_code(server, [good, report("s1", "rr", rr_payload(9))]) == (
        grpc.StatusCode.OUT_OF_RANGE
    )
    collector, _ = stubs(server)
    assert collector.Upload(ldp_pb2.UploadRequest(reports=[good])).results[0].status == (
        ldp_pb2.ACCEPTED
    )
    assert collector.Upload(ldp_pb2.UploadRequest(reports=[good])).results[0].status == (
        ldp_pb2.DUPLICATE
    )


def test_out_of_range_additive_report(server):
    mech = server.surveys["s1"].question("gauss").mechanism
    grid = np.zeros(4, dtype=np.int64)
    grid[0] = mech.accepted_bound + 1
    code = upload_code(server, [report("s1", "gauss", mech.encode(grid))])
    assert code == grpc.StatusCode.OUT_OF_RANGE


def test_status_codes_of_analysis(server):
    collector, analyst = stubs(server)
    request = ldp_pb2.EstimateRequest(survey_id="s1", question_id="rr")
    with pytest.raises(grpc.RpcError) as info:
        analyst.Estimate(request)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # below min batch (5)
    collector.Upload(
        ldp_pb2.UploadRequest(reports=[report("s1", "rr", rr_payload(i % 4)) for i in range(8)])
    )
    assert analyst.Estimate(request).n == 8
    cases = [
        (
            analyst.Estimate,
            ldp_pb2.EstimateRequest(survey_id="zz", question_id="rr"),
            grpc.StatusCode.NOT_FOUND,
        ),
        (
            analyst.GoodnessOfFit,
            ldp_pb2.GoodnessOfFitRequest(survey_id="s1", question_id="rr", p0=[0.5, 0.5]),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            analyst.GoodnessOfFit,
            ldp_pb2.GoodnessOfFitRequest(
                survey_id="s1", question_id="rr", p0=[0.25] * 4, method="bogus"
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            analyst.Independence,
            ldp_pb2.IndependenceRequest(survey_id="s1", question_id="rr"),
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
        (collector.GetSurvey, ldp_pb2.GetSurveyRequest(survey_id="zz"), grpc.StatusCode.NOT_FOUND),
    ]
    for method, message, code in cases:
        with pytest.raises(grpc.RpcError) as info:
            method(message)
        assert info.value.code() == code, message


def test_deadline_exceeded_is_reported():
    """A peer that accepts the connection but never answers: the client's deadline ends the
    call, and DEADLINE_EXCEEDED is not retried."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        transport = Transport(f"127.0.0.1:{port}", timeout=0.3, max_attempts=3)
        with pytest.raises(TransportError) as info:
            transport.get_survey("s1")
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_stream_upload_rejects_individually(server):
    collector, _ = stubs(server)
    good = [report("s1", "rr", rr_payload(i % 4)) for i in range(5)]
    bad = report("s1", "rr", rr_payload(7))
    messages = [
        ldp_pb2.UploadRequest(reports=good[:3]),
        ldp_pb2.UploadRequest(reports=[bad, good[3]]),
        ldp_pb2.UploadRequest(reports=[good[4], good[0]]),
    ]
    response = collector.UploadStream(iter(messages))
    statuses = [r.status for r in response.results]
    assert statuses == [ldp_pb2.ACCEPTED] * 3 + [ldp_pb2.REJECTED] + [ldp_pb2.ACCEPTED] * 2 + [
        ldp_pb2.DUPLICATE
    ]
    assert response.results[3].code == "OUT_OF_RANGE"
    assert server_statistics(server, "s1", "rr")[0] == 5


def test_health_and_graceful_shutdown(tmp_path, survey_file):
    running = ServerThread(survey_file, tmp_path / "g.sqlite").start()
    channel = grpc.insecure_channel(running.target)
    health = health_pb2_grpc.HealthStub(channel)
    for name in ("", "ldp.v1.Collector"):
        status = health.Check(health_pb2.HealthCheckRequest(service=name)).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    analyst_health = health_pb2_grpc.HealthStub(grpc.insecure_channel(running.analyst_target))
    for name in ("", "ldp.v1.Analyst"):
        status = analyst_health.Check(health_pb2.HealthCheckRequest(service=name)).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    collector = ldp_pb2_grpc.CollectorStub(channel)
    mech = running.surveys["big"].question("rr64").mechanism
    acked: list[bytes] = []
    errors: list[grpc.StatusCode] = []

    def upload_loop() -> None:
        for _ in range(200):
            batch = [report("big", "rr64", mech.encode(1)) for _ in range(100)]
            try:
                collector.Upload(ldp_pb2.UploadRequest(reports=batch), timeout=10)
            except grpc.RpcError as exc:
                errors.append(exc.code())
                return
            acked.extend(r.report_id for r in batch)

    threads = [threading.Thread(target=upload_loop) for _ in range(4)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while len(acked) < 2000 and any(t.is_alive() for t in threads):
        assert time.monotonic() < deadline, "uploads did not progress"
        time.sleep(0.005)
    running.stop(grace=5.0)
    for thread in threads:
        thread.join()
    # A call cut off by the shutdown fails as UNAVAILABLE or, in a race inside grpc, CANCELLED;
    # the client library treats both as "try again later" (resends are idempotent).
    assert set(errors) <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
    n, _ = server_statistics(running, "big", "rr64")
    # Every acknowledged report was committed; at most the cut-off batches were stored unacked.
    assert len(acked) <= n <= len(acked) + 100 * len(errors)


def test_client_retries_until_the_server_comes_up(tmp_path, survey_file):
    running = ServerThread(survey_file, tmp_path / "late.sqlite")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    transport = Transport(f"127.0.0.1:{port}", max_attempts=8, initial_backoff=0.2, max_backoff=1)
    timer = threading.Timer(0.5, running.start, kwargs={"port": port})
    timer.start()
    try:
        survey = transport.get_survey("s1")
        assert survey.id == "s1"
    finally:
        timer.join()
        running.stop()
