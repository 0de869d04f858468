"""Design-based answers of the Analyst on a shared PostgreSQL store (issue 36): two ``serve
--store postgresql://...`` processes on one real PostgreSQL server and a SQLite server holding
the same reports, devices with design keys uploading over real gRPC on loopback (with resends
across the nodes).

* ``estimate|test --design --server`` to node A prints exactly what it prints to node B (the
  design rows released are shared), and equals ``--design --db`` on the SQLite store and the
  direct ``--design --store`` read at a release point, to 1e-12.
* ``min_batch_size - 1`` more reports move the direct read, not the answer of either node; one
  more moves both nodes' answers together; below ``min_batch_size`` it is refused, exit 3.
  A design ``TwoSample`` without groups (every group of the label) is the same on both nodes.
* Releases racing uploads on both nodes store design rows whose n add up to the released n
  (they are read in one statement), so no answer is refused as older than design snapshots.
Skipped without PostgreSQL, failed with LDP_REQUIRE_POSTGRES=1 (tests/postgres_server.py)."""

from __future__ import annotations

import itertools
import json
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from aggregator_process import analyst_port, spawn_serve
from cli_runner import run_cli
from conftest import ServerThread
from service.collector.test_design_service import messages, write_survey

from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

MIN_BATCH = 50  # the 'field' survey's min_batch_size
ESTIMATE = ["estimate", "--survey", "field", "--question", "rr", "--design", "--json"]


@dataclass
class Node:
    process: object
    target: str
    analyst_target: str


@pytest.fixture
def cluster(tmp_path: Path, postgres_url: str) -> Iterator[tuple[Path, list[Node], ServerThread]]:
    """(survey file, two serve --store nodes, a SQLite server) of the 'field' design survey."""
    config = write_survey(tmp_path)
    nodes = []
    for name in ("a", "b"):
        port_file = tmp_path / f"{name}.port"
        process, port = spawn_serve(
            port_file,
            *("--config", str(config), "--db", str(tmp_path / f"node-{name}.db")),
            *("--store", postgres_url, "--insecure"),
        )
        nodes.append(Node(process, f"127.0.0.1:{port}", f"127.0.0.1:{analyst_port(port_file)}"))
    single = ServerThread(config, tmp_path / "single.sqlite").start()
    yield config, nodes, single
    single.stop()
    for node in nodes:
        node.process.send_signal(signal.SIGTERM)
        node.process.communicate(timeout=30)


def upload(target: str, reports: list, chunk: int = 200) -> None:
    with grpc.insecure_channel(target) as channel:
        collector = ldp_pb2_grpc.CollectorStub(channel)
        for start in range(0, len(reports), chunk):
            request = ldp_pb2.UploadRequest(reports=reports[start : start + chunk])
            statuses = {r.status for r in collector.Upload(request, timeout=30).results}
            assert statuses <= {ldp_pb2.ACCEPTED, ldp_pb2.DUPLICATE}


def send(nodes: list[Node], single: ServerThread, reports: list) -> None:
    """The reports through both nodes (the middle third through each: resends) and to SQLite."""
    third = len(reports) // 3
    upload(nodes[0].target, reports[: 2 * third])
    upload(nodes[1].target, reports[third:])
    upload(single.target, reports)


def cli(*args) -> dict:
    return json.loads(run_cli("agg", *args, check=True).stdout)


def close(got, want, where: str = "") -> None:
    """The same JSON answer, its floats to 1e-12 (the shards sum squares in another order)."""
    if isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for name in want:
            close(got[name], want[name], f"{where}.{name}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            close(a, b, f"{where}[{i}]")
    elif isinstance(want, float):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15, err_msg=where)
    else:
        assert got == want, where


def answers(config: Path, nodes: list[Node], single: ServerThread, url: str, *args: str) -> dict:
    """The answer of ``args`` over --server to node B (node A's is the same, exactly), after
    checking it equals the SQLite store's (--db) and the direct read of the store (--store)."""
    a, b = (cli(*args, "--server", node.analyst_target) for node in nodes)
    assert a == b
    close(b, cli(*args, "--config", config, "--db", single.db))
    close(b, cli(*args, "--config", config, "--store", url))
    return b


def north(single: ServerThread, rng, n: int) -> list:
    batch, _ = messages(single.surveys["field"], "rr", 4 * n, rng)
    mine = [report for report in batch if report.group == "north"][:n]
    assert len(mine) == n
    return mine


