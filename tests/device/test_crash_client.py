"""A device killed in the worst window: the server committed its upload, the acknowledgement never
arrived, and the `ldp-client flush` process dies (SIGKILL) before it could clear its outbox.

tests/service/collector/test_service.py already kills a device between randomizing and sending;
this covers the
window after sending. The next flush must resend the very same report ids and payloads (no
re-randomization, no new budget charge) and the server must answer DUPLICATE and count them once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import storecheck
from faultproxy import FaultPlan, FaultProxy

from client.device.ledger import Ledger
from client.device.outbox import Outbox

# One answer per question (a device answers a question once): three questions of survey s1.
ANSWERS = (("rr", "b"), ("fc", "d"), ("joint", "x1|y2"))


def client(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "client.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.slow
def test_device_killed_after_the_server_committed_resends_the_same_reports(server, tmp_path):
    state = tmp_path / "device.sqlite"
    for question, answer in ANSWERS:
        client(
            "submit", "--server", server.target, "--insecure", "--state", str(state),
            "--budget", "500", "--survey", "s1", "--question", question, "--answer", answer,
            "--no-flush",
        )  # fmt: skip
    with Outbox(state) as outbox:
        queued = {item.report_id: item.payload for item in outbox.pending()}
    assert len(queued) == len(ANSWERS)

    # Call 1 fetches the survey (to learn whether uploads must be signed); call 2 is the upload.
    proxy = FaultProxy(server.target, FaultPlan(stall_from_call=2), seed=0).start()
    try:
        flush = subprocess.Popen(
            [sys.executable, "-m", "client.cli", "flush", "--server", proxy.target, "--insecure",
             "--state", str(state), "--timeout", "120"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        # Wait until the server committed the upload and its answer is held at the proxy.
        while len(storecheck.stored_reports(server.db)) < len(ANSWERS) or not proxy.counts["stall"]:
            assert flush.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        assert proxy.counts["stall"] == 1 and flush.poll() is None
        flush.send_signal(signal.SIGKILL)
        assert flush.wait(timeout=10) == -signal.SIGKILL
    finally:
        proxy.stop()

    with Outbox(state) as outbox:
        assert {item.report_id: item.payload for item in outbox.pending()} == queued
    done = client("flush", "--server", server.target, "--insecure", "--state", str(state), "--json")
    result = json.loads(done.stdout)
    assert (result["accepted"], result["duplicate"], result["pending"]) == (0, len(ANSWERS), 0)
    stored = storecheck.stored_reports(server.db)
    assert {rid: payload for rid, (_, _, payload) in stored.items()} == queued
    recounted = storecheck.recount(stored, server.surveys)
    for question, _ in ANSWERS:
        stats = storecheck.statistics(server.db)[("s1", question)]
        assert stats == recounted[("s1", question)] and stats[0] == 1
    with Ledger(state) as ledger:
        assert len(ledger.charges()) == len(ANSWERS)  # nothing randomized or charged again
