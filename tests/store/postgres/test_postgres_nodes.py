"""Several stateless ingest nodes on one real PostgreSQL server: two ``ldp-aggregator serve
--store postgresql://...`` processes, uploads over real gRPC, the store read back directly.

* Both nodes are sent the same reports and resends at once: every report is ACCEPTED exactly
  once across the two, stored once, and the statistics equal the reports' sums.
* One node is SIGKILLed mid-upload; the devices resend what it did not answer to the other:
  every acknowledged report is stored, none twice, the statistics exact.
* A seal (from a third connection) races confirmation-side uploads on both nodes: the sealed
  counts equal the final counts, so no node acknowledged a report the seal did not count, and
  every upload after the seal is refused FAILED_PRECONDITION.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import numpy as np
import pytest
from aggregator_process import spawn_serve
from cli_runner import run_cli

from aggregator.survey_file.config import load_surveys
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

if TYPE_CHECKING:
    from aggregator.store.postgres.engine import PostgresStore

K = 4
SURVEYS = """
[[survey]]
id = "poll"
min_batch_size = 1
exploration_fraction = 0.5

[[survey.question]]
id = "q"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0
"""
CHUNK = 100


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "surveys.toml"
    path.write_text(SURVEYS)
    return path


@pytest.fixture
def nodes(tmp_path: Path, config: Path, postgres_url: str) -> Iterator[list]:
    """Two ingest nodes on the test's database: [(process, stub)]."""
    started = []
    for name in ("a", "b"):
        process, port = spawn_serve(
            tmp_path / f"{name}.port",
            *("--config", str(config), "--db", str(tmp_path / f"node-{name}.db")),
            *("--store", postgres_url, "--insecure"),
        )
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        started.append((process, ldp_pb2_grpc.CollectorStub(channel), channel))
    yield [(process, stub) for process, stub, _ in started]
    for process, _, channel in started:
        channel.close()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=30)


def reports(count: int, rng: random.Random, side: int | None = None) -> list[ldp_pb2.Report]:
    """``count`` reports of random ids, categories and (unless given) sides."""
    return [
        ldp_pb2.Report(
            report_id=os.urandom(16),
            survey_id="poll",
            question_id="q",
            payload=rng.randrange(K).to_bytes(4, "little"),
            side=side or rng.choice([ldp_pb2.EXPLORATION, ldp_pb2.CONFIRMATION]),
        )
        for _ in range(count)
    ]


def expected(sent: list[ldp_pb2.Report], side: int) -> tuple[int, list[int]]:
    """(n, sums) of the randomized-response counts of ``sent`` on ``side``."""
    values = [int.from_bytes(r.payload, "little") for r in sent if r.side == side]
    return len(values), np.bincount(values, minlength=K).tolist()


def open_store(url: str) -> PostgresStore:
    """The shared store, opened from the tests (imported here: psycopg is the [postgres]
    extra's, and the ``postgres_url`` fixture has said whether the test may run)."""
    from aggregator.store.postgres.engine import PostgresStore

    return PostgresStore(url)


def stored(url: str, side: int) -> tuple[int, list[int]]:
    with open_store(url) as store:
        n, sums = store.statistics("poll", "q", side=side)
    return n, sums.tolist()


def upload(stub, chunk: list[ldp_pb2.Report]) -> list[int]:
    response = stub.Upload(ldp_pb2.UploadRequest(reports=chunk), timeout=30)
    return [result.status for result in response.results]