@pytest.mark.slow  # a PostgreSQL database, two serve processes and a server
def test_both_nodes_answer_as_sqlite_and_hold_between_releases(cluster, postgres_url):
    config, nodes, single = cluster
    rng = np.random.default_rng(36)
    for question_id in ("rr", "pair"):
        sent, _ = messages(single.surveys["field"], question_id, 600, rng)
        send(nodes, single, sent)
    url = postgres_url
    before = answers(config, nodes, single, url, *ESTIMATE)
    assert before["n"] == 600 and before["design"].startswith("stratified cluster design")
    answers(config, nodes, single, url, *ESTIMATE, "--group", "north", "--variance", "jackknife")
    field = ["test", "--survey", "field", "--json", "--design", "--question"]
    for test in (
        ["rr", "gof", "--p0", "uniform"],
        ["rr", "gof", "--p0", "uniform", "--group", "south", "--correction", "wald"],
        ["rr", "homogeneity", "--variance", "jackknife"],
        ["pair", "independence", "--correction", "second-order"],
    ):
        got = answers(config, nodes, single, url, *field, *test)
        assert 0 < got["pvalue"] < 1 and got["design_df"] == 15
    every = ldp_pb2.TwoSampleRequest(
        survey_a="field", question_a="rr", design=ldp_pb2.DesignOptions()
    )  # no group: every group of the label, here north and south
    homogeneity = []
    for node in nodes:
        with grpc.insecure_channel(node.analyst_target) as channel:
            homogeneity.append(ldp_pb2_grpc.AnalystStub(channel).TwoSample(every, timeout=60))
    want = cli(*field, "rr", "homogeneity", "--config", config, "--db", single.db)
    assert homogeneity[0] == homogeneity[1] and homogeneity[0].n == want["n"] == 600
    np.testing.assert_allclose(homogeneity[0].statistic, want["statistic"], rtol=1e-12)

    send(nodes, single, north(single, rng, MIN_BATCH - 1))  # the live sums move, not the release
    for node in nodes:
        assert cli(*ESTIMATE, "--server", node.analyst_target) == before
    assert cli(*ESTIMATE, "--config", config, "--store", url)["n"] == 600 + MIN_BATCH - 1
    send(nodes, single, north(single, rng, 1))  # the north cell's release moves at +50
    assert answers(config, nodes, single, url, *ESTIMATE)["n"] == 600 + MIN_BATCH

    import psycopg  # the [postgres] extra's: imported once the fixture said the test may run

    with psycopg.connect(url, autocommit=True) as conn:  # as a store released before this version
        conn.execute("DELETE FROM design_releases WHERE group_value = 'north'")
    for node in nodes:
        out = run_cli("agg", *ESTIMATE, "--server", node.analyst_target)
        assert out.returncode == 2 and "predates design snapshots" in out.stderr
    send(nodes, single, north(single, rng, MIN_BATCH))  # the next release has its design rows
    assert answers(config, nodes, single, url, *ESTIMATE)["n"] == 600 + 2 * MIN_BATCH

    sent, _ = messages(single.surveys["field"], "noise", MIN_BATCH - 1, rng)
    send(nodes, single, sent)
    for node in nodes:
        for args in (
            ["estimate", "--survey", "field", "--question", "noise", "--design"],
            ["test", "--survey", "field", "--question", "noise", "gof", "--p0", "uniform",
             "--design"],
        ):  # fmt: skip
            out = run_cli("agg", *args, "--server", node.analyst_target)
            assert out.returncode == 3 and "results are released from 50" in out.stderr


@pytest.mark.slow  # a PostgreSQL database, two serve processes and a server
def test_releases_racing_uploads_on_both_nodes_release_their_design_rows(cluster, postgres_url):
    import psycopg  # the [postgres] extra's: imported once the fixture said the test may run

    _, nodes, single = cluster
    rng = np.random.default_rng(7)
    sent, _ = messages(single.surveys["field"], "rr", 3000, rng)
    refusals: list[str] = []
    answered: list[int] = []
    done = threading.Event()

    def analyst(node: Node) -> None:
        """Design estimates, pooled and of each group, until the uploads are done."""
        request = ldp_pb2.EstimateRequest(
            survey_id="field", question_id="rr", design=ldp_pb2.DesignOptions()
        )
        with grpc.insecure_channel(node.analyst_target) as channel:
            stub = ldp_pb2_grpc.AnalystStub(channel)
            while not done.is_set():
                for group in ("", "north", "south"):
                    request.group = group
                    try:
                        answered.append(stub.Estimate(request, timeout=60).n)
                    except grpc.RpcError as exc:
                        if "released from" not in (exc.details() or ""):  # before 50 reports
                            refusals.append(f"{exc.code()}: {exc.details()}")

    analysts = [threading.Thread(target=analyst, args=(node,)) for node in nodes]
    uploads = [
        threading.Thread(target=upload, args=(node.target, sent[i::2], 10))
        for i, node in enumerate(nodes)
    ]
    for thread in (*analysts, *uploads):
        thread.start()
    for thread in uploads:
        thread.join()
    done.set()
    for thread in analysts:
        thread.join()
    assert refusals == [] and len(answered) > 20
    with psycopg.connect(postgres_url) as conn:
        released = dict(
            conn.execute(
                "SELECT group_value, n FROM releases WHERE survey_id = 'field'"
                " AND question_id = 'rr' AND group_value != ''"
            ).fetchall()
        )
        design = dict(
            conn.execute(
                "SELECT group_value, sum(n) FROM design_releases WHERE survey_id = 'field'"
                " AND question_id = 'rr' GROUP BY group_value"
            ).fetchall()
        )
        looks = conn.execute(
            "SELECT group_value, array_agg(n ORDER BY seq) FROM release_history"
            " WHERE survey_id = 'field' AND question_id = 'rr' AND group_value != ''"
            " GROUP BY group_value"
        ).fetchall()
    assert released.keys() == {"north", "south"} and design == released
    for _, ns in looks:  # releases at least min_batch_size apart, whichever node moved them
        assert all(b - a >= MIN_BATCH for a, b in itertools.pairwise(ns))
        assert len(ns) > 1
