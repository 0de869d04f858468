"""The report store on real SQLite files: dedup and group commit, exact statistics, durability
across close/reopen and SIGKILL, validation, draining on close, failed-transaction isolation."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from aggregator.store.errors import StoreError
from aggregator.store.model import StoredReport
from aggregator.store.sqlite.report_store import ReportStore
from aggregator.store.sqlite.schema import SCHEMA_VERSION

K = 4
EYE = np.eye(K, dtype=np.int64)


def rid(i: int) -> bytes:
    return i.to_bytes(16, "big")


def report(i: int, question: str = "q", contribution: np.ndarray | None = None) -> StoredReport:
    """Report i: payload is its category i % K, contribution the matching one-hot row."""
    vector = EYE[i % K] if contribution is None else contribution
    return StoredReport(rid(i), "s", question, bytes([i % K]), vector)


def one_hot(survey_id: str, question_id: str, payload: bytes) -> np.ndarray:
    return EYE[payload[0]]


@pytest.fixture
def store(tmp_path: Path):
    with ReportStore(tmp_path / "reports.sqlite") as s:
        s.register_question("s", "q", K)
        s.register_question("s", "q2", K)
        yield s


def test_pragmas_and_schema(store: ReportStore, tmp_path: Path) -> None:
    def pragmas(conn: sqlite3.Connection) -> tuple:
        return tuple(
            conn.execute(f"PRAGMA {name}").fetchone()[0]
            for name in ("journal_mode", "synchronous", "busy_timeout", "user_version")
        )

    # the writer's own connection; 2 = FULL
    assert store._call(pragmas) == ("wal", 2, 5000, SCHEMA_VERSION)
    store.close()
    conn = sqlite3.connect(tmp_path / "reports.sqlite")
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(StoreError, match="schema version 99"):
        ReportStore(tmp_path / "reports.sqlite")


def test_register_question(store: ReportStore) -> None:
    store.register_question("s", "q", K)  # idempotent
    assert store.statistics("s", "q")[0] == 0
    assert store.statistics("s", "q")[1].tolist() == [0] * K
    with pytest.raises(StoreError, match="k=4"):
        store.register_question("s", "q", K + 1)
    with pytest.raises(StoreError):
        store.register_question("s", "new", 0)
    with pytest.raises(StoreError, match="unknown question"):
        store.statistics("s", "nope")


def test_duplicates_within_and_across_submits(store: ReportStore) -> None:
    assert store.put([report(1), report(2), report(1), report(3, "q2")]) == [
        True,
        True,
        False,
        True,
    ]
    assert store.put([report(2), report(4), report(4)]) == [False, True, False]
    assert store.put([]) == []
    assert store.count_reports() == 4
    assert store.count_reports("s") == 4 and store.count_reports("other") == 0
    n, sums = store.statistics("s", "q")
    assert n == 3 and sums.tolist() == (EYE[1] + EYE[2] + EYE[0]).tolist()
    assert store.statistics("s", "q2")[0] == 1


def test_concurrent_submitters_count_each_id_once(store: ReportStore) -> None:
    rng = random.Random(7)
    unique = [
        StoredReport(
            os.urandom(16),
            "s",
            rng.choice(["q", "q2"]),
            b"x",
            np.array([rng.randrange(5) for _ in range(K)], dtype=np.int64),
        )
        for _ in range(10_000)
    ]
    sends = [r for r in unique for _ in range(rng.randint(1, 5))]
    rng.shuffle(sends)
    accepted: dict[bytes, int] = {}
    lock = threading.Lock()

    def sender(part: list[StoredReport]) -> None:
        futures: list[tuple[list[StoredReport], Future[list[bool]]]] = []
        start = 0
        while start < len(part):
            chunk = part[start : start + rng.randint(1, 200)]
            futures.append((chunk, store.submit(chunk)))
            start += len(chunk)
        for chunk, future in futures:
            for r, new in zip(chunk, future.result(), strict=True):
                with lock:
                    accepted[r.report_id] = accepted.get(r.report_id, 0) + new

    threads = [threading.Thread(target=sender, args=(sends[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert store.count_reports() == 10_000
    assert sorted(accepted.values()) == [1] * 10_000  # every id accepted exactly once
    for question in ("q", "q2"):
        mine = [r.contribution for r in unique if r.question_id == question]
        n, sums = store.statistics("s", question)
        assert n == len(mine)
        assert sums.tolist() == np.sum(mine, axis=0).tolist()


def test_statistics_survive_reopen_and_equal_rebuild(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    with ReportStore(path) as store:
        store.register_question("s", "q", K)
        store.register_question("s", "empty", K)
        store.put([report(i) for i in range(1000)])
        before = store.statistics("s", "q")
    with ReportStore(path) as store:
        n, sums = store.statistics("s", "q")
        assert n == before[0] == 1000 and sums.tolist() == before[1].tolist() == [250] * K
        rebuilt = store.rebuild(one_hot)
        assert rebuilt.keys() == {("s", "q"), ("s", "empty")}
        assert rebuilt["s", "q"][0] == 1000 and rebuilt["s", "q"][1].tolist() == [250] * K
        assert rebuilt["s", "empty"][0] == 0
        store.put([report(1000)])  # still writable after a rebuild
        assert store.statistics("s", "q")[1].tolist() == [251, 250, 250, 250]
        assert store.integrity_check() == "ok"
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0


def test_rebuild_rewrites_statistics_from_the_log(store: ReportStore) -> None:
    store.put([report(i) for i in range(10)])
    twice = store.rebuild(lambda s, q, payload: 2 * EYE[payload[0]])
    assert twice["s", "q"][1].tolist() == store.statistics("s", "q")[1].tolist() == [6, 6, 4, 4]
    with pytest.raises(StoreError, match="int64 vector"):
        store.rebuild(lambda s, q, payload: np.zeros(K + 1, dtype=np.int64))
    assert store.statistics("s", "q")[1].tolist() == [6, 6, 4, 4]  # failed rebuild rolled back


def test_iter_reports_streams_in_report_id_order(store: ReportStore) -> None:
    ids = random.Random(1).sample(range(10**6), 500)
    store.put([report(i, "q" if i % 3 else "q2") for i in ids])
    everything = list(store.iter_reports("s", batch=7))
    assert [r[0] for r in everything] == sorted(rid(i) for i in ids)
    assert {r[1] for r in everything} == {"q", "q2"}
    only_q = list(store.iter_reports("s", "q", batch=7))
    assert [r[0] for r in only_q] == sorted(rid(i) for i in ids if i % 3)
    assert all(payload == bytes([int.from_bytes(r, "big") % K]) for r, _, payload, _ in only_q)
    assert list(store.iter_reports("other")) == []


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (StoredReport(b"short", "s", "q", b"x", EYE[0]), "16 bytes"),
        (StoredReport(bytearray(16), "s", "q", b"x", EYE[0]), "16 bytes"),  # type: ignore[arg-type]
        (StoredReport(rid(1), "s", "unknown", b"x", EYE[0]), "unknown question"),
        (StoredReport(rid(1), "s", "q", b"x", np.zeros(K + 1, dtype=np.int64)), "length 4"),
        (StoredReport(rid(1), "s", "q", b"x", EYE[0].astype(np.int32)), "int64"),
        (StoredReport(rid(1), "s", "q", "x", EYE[0]), "payload"),  # type: ignore[arg-type]
    ],
)
def test_validation_errors_raise_before_enqueueing(
    store: ReportStore, bad: StoredReport, message: str
) -> None:
    with pytest.raises(StoreError, match=message):
        store.submit([report(1), bad])
    assert store.count_reports() == 0  # the good report in the same submit was not queued


def test_close_drains_pending_submits(tmp_path: Path) -> None:
    store = ReportStore(tmp_path / "r.sqlite", max_batch=50, max_delay=0.5)
    store.register_question("s", "q", K)
    futures = [store.submit([report(i) for i in range(j, j + 30)]) for j in range(0, 300, 30)]
    store.close()
    assert all(f.done() and f.result() == [True] * 30 for f in futures)
    with pytest.raises(StoreError, match="closed"):
        store.submit([report(999)])
    with pytest.raises(StoreError, match="closed"):
        store.register_question("s", "q", K)
    with pytest.raises(StoreError, match="closed"):
        store.statistics("s", "q")
    store.close()  # idempotent
    with ReportStore(tmp_path / "r.sqlite") as reopened:
        assert reopened.count_reports() == 300
        assert reopened.statistics("s", "q")[0] == 300


def test_failed_transaction_rolls_back_and_spares_other_callers(tmp_path: Path) -> None:
    """An int64 overflow of the sums is a real failure: the poisoned submit gets StoreError with
    nothing written, the submit committed in the same group commit still succeeds."""
    with ReportStore(tmp_path / "r.sqlite", max_delay=0.1) as store:
        store.register_question("s", "q", 2)
        huge = np.array([2**62, 0], dtype=np.int64)
        assert store.put([report(0, contribution=huge)]) == [True]
        poisoned = store.submit([report(1, contribution=huge), report(2, contribution=huge)])
        fine = store.submit([report(3, contribution=np.array([0, 1], dtype=np.int64))])
        with pytest.raises(StoreError, match="overflow"):
            poisoned.result()
        assert fine.result() == [True]
        assert sorted(r[0] for r in store.iter_reports("s")) == [rid(0), rid(3)]
        assert store.statistics("s", "q")[1].tolist() == [2**62, 1]
        assert store.put([report(4, contribution=np.array([1, 1], dtype=np.int64))]) == [True]
        n, sums = store.statistics("s", "q")
        assert n == 3 and sums.tolist() == [2**62 + 1, 2]


def test_cancelled_submit_is_not_written_and_asyncio_can_await(store: ReportStore) -> None:
    store.put([report(0)])
    release = threading.Event()

    def slow_one_hot(survey_id: str, question_id: str, payload: bytes) -> np.ndarray:
        release.wait(5)
        return EYE[payload[0]]

    # rebuild runs on the writer thread: while it waits, later submits stay queued.
    rebuilding = threading.Thread(target=store.rebuild, args=(slow_one_hot,))
    rebuilding.start()
    time.sleep(0.05)
    cancelled = store.submit([report(1)])
    assert cancelled.cancel()

    async def ingest() -> list[bool]:
        pending = asyncio.wrap_future(store.submit([report(2)]))
        release.set()
        return await pending

    assert asyncio.run(ingest()) == [True]
    rebuilding.join()
    assert [r[0] for r in store.iter_reports("s")] == [rid(0), rid(2)]


CHILD = """
import sys
import numpy as np
from aggregator.store.model import StoredReport
from aggregator.store.sqlite.report_store import ReportStore

