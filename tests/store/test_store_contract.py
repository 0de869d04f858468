"""The report store's contract, run against both engines: the embedded SQLite ReportStore and
the PostgresStore on a real throwaway PostgreSQL server (tests/postgres_server.py). Flags and
statistics after duplicates and conflicts (within a commit, across commits, across two stores on
one database for PostgreSQL: two nodes), sides and groups, validation before anything is
queued, draining on close, pinned definitions, and a seal that closes the confirmation side."""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aggregator.store.definitions import DefinitionChangedError, SplitChangedError
from aggregator.store.errors import ConfirmationClosedError, StoreError
from aggregator.store.model import CONFLICT, DUPLICATE, STORED, ReportBatch, StoredReport
from aggregator.store.sqlite import confirmations, pins
from aggregator.store.sqlite.report_store import ReportStore
from aggregator.survey_file.config import load_surveys

K = 4
EYE = np.eye(K, dtype=np.int64)
SURVEYS = """
[[survey]]
id = "s"
min_batch_size = 5
exploration_fraction = {fraction}
group_label = "arm"
group_values = ["x", "y"]

[[survey.question]]
id = "q"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = {epsilon}

[[survey.question]]
id = "q2"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0
"""


def surveys(tmp_path: Path, fraction: float = 0.5, epsilon: float = 1.0) -> dict:
    path = tmp_path / f"s-{fraction}-{epsilon}.toml"
    path.write_text(SURVEYS.format(fraction=fraction, epsilon=epsilon))
    return load_surveys(path)


def rid(i: int) -> bytes:
    return i.to_bytes(16, "big")


def report(
    i: int, question: str = "q", side: int = 1, group: str = "x", payload: bytes | None = None
) -> StoredReport:
    """Report i: category i % K, its one-hot contribution."""
    payload = bytes([i % K]) if payload is None else payload
    return StoredReport(rid(i), "s", question, payload, EYE[payload[0] % K], side, group)


@dataclass
class Engine:
    """One engine as these tests drive it: open a store on the test's database, pin surveys,
    register a plan and seal it."""

    name: str
    open: Callable[..., Any]
    register: Callable[[Any, dict], None]
    preregister: Callable[..., tuple]
    seal: Callable[..., tuple]


def _sqlite(tmp_path: Path) -> Engine:
    path = tmp_path / "reports.sqlite"
    return Engine(
        "sqlite",
        lambda **kw: ReportStore(path, **kw),
        pins.register,
        confirmations.preregister,
        confirmations.seal,
    )


def _postgres(url: str) -> Engine:
    from aggregator.store.postgres import confirm, pins
    from aggregator.store.postgres.engine import PostgresStore

    return Engine(
        "postgres", lambda **kw: PostgresStore(url, **kw), pins.register, confirm.preregister,
        confirm.seal,
    )  # fmt: skip


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request, tmp_path: Path) -> Engine:
    if request.param == "sqlite":
        return _sqlite(tmp_path)
    return _postgres(request.getfixturevalue("postgres_url"))


@pytest.fixture
def store(engine: Engine, tmp_path: Path) -> Iterator[Any]:
    with engine.open() as opened:
        engine.register(opened, surveys(tmp_path))
        yield opened


def test_flags_and_statistics_for_duplicates_and_conflicts(store) -> None:
    assert store.put([report(1), report(2), report(1), report(3, "q2")]) == [
        STORED,
        STORED,
        DUPLICATE,
        STORED,
    ]
    # a resend, a new id twice, the same id with another payload / question / survey: CONFLICT
    other = StoredReport(rid(2), "s", "q2", bytes([2]), EYE[2], 1, "x")
    assert store.put([report(2), report(4), report(4), report(1, payload=b"\x03"), other]) == [
        DUPLICATE,
        STORED,
        DUPLICATE,
        CONFLICT,
        CONFLICT,
    ]
    # within one commit: the first occurrence wins, a later different one conflicts
    assert store.put([report(9), report(9, payload=b"\x02")]) == [STORED, CONFLICT]
    assert store.put([]) == []
    assert store.count_reports() == 5 and store.count_reports("s") == 5
    n, sums = store.statistics("s", "q", side=1)
    assert n == 4 and sums.tolist() == (EYE[1] + EYE[2] + EYE[0] + EYE[1]).tolist()
    assert store.statistics("s", "q2", side=1)[0] == 1
    assert store.statistics("s", "q", side=2)[0] == 0  # the other side
    assert store.stored_ids([rid(1), rid(5), rid(9), b"short"]) == {rid(1), rid(9)}


