"""Exactly-once delivery through a network that loses acknowledgements, resets connections
mid-request and delays requests (tests/faultproxy.py, between the real client transport and a
real server).

The reports carry payloads chosen by the test (the Janus oracle): one-hot flip-components vectors
and fixed randomized-response categories, so each category's count is a number known in advance
and a single lost or double-counted report changes it. A randomizer would hide such an error in
its noise.
"""

from __future__ import annotations

import os
import random
import time

import numpy as np
import pytest
import storecheck
from faultproxy import FaultPlan, FaultProxy

from client.device.ledger import Budget
from client.device.reporter import Reporter
from client.device.transport import Transport, TransportError
from protos.ldp.v1 import ldp_pb2

# Distinct per-category counts, so that no loss can be hidden by a double count elsewhere.
KNOWN_COUNTS = {
    ("s1", "fc"): [500, 800, 1100, 1200, 1400],
    ("big", "rr64"): [100, 300, 400, 500, 700, 800, 1000, 1200],
}
PLAN = FaultPlan(drop_ack=0.15, reset=0.10, delay=0.20, delay_seconds=(0.005, 0.05))
SENDS_PER_CALL = 100


def known_reports(surveys, rng: random.Random) -> list[ldp_pb2.Report]:
    """One report per unit of KNOWN_COUNTS, with the payload that counts exactly that category."""
    reports = []
    for (survey_id, question_id), counts in KNOWN_COUNTS.items():
        mech = surveys[survey_id].question(question_id).mechanism
        for category, count in enumerate(counts):
            if question_id == "fc":
                payload = mech.encode(np.eye(mech.k, dtype=np.uint8)[category])
            else:
                payload = mech.encode(category)
            reports += [
                ldp_pb2.Report(
                    report_id=rng.randbytes(16),
                    survey_id=survey_id,
                    question_id=question_id,
                    payload=payload,
                )
                for _ in range(count)
            ]
    return reports


@pytest.fixture
def proxy(server):
    running = FaultProxy(server.target, PLAN, seed=4).start()
    yield running
    running.stop()


@pytest.mark.slow
def test_lost_acks_and_resets_still_count_exactly_once(server, proxy):
    rng = random.Random(5)
    unique = known_reports(server.surveys, rng)
    assert len(unique) == 10_000 and len({r.report_id for r in unique}) == 10_000
    sends = [r for r in unique for _ in range(rng.randint(1, 5))]
    rng.shuffle(sends)
    transport = Transport(
        proxy.target, timeout=10.0, max_attempts=50, initial_backoff=0.005, max_backoff=0.05
    )
    answers: dict[bytes, list[int]] = {}
    started = time.monotonic()
    try:
        for start in range(0, len(sends), SENDS_PER_CALL):
            for result in transport.upload(sends[start : start + SENDS_PER_CALL]):
                answers.setdefault(result.report_id, []).append(result.status)
    finally:
        transport.close()
    elapsed = time.monotonic() - started

    # Every send was eventually answered, and only with accepted or duplicate.
    assert set(answers) == {r.report_id for r in unique}
    statuses = [s for per_report in answers.values() for s in per_report]
    assert len(statuses) == len(sends)
    assert set(statuses) <= {ldp_pb2.ACCEPTED, ldp_pb2.DUPLICATE}
    # Never accepted twice. Reports whose only "accepted" answer was lost with a dropped
    # acknowledgement were committed anyway: every resend of them came back as a duplicate.
    accepted_twice = [rid for rid, s in answers.items() if s.count(ldp_pb2.ACCEPTED) > 1]
    assert accepted_twice == []
    hidden_accepts = [rid for rid, s in answers.items() if ldp_pb2.ACCEPTED not in s]
    assert hidden_accepts, "no dropped acknowledgement hid a committed upload"

    # The faults really happened.
    counts = proxy.counts
    assert counts["drop_ack"] >= 10 and counts["reset"] >= 10 and counts["delay"] >= 10, counts

    # The store: exactly the unique reports, byte for byte, and the known counts (Janus oracle).
    stored = storecheck.stored_reports(server.db)
    assert stored == {r.report_id: (r.survey_id, r.question_id, r.payload) for r in unique}
    stats = storecheck.nonempty(storecheck.statistics(server.db))
    assert stats == {key: (sum(counts), counts) for key, counts in KNOWN_COUNTS.items()}
    assert stats == storecheck.recount(stored, server.surveys)
    assert storecheck.integrity(server.db) == "ok"
    print(
        f"\nproxy: {len(unique)} unique reports, {len(sends)} sends, {counts['calls']} calls, "
        f"{counts['connections']} connections, {counts['drop_ack']} acks dropped, "
        f"{counts['reset']} resets mid-request, {counts['delay']} delayed, "
        f"{len(hidden_accepts)} reports whose acceptance was lost, {elapsed:.1f} s"
    )


def test_proxy_drops_an_acknowledgement_after_the_commit(server):
    """Control for the proxy itself: with every acknowledgement dropped, the first call fails
    for the client, yet the server committed it, which a direct resend shows."""
    proxy = FaultProxy(server.target, FaultPlan(drop_ack=1.0), seed=0).start()
    report = ldp_pb2.Report(
        report_id=os.urandom(16),
        survey_id="big",
        question_id="rr64",
        payload=server.surveys["big"].question("rr64").mechanism.encode(3),
    )
    try:
        with (
            Transport(proxy.target, timeout=5.0, max_attempts=1) as through_proxy,
            pytest.raises(TransportError) as failure,
        ):
            through_proxy.upload([report])
        assert failure.value.code.name == "UNAVAILABLE"
        assert proxy.counts["drop_ack"] == 1
    finally:
        proxy.stop()
    with Transport(server.target) as direct:
        [result] = direct.upload([report])
    assert result.status == ldp_pb2.DUPLICATE
    assert storecheck.statistics(server.db)[("big", "rr64")] == (1, [0, 0, 0, 1, 0, 0, 0, 0])


def test_a_cancelled_call_is_not_a_refusal(server, tmp_path):
    """A call that the network or a stopping server cancels (CANCELLED) says nothing about the
    report: the device keeps it pending, never as a dead letter, and delivers it later."""
    proxy = FaultProxy(server.target, FaultPlan(), seed=0).start()
    reporter = Reporter(
        Transport(proxy.target, max_attempts=1), tmp_path / "device.sqlite", Budget(100.0)
    )
    try:
        report_id = reporter.answer("big", "rr64", "c2")  # fetches the survey unharmed
        proxy.plan = FaultPlan(cancel=1.0)
        result = reporter.flush(batch_size=1)
        assert proxy.counts["cancel"] == 1
        assert "CANCELLED" in result.error
        assert (result.rejected, result.pending, reporter.outbox.rejected()) == (0, 1, [])
        assert storecheck.stored_reports(server.db) == {}  # the server never ran the call
        proxy.plan = FaultPlan()
        result = reporter.flush(batch_size=1)
        assert (result.accepted, result.pending) == (1, 0)
        assert set(storecheck.stored_reports(server.db)) == {report_id}
    finally:
        reporter.close()
        proxy.stop()
