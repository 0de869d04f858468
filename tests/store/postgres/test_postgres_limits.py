"""Per-device limits shared by the nodes of one PostgreSQL store: two nodes
(``start_server(store_url=...)``) on a real PostgreSQL server, uploads over real gRPC from one
device (one limit key: the loopback host) to both.

* A device that reaches both nodes stores no more than its cap in total, also when it sends
  to both at once; a resend of stored reports is DUPLICATE, never refused.
* Its token bucket is one bucket: a burst spent on one node is spent on the other.
* A signed survey's one answer per device holds across nodes.
* A node hashing devices with another secret than the other nodes refuses to start.
* ``--limits-per-node`` keeps the counts in each node's own file instead: no pseudonym in the
  store, a cap per node.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cli_runner import run_cli
from conftest import ServerThread

from aggregator.service.server.app import start_server
from aggregator.store.errors import StoreError
from aggregator.survey_file.config import load_limits, load_surveys
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

SURVEYS = """
[[survey]]
id = "capped"
max_reports_per_device = 10

[[survey.question]]
id = "q"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey]]
id = "rated"
rate_per_minute = 1
burst = 5

[[survey.question]]
id = "q"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0
"""
CAP = 10


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "surveys.toml"
    path.write_text(SURVEYS)
    return path


@pytest.fixture
def nodes(tmp_path: Path, config: Path, postgres_url: str) -> Iterator[list[ServerThread]]:
    """Two nodes on the test's database, the second given the first's limits secret."""
    first = ServerThread(config, tmp_path / "node-a", store_url=postgres_url).start()
    shutil.copy(tmp_path / "node-a.limits-secret", tmp_path / "node-b.limits-secret")
    second = ServerThread(config, tmp_path / "node-b", store_url=postgres_url).start()
    yield [first, second]
    for server in (first, second):
        server.stop()


def report(survey: str = "capped") -> ldp_pb2.Report:
    return ldp_pb2.Report(
        report_id=os.urandom(16),
        survey_id=survey,
        question_id="q",
        payload=random.randrange(4).to_bytes(4, "little"),
    )


def send(server: ServerThread, batch: list[ldp_pb2.Report]) -> list[int] | grpc.RpcError:
    """The upload's statuses, or the refusal."""
    stub = ldp_pb2_grpc.CollectorStub(grpc.insecure_channel(server.target))
    try:
        response = stub.Upload(ldp_pb2.UploadRequest(reports=batch), timeout=30)
    except grpc.RpcError as exc:
        return exc
    return [r.status for r in response.results]


def stored(url: str, survey: str) -> int:
    from aggregator.store.postgres.engine import PostgresStore

    with PostgresStore(url) as store:
        return store.count_reports(survey)


@pytest.mark.slow  # two servers and a PostgreSQL database
def test_a_device_on_two_nodes_gets_its_cap_in_total(nodes, postgres_url: str) -> None:
    a, b = nodes
    first = [report() for _ in range(6)]
    assert send(a, first) == [ldp_pb2.ACCEPTED] * 6
    refused = send(b, [report() for _ in range(6)])  # 12 > 10, whichever node is asked
    assert isinstance(refused, grpc.RpcError)
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "cap reached" in (refused.details() or "")
    assert send(b, first) == [ldp_pb2.DUPLICATE] * 6  # a resend is answered, never refused
    assert send(b, [report() for _ in range(4)]) == [ldp_pb2.ACCEPTED] * 4
    assert isinstance(send(a, [report()]), grpc.RpcError)
    assert stored(postgres_url, "capped") == CAP