path, start = sys.argv[1], int(sys.argv[2])
eye = np.eye(4, dtype=np.int64)
with ReportStore(path, max_delay=0.0) as store:
    store.register_question("s", "q", 4)
    i = start
    while True:
        batch = [
            StoredReport(j.to_bytes(16, "big"), "s", "q", bytes([j % 4]), eye[j % 4])
            for j in range(i, i + 50)
        ]
        store.put(batch)
        i += 50
        print("acked", i, flush=True)
"""


def test_acknowledged_reports_survive_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "crash.sqlite"
    rng = random.Random(3)
    acked = 0
    for _ in range(3):
        target = acked + rng.randint(200, 2000)
        command = [sys.executable, "-c", CHILD, str(path), str(acked)]
        with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as child:
            watchdog = threading.Timer(30, child.kill)
            watchdog.start()
            assert child.stdout is not None
            for line in child.stdout:
                acked = int(line.split()[1])
                if acked >= target:
                    break
            time.sleep(rng.uniform(0, 0.02))  # land anywhere in the next transaction
            child.send_signal(signal.SIGKILL)
            child.wait()
            watchdog.cancel()
            for line in child.stdout:  # acks printed before the kill that we had not read yet
                if line.endswith("\n"):  # the kill may cut the last line short
                    acked = int(line.split()[1])
        assert acked >= target, "child stopped early"

        with ReportStore(path) as store:
            assert store.integrity_check() == "ok"
            stored = [int.from_bytes(r, "big") for r, *_ in store.iter_reports("s")]
            # every acknowledged report is there, at most the one unacknowledged batch beyond
            assert stored == list(range(len(stored)))
            assert acked <= len(stored) <= acked + 50
            n, sums = store.statistics("s", "q")
            rebuilt_n, rebuilt_sums = store.rebuild(one_hot)["s", "q"]
            assert n == rebuilt_n == len(stored)
            assert sums.tolist() == rebuilt_sums.tolist()
            assert sums.tolist() == np.bincount(np.arange(len(stored)) % K, minlength=K).tolist()