@pytest.mark.slow  # serve processes, SIGKILL (docs/testing.md)
def test_two_nodes_store_each_resent_report_once(nodes, postgres_url: str, config: Path) -> None:
    rng = random.Random(5)
    sent = reports(3000, rng)
    accepted: Counter[bytes] = Counter()
    lock = threading.Lock()

    def device_traffic(stub, order: list[ldp_pb2.Report], seed: int) -> None:
        local = random.Random(seed)
        resends = order + local.sample(order, len(order) // 3)
        for start in range(0, len(resends), CHUNK):
            chunk = list({r.report_id: r for r in resends[start : start + CHUNK]}.values())
            for report, status in zip(chunk, upload(stub, chunk), strict=True):
                assert status in (ldp_pb2.ACCEPTED, ldp_pb2.DUPLICATE)
                with lock:
                    accepted[report.report_id] += status == ldp_pb2.ACCEPTED

    back = list(reversed(sent))
    jobs = [(nodes[0][1], sent), (nodes[1][1], back), (nodes[0][1], back), (nodes[1][1], sent)]
    threads = [
        threading.Thread(target=device_traffic, args=(stub, order, seed))
        for seed, (stub, order) in enumerate(jobs)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(accepted.values()) == [1] * len(sent)  # ACCEPTED exactly once, by one node
    with open_store(postgres_url) as store:
        assert store.count_reports() == len(sent)
    for side in (ldp_pb2.EXPLORATION, ldp_pb2.CONFIRMATION):
        assert stored(postgres_url, side) == expected(sent, side)


@pytest.mark.slow  # serve processes, SIGKILL (docs/testing.md)
def test_sigkill_of_a_node_mid_upload_loses_and_doubles_nothing(
    nodes, postgres_url: str, config: Path
) -> None:
    rng = random.Random(9)
    sent = reports(6000, rng)
    chunks = [sent[i : i + CHUNK] for i in range(0, len(sent), CHUNK)]
    acknowledged: set[bytes] = set()
    lock = threading.Lock()
    killed = threading.Event()

    def device(mine: list[list[ldp_pb2.Report]], seed: int) -> None:
        """Upload each chunk to a random node; an unanswered upload is resent, to either."""
        local = random.Random(seed)
        for chunk in mine:
            while True:
                process, stub = local.choice(nodes)
                if killed.is_set() and process.poll() is not None:
                    continue
                try:
                    statuses = upload(stub, chunk)
                except grpc.RpcError:
                    time.sleep(0.01)
                    continue
                assert set(statuses) <= {ldp_pb2.ACCEPTED, ldp_pb2.DUPLICATE}
                with lock:
                    acknowledged.update(r.report_id for r in chunk)
                break

    threads = [
        threading.Thread(target=device, args=(chunks[i::4], i), daemon=True) for i in range(4)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while len(acknowledged) < len(sent) // 4:
        assert time.monotonic() < deadline and any(t.is_alive() for t in threads)
        time.sleep(0.005)
    nodes[0][0].send_signal(signal.SIGKILL)  # mid-upload: the devices are still sending
    nodes[0][0].wait()
    killed.set()
    for t in threads:
        t.join(timeout=120)
    assert len(acknowledged) == len(sent)
    with open_store(postgres_url) as store:
        assert store.stored_ids(list(acknowledged)) == acknowledged  # none lost
        assert store.count_reports() == len(sent)  # none twice
    for side in (ldp_pb2.EXPLORATION, ldp_pb2.CONFIRMATION):
        assert stored(postgres_url, side) == expected(sent, side)


@pytest.mark.slow  # serve processes, SIGKILL (docs/testing.md)
def test_a_seal_racing_uploads_on_two_nodes(nodes, postgres_url: str, config: Path) -> None:
    from aggregator.store.postgres import confirm, pins

    survey = load_surveys(config)["poll"]
    acknowledged: list[ldp_pb2.Report] = []
    refused = Counter[int]()
    lock = threading.Lock()
    stop = threading.Event()

    def device(stub, seed: int) -> None:
        local = random.Random(seed)
        while not stop.is_set():
            chunk = reports(20, local, side=ldp_pb2.CONFIRMATION)
            try:
                upload(stub, chunk)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc.details()
                with lock:
                    refused[id(stub)] += 1
                continue
            with lock:
                acknowledged.extend(chunk)

    with open_store(postgres_url) as store:
        pins.register(store, {"poll": survey})
        confirm.preregister(store, survey, "the plan", "cd" * 32)
        threads = [
            threading.Thread(target=device, args=(stub, i), daemon=True)
            for i, (_, stub) in enumerate(nodes * 2)
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while len(acknowledged) < 2000:
            assert time.monotonic() < deadline and any(t.is_alive() for t in threads)
            time.sleep(0.01)

        def compute(plan: str, snap) -> dict:
            return {"n": snap.histograms["q", ""].n, "sealed_at": "now"}

        for _ in range(100):  # the uploads go on: a seal may find new counts and compute again
            try:
                sealed, _ = confirm.seal(store, survey, compute)
                break
            except confirm.StateChangedError:
                continue
        else:
            pytest.fail("the seal never caught up with the uploads")
        time.sleep(0.5)  # uploads after the seal, on both nodes
        stop.set()
        for t in threads:
            t.join(timeout=60)
        sealed_n = json.loads(sealed.sealed_record())["n"]
        n, sums = store.statistics("poll", "q", side=ldp_pb2.CONFIRMATION)
    assert n == sealed_n == len(acknowledged)  # nothing acknowledged past the seal
    assert sums.tolist() == expected(acknowledged, ldp_pb2.CONFIRMATION)[1]
    assert len(refused) == 2  # both nodes refused confirmation-side uploads after the seal


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--store", "mysql://x/y"), "--store takes a PostgreSQL URL"),
        (("--store", "postgresql://x/y", "--workers", "2"), "one process per node"),
    ],
)
def test_serve_store_refuses_bad_flags_in_one_line(tmp_path, config, extra, message) -> None:
    done = run_cli("agg", "serve", "--config", config, "--db", tmp_path / "n", "--insecure", *extra)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("ldp-aggregator: error:") and message in done.stderr


def test_serve_store_with_no_server_is_one_line(tmp_path, config, postgres) -> None:
    """A URL nobody answers: one line, exit 2, nothing bound."""
    config.write_text(SURVEYS.replace("epsilon = 1.0", "epsilon = 1.0\nmax_reports_per_device = 3"))
    url = f"postgresql:///nothing?host={tmp_path}"  # a socket directory with no server
    done = run_cli(
        "agg", "serve", "--config", config, "--db", tmp_path / "n", "--store", url,
        "--insecure", "--port", "0",
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (error,) = done.stderr.strip().splitlines()
    assert error.startswith("ldp-aggregator: error: cannot reach the PostgreSQL store")


def test_compose_file_runs_two_nodes_with_existing_serve_flags() -> None:
    """scripts/deploy/compose-postgres.yaml: PostgreSQL and two nodes whose serve command lines
    parse, name a PostgreSQL --store, and keep the password off the command line."""
    yaml = pytest.importorskip("yaml")
    from aggregator.cli import build_parser

    path = Path(__file__).resolve().parents[3] / "scripts/deploy/compose-postgres.yaml"
    services = yaml.safe_load(path.read_text())["services"]
    assert set(services) == {"postgres", "node-a", "node-b"}
    assert "ports" not in services["postgres"]  # the database is not published
    for name in ("node-a", "node-b"):
        parsed = build_parser().parse_args(services[name]["command"])
        assert parsed.store.startswith("postgresql://") and "@" in parsed.store
        assert ":" not in parsed.store.split("//")[1].split("@")[0]  # no password in the URL
        assert "PGPASSWORD" in services[name]["environment"]
        assert parsed.metrics_host == "127.0.0.1" and parsed.tls_cert is not None
