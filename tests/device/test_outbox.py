"""The device outbox: durable reports and dead letters on a real SQLite file."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from client.device.ledger import Budget, Ledger
from client.device.outbox import Outbox, OutboxError
from client.mechanisms.base import PrivacyCost


def rid(n: int) -> bytes:
    return n.to_bytes(16, "big")


@pytest.fixture
def db(tmp_path):
    return tmp_path / "device.db"


@pytest.fixture
def outbox(db):
    with Outbox(db) as box:
        yield box


def test_add_pending_acknowledge(outbox):
    for n in range(3):
        outbox.add(rid(n), "s", f"q{n}", bytes([n]))
    assert len(outbox) == 3
    items = outbox.pending()
    assert [item.report_id for item in items] == [rid(0), rid(1), rid(2)]
    assert (items[1].survey_id, items[1].question_id, items[1].payload) == ("s", "q1", b"\x01")
    assert items[0].attempts == 0 and items[0].created_at > 0
    assert [item.report_id for item in outbox.pending(limit=2)] == [rid(0), rid(1)]
    outbox.mark_attempt([rid(0), rid(2)])
    outbox.mark_attempt([rid(0)])
    assert [item.attempts for item in outbox.pending()] == [2, 0, 1]
    outbox.acknowledge([rid(0), rid(2), rid(9)])  # an unknown id (already acked) is harmless
    assert [item.report_id for item in outbox.pending()] == [rid(1)]
    assert len(outbox) == 1


def test_reject_moves_to_dead_letters(outbox):
    outbox.add(rid(1), "s", "q", b"payload")
    outbox.add(rid(2), "s", "q", b"other")
    outbox.mark_attempt([rid(1)])
    outbox.reject(rid(1), "INVALID_ARGUMENT", "value out of range")
    outbox.reject(rid(1), "INVALID_ARGUMENT", "value out of range")  # idempotent
    assert [item.report_id for item in outbox.pending()] == [rid(2)]
    [(item, code, reason)] = outbox.rejected()
    assert (item.report_id, item.payload, item.attempts) == (rid(1), b"payload", 1)
    assert (code, reason) == ("INVALID_ARGUMENT", "value out of range")
    with pytest.raises(KeyError):
        outbox.reject(rid(3), "X", "unknown")


def test_state_survives_reopen(db):
    with Outbox(db) as box:
        box.add(rid(1), "s", "q1", b"a")
        box.add(rid(2), "s", "q2", b"b")
        box.add(rid(3), "s", "q3", b"c")
        box.mark_attempt([rid(2)])
        box.reject(rid(3), "PERMISSION_DENIED", "survey closed")
        pending, rejected = box.pending(), box.rejected()
    with Outbox(db) as box:
        assert box.pending() == pending
        assert box.rejected() == rejected
        assert len(box) == 2


def test_add_is_idempotent_and_conflicts_raise(outbox):
    outbox.add(rid(1), "s", "q", b"payload")
    outbox.add(rid(1), "s", "q", b"payload")
    assert len(outbox) == 1
    for conflicting in (("s", "q", b"other"), ("s", "q2", b"payload"), ("t", "q", b"payload")):
        with pytest.raises(OutboxError):
            outbox.add(rid(1), *conflicting)
    outbox.reject(rid(1), "X", "refused")
    outbox.add(rid(1), "s", "q", b"payload")  # a rejected report is not queued again
    assert len(outbox) == 0
    with pytest.raises(OutboxError):
        outbox.add(rid(1), "s", "q", b"other")
    assert [item.payload for item, _, _ in outbox.rejected()] == [b"payload"]


@pytest.mark.parametrize("bad", [b"short", b"x" * 17, "0" * 16, None])
def test_report_id_must_be_16_bytes(outbox, bad):
    with pytest.raises(ValueError):
        outbox.add(bad, "s", "q", b"p")
    assert len(outbox) == 0


def test_outbox_shares_the_ledger_file(tmp_path):
    db = tmp_path / "device.db"
    with Ledger(db, Budget(4)) as ledger, Outbox(db) as box:
        ledger.charge(
            PrivacyCost("pure", 1.0), request_id="r", survey_id="s", question_id="q", mechanism="rr"
        )
        box.add(rid(1), "s", "q", b"x")
    with Ledger(db) as ledger, Outbox(db) as box:
        assert ledger.spent() == (1.0, 0.0)
        assert len(box) == 1


# --- crash safety ------------------------------------------------------------------------------

_WRITER = textwrap.dedent(
    """
    import os, sys
    from client.device.outbox import Outbox
    box = Outbox(sys.argv[1])
    for n in range(100_000):
        report_id = os.urandom(16)
        box.add(report_id, "s", "q", os.urandom(64))
        print(report_id.hex(), flush=True)
    """
)


def test_killed_writer_loses_no_acknowledged_add(db):
    Outbox(db).close()
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(db)], stdout=subprocess.PIPE, text=True
    )
    printed = [writer.stdout.readline() for _ in range(200)]
    writer.send_signal(signal.SIGKILL)
    printed += writer.stdout.read().splitlines(keepends=True)
    writer.wait(timeout=10)
    writer.stdout.close()
    assert writer.returncode == -signal.SIGKILL
    committed = {bytes.fromhex(line) for line in printed if line.endswith("\n")}
    assert len(committed) >= 200
    with Outbox(db) as box:
        pending = {item.report_id for item in box.pending(limit=1_000_000)}
    assert committed <= pending
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()