@pytest.mark.slow
def test_concurrent_uploads_to_both_nodes_stop_at_the_cap(nodes, postgres_url: str) -> None:
    accepted: list[int] = []
    lock = threading.Lock()

    def device(server: ServerThread) -> None:
        for _ in range(12):
            outcome = send(server, [report()])
            if not isinstance(outcome, grpc.RpcError):
                with lock:
                    accepted.extend(outcome)

    threads = [threading.Thread(target=device, args=(server,)) for server in nodes * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert accepted == [ldp_pb2.ACCEPTED] * CAP
    assert stored(postgres_url, "capped") == CAP


@pytest.mark.slow
def test_a_burst_spent_on_one_node_is_spent_on_the_other(nodes, postgres_url: str) -> None:
    a, b = nodes
    assert send(a, [report("rated") for _ in range(3)]) == [ldp_pb2.ACCEPTED] * 3
    refused = send(b, [report("rated") for _ in range(3)])  # 2 tokens left of the burst of 5
    assert isinstance(refused, grpc.RpcError)
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "rate limit of 1 reports per minute" in (refused.details() or "")
    hint = dict(refused.trailing_metadata() or ())["retry-after-ms"]
    assert 55_000 <= int(hint) <= 60_000  # one more token at 1 per minute
    assert send(b, [report("rated") for _ in range(2)]) == [ldp_pb2.ACCEPTED] * 2
    assert stored(postgres_url, "rated") == 5


def test_a_node_with_another_limits_secret_refuses_to_start(
    tmp_path: Path, config: Path, postgres_url: str
) -> None:
    surveys, limits = load_surveys(config), load_limits(config)

    async def start(name: str) -> None:
        running = await start_server(
            surveys, str(tmp_path / name), limits=limits, store_url=postgres_url
        )
        await running.stop(0)

    asyncio.run(start("node-a"))
    with pytest.raises(StoreError, match="limits secret differs from the other nodes'"):
        asyncio.run(start("node-b"))  # a secret of its own
    shutil.copy(tmp_path / "node-a.limits-secret", tmp_path / "node-b.limits-secret")
    asyncio.run(start("node-b"))


@pytest.mark.slow
def test_limits_per_node_keep_no_pseudonym_in_the_store(
    tmp_path: Path, config: Path, postgres_url: str
) -> None:
    """``--limits-per-node``: each node counts in its own ``<db>.caps`` (a device reaching both
    gets its cap on each), and the shared store holds no device pseudonym."""
    started = [
        ServerThread(
            config, tmp_path / f"node-{name}", store_url=postgres_url, per_node_limits=True
        ).start()
        for name in ("a", "b")  # each with its own secret: nothing is compared
    ]
    try:
        for server in started:
            assert send(server, [report() for _ in range(CAP)]) == [ldp_pb2.ACCEPTED] * CAP
            assert isinstance(send(server, [report()]), grpc.RpcError)
    finally:
        for server in started:
            server.stop()
    assert stored(postgres_url, "capped") == 2 * CAP
    assert (tmp_path / "node-a.caps").is_file()
    import psycopg

    with psycopg.connect(postgres_url) as conn:
        for table in ("device_counts", "device_buckets", "node_settings"):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)


def test_limits_per_node_needs_a_store(tmp_path: Path, config: Path) -> None:
    done = run_cli(
        "agg", "serve", "--config", config, "--db", tmp_path / "n", "--insecure",
        "--limits-per-node",
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "ldp-aggregator: error: --limits-per-node goes with --store (a single server counts "
        "per node)"
    )


@pytest.mark.slow
def test_a_signed_survey_takes_one_answer_per_device_across_nodes(
    tmp_path: Path, postgres_url: str
) -> None:
    """The one-answer check of a signed survey (a cap of 1 per question, limit key: the
    device's enrolled key) holds across nodes: a second answer sent to the other node is
    refused as answered before, and a resend of the first is a DUPLICATE there."""
    from device.test_repeats import Clinic
    from device.test_repeats import report as clinic_report

    clinic = Clinic(tmp_path)
    nodes = []
    for name in ("a", "b"):
        if nodes:
            shutil.copy(tmp_path / "node-a.limits-secret", tmp_path / f"node-{name}.limits-secret")
        nodes.append(
            ServerThread(
                clinic.config,
                tmp_path / f"node-{name}",
                device_keys=clinic.keys,
                store_url=postgres_url,
            ).start()
        )
    try:
        first = clinic_report("insured")
        clinic.running = nodes[0]
        assert clinic.upload([first]) == ["ACCEPTED"]
        clinic.running = nodes[1]
        error = clinic.refused([clinic_report("insured", 0)])
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "answered before" in (error.details() or "")
        assert clinic.upload([first]) == ["DUPLICATE"]
        assert clinic.upload([clinic_report("mood")]) == ["ACCEPTED"]
        clinic.running = nodes[0]
        assert clinic.refused([clinic_report("mood", 0)]).code() == (
            grpc.StatusCode.FAILED_PRECONDITION
        )
    finally:
        clinic.running = None
        for node in nodes:
            node.stop()