def test_sides_and_groups_are_counted_apart_and_pooled(store) -> None:
    reports = [report(i, side=1 + i % 2, group="xy"[i // 2 % 2]) for i in range(40)]
    assert store.put(reports) == [STORED] * 40
    for side in (1, 2):
        for group in ("", "x", "y"):
            mine = [r.contribution for r in reports if r.side == side and group in ("", r.group)]
            n, sums = store.statistics("s", "q", side=side, group=group)
            assert n == len(mine) and sums.tolist() == np.sum(mine, axis=0).tolist()


def test_concurrent_submitters_count_each_id_once(store) -> None:
    rng = random.Random(7)
    unique = [
        StoredReport(
            os.urandom(16),
            "s",
            rng.choice(["q", "q2"]),
            b"x",
            np.array([rng.randrange(5) for _ in range(K)], dtype=np.int64),
            1,
            "x",
        )
        for _ in range(3000)
    ]
    sends = [r for r in unique for _ in range(rng.randint(1, 4))]
    rng.shuffle(sends)
    accepted = _send_concurrently([(store, sends[i::4]) for i in range(4)], rng)
    assert store.count_reports() == 3000
    assert sorted(accepted.values()) == [1] * 3000  # every id accepted exactly once
    _assert_statistics_equal(store, unique)


def test_validation_errors_raise_before_anything_is_queued(store) -> None:
    with pytest.raises(StoreError, match="unknown question"):
        store.submit([report(1, "nope")])
    bad = ReportBatch("s", "q", [b"short"], [b"\x00"], EYE[:1], 1, "x")
    with pytest.raises(StoreError, match="16 bytes"):
        store.submit_batches([bad])
    wrong = ReportBatch("s", "q", [rid(1)], [b"\x00"], np.zeros((1, 3), np.int64), 1, "x")
    with pytest.raises(StoreError, match="shape"):
        store.submit_batches([wrong])
    assert store.count_reports() == 0


def test_close_commits_everything_submitted(engine: Engine, tmp_path: Path) -> None:
    with engine.open(max_delay=0.05) as first:
        engine.register(first, surveys(tmp_path))
        futures = [first.submit([report(i)]) for i in range(200)]
    assert [f.result() for f in futures] == [[STORED]] * 200
    with engine.open() as again:
        assert again.count_reports() == 200
        assert again.statistics("s", "q", side=1)[0] == 200
    with pytest.raises(StoreError, match="closed"):
        again.submit([report(999)])


def test_iter_reports_in_report_id_order(store) -> None:
    store.put([report(i, side=1 + i % 2) for i in (5, 4, 9, 2, 3)])
    rows = list(store.iter_reports("s", "q", batch=2, side=2))
    assert [r[0] for r in rows] == [rid(3), rid(5), rid(9)]
    assert rows[0][1:] == ("q", bytes([3]), "x")
    assert len(list(store.iter_reports("s"))) == 5


def test_definitions_are_pinned_once_there_are_reports(engine: Engine, tmp_path: Path) -> None:
    with engine.open() as opened:
        engine.register(opened, surveys(tmp_path))
        engine.register(opened, surveys(tmp_path, epsilon=2.0))  # no reports yet: follows
        opened.put([report(1)])
        with pytest.raises(DefinitionChangedError, match=r"epsilon is 3\.0"):
            engine.register(opened, surveys(tmp_path, epsilon=3.0))
        with pytest.raises(SplitChangedError, match=r"exploration_fraction is 0\.25"):
            engine.register(opened, surveys(tmp_path, fraction=0.25, epsilon=2.0))
        engine.register(opened, surveys(tmp_path, epsilon=2.0))  # the pinned one: fine


def test_a_seal_closes_the_confirmation_side(engine: Engine, tmp_path: Path) -> None:
    survey = surveys(tmp_path)["s"]
    with engine.open() as opened:
        engine.register(opened, {"s": survey})
        opened.put([report(i, side=2) for i in range(10)] + [report(100, side=1)])
        assert engine.preregister(opened, survey, "plan text", "ab" * 32)[1] is False
        assert engine.preregister(opened, survey, "plan text", "ab" * 32)[1] is True

        def compute(plan: str, snap) -> dict:
            return {"plan": plan, "n": snap.histograms["q", ""].n, "sealed_at": "now"}

        sealed, already = engine.seal(opened, survey, compute)
        assert not already and '"n": 10' in sealed.sealed_record()
        with pytest.raises(ConfirmationClosedError):
            opened.put([report(11, side=2)])
        assert opened.put([report(12, side=1)]) == [STORED]  # exploration goes on
        assert engine.seal(opened, survey, compute)[1] is True
        assert opened.statistics("s", "q", side=2)[0] == 10


def _send_concurrently(jobs: list[tuple[Any, list[StoredReport]]], rng: random.Random) -> dict:
    """Each (store, reports) sends its reports in random chunks from a thread of its own, all
    at once: id -> times STORED."""
    accepted: dict[bytes, int] = {}
    lock = threading.Lock()

    def sender(target, part: list[StoredReport], seed: int) -> None:
        local = random.Random(seed)
        pending: list[tuple[list[StoredReport], Future[list[int]]]] = []
        start = 0
        while start < len(part):
            chunk = part[start : start + local.randint(1, 200)]
            pending.append((chunk, target.submit(chunk)))
            start += len(chunk)
        for chunk, future in pending:
            for r, flag in zip(chunk, future.result(), strict=True):
                assert flag in (STORED, DUPLICATE)
                with lock:
                    accepted[r.report_id] = accepted.get(r.report_id, 0) + (flag == STORED)

    threads = [
        threading.Thread(target=sender, args=(target, part, rng.randrange(1 << 30)))
        for target, part in jobs
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return accepted


def _assert_statistics_equal(store, unique: list[StoredReport]) -> None:
    for question in ("q", "q2"):
        mine = [r.contribution for r in unique if r.question_id == question]
        n, sums = store.statistics("s", question, side=1)
        assert n == len(mine)
        assert sums.tolist() == np.sum(mine, axis=0).tolist()


def test_two_postgres_nodes_store_each_resent_report_once(postgres_url: str, tmp_path) -> None:
    """Two stores on one database (two nodes' engines), each sent the same reports and resends
    concurrently: every report is stored by exactly one of them, the statistics exact."""
    from aggregator.store.postgres import pins
    from aggregator.store.postgres.engine import PostgresStore

    rng = random.Random(11)
    unique = [
        StoredReport(
            os.urandom(16), "s", rng.choice(["q", "q2"]), b"x",
            np.array([rng.randrange(5) for _ in range(K)], dtype=np.int64), 1, "x",
        )
        for _ in range(3000)
    ]  # fmt: skip
    with PostgresStore(postgres_url) as one, PostgresStore(postgres_url, shards=4) as two:
        pins.register(one, surveys(tmp_path))
        pins.register(two, surveys(tmp_path))
        sends = [r for r in unique for _ in range(rng.randint(1, 3))]
        # each node is sent every report at least once, by two threads, in opposite orders
        back = list(reversed(sends))
        jobs = [(one, sends[0::2]), (one, sends[1::2]), (two, back[0::2]), (two, back[1::2])]
        accepted = _send_concurrently(jobs, rng)
        assert sorted(accepted.values()) == [1] * 3000
        assert one.count_reports() == two.count_reports() == 3000
        _assert_statistics_equal(one, unique)
        _assert_statistics_equal(two, unique)


def test_postgres_store_rides_out_a_lost_connection(postgres_url: str, tmp_path) -> None:
    """Every session ended by the server (a restart, a failover, an administrator): the next
    commit runs on a new connection and is answered as if nothing happened; a database that
    is gone is StoreUnavailableError (UNAVAILABLE to devices), and nothing is half-written."""
    import psycopg

    from aggregator.store.errors import StoreUnavailableError
    from aggregator.store.postgres import pins
    from aggregator.store.postgres.engine import PostgresStore

    with PostgresStore(postgres_url) as store:
        pins.register(store, surveys(tmp_path))
        assert store.put([report(1)]) == [STORED]
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        assert store.put([report(2), report(1)]) == [STORED, DUPLICATE]
        assert store.statistics("s", "q", side=1)[0] == 2
        name = postgres_url.split("///", 1)[1].split("?", 1)[0]
        with psycopg.connect(postgres_url.replace(name, "postgres"), autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        with pytest.raises(StoreUnavailableError, match="cannot reach"):
            store.put([report(3)])
