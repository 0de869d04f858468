"""The Analyst on a shared PostgreSQL store: two nodes (``start_server(store_url=...)``, each
with its own Analyst listener) on one real PostgreSQL server, and a SQLite server holding the
same reports, all over real gRPC on loopback.

* An estimate, a test and the released statistic through node A equal those through node B
  and those of the SQLite store (and ``ldp-aggregator estimate --server`` to either node prints
  what ``--db`` prints from the SQLite file, and so does ``--store URL``); a release moves only
  in steps of ``min_batch_size``, whichever node is asked (the released snapshots are shared).
* A holdout query answered by node A is spent on node B.
* A plan registered and sealed through node A's Analyst: node B answers the sealed record,
  refuses confirmation-side uploads, and reads the confirmation side.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from confirm.test_confirm_flow import CONFIG, MOOD, PLAN, code_of, population, reports
from conftest import ServerThread

from aggregator.cli import main as aggregator_main
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

EXPLORATION, CONFIRMATION = ldp_pb2.EXPLORATION, ldp_pb2.CONFIRMATION


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "surveys.toml"
    path.write_text(CONFIG.format(fraction=0.5))
    return path


@pytest.fixture
def nodes(tmp_path: Path, config: Path, postgres_url: str) -> Iterator[list[ServerThread]]:
    """Two nodes on the test's database."""
    started = [
        ServerThread(config, tmp_path / f"node-{name}", store_url=postgres_url).start()
        for name in ("a", "b")
    ]
    yield started
    for server in started:
        server.stop()


def analyst_of(server: ServerThread) -> ldp_pb2_grpc.AnalystStub:
    return ldp_pb2_grpc.AnalystStub(grpc.insecure_channel(server.analyst_target))


def collector_of(server: ServerThread) -> ldp_pb2_grpc.CollectorStub:
    return ldp_pb2_grpc.CollectorStub(grpc.insecure_channel(server.target))


def upload(server: ServerThread, batch: list[ldp_pb2.Report]) -> None:
    response = collector_of(server).Upload(ldp_pb2.UploadRequest(reports=batch), timeout=30)
    assert {r.status for r in response.results} == {ldp_pb2.ACCEPTED}


def answers(server: ServerThread) -> tuple:
    """An estimate, a seeded goodness-of-fit test and the released statistic, as plain data."""
    analyst = analyst_of(server)
    estimate = analyst.Estimate(
        ldp_pb2.EstimateRequest(survey_id="split", question_id="mood"), timeout=30
    )
    test = analyst.GoodnessOfFit(
        ldp_pb2.GoodnessOfFitRequest(survey_id="split", question_id="mood", p0=[0.25] * 4, seed=7),
        timeout=60,
    )
    statistic = analyst.Statistics(
        ldp_pb2.StatisticsRequest(survey_id="split", question_id="pair"), timeout=30
    )
    return (
        (estimate.n, list(estimate.frequencies), list(estimate.ci_low), list(estimate.ci_high)),
        (test.n, test.statistic, test.pvalue, test.reject, test.method),
        (statistic.n, list(statistic.values)),
    )


@pytest.mark.slow  # three servers and a PostgreSQL database
def test_every_node_answers_as_the_sqlite_store(
    nodes, tmp_path: Path, config: Path, postgres_url: str, capsys
) -> None:
    a, b = nodes
    batch = population(a.surveys, n=400)
    upload(a, batch[::2])
    upload(b, batch[1::2])
    sqlite = ServerThread(config, tmp_path / "reports.sqlite").start()
    try:
        upload(sqlite, batch)
        expected = answers(sqlite)
    finally:
        sqlite.stop()
    assert expected[0][0] == 400
    assert answers(a) == expected
    assert answers(b) == expected
    # the command line through any node's Analyst prints what it prints from the SQLite file
    command = ["estimate", "--survey", "split", "--question", "mood", "--json"]
    assert aggregator_main([*command, "--config", str(config), "--db", str(sqlite.db)]) == 0
    from_file = json.loads(capsys.readouterr().out)
    for node in (a, b):
        assert aggregator_main([*command, "--server", node.analyst_target]) == 0
        assert json.loads(capsys.readouterr().out) == from_file
    # and straight from the shared store (read only, like --db)
    assert aggregator_main([*command, "--config", str(config), "--store", postgres_url]) == 0
    assert json.loads(capsys.readouterr().out) == from_file
    gof = ["test", "gof", "--survey", "split", "--question", "mood", "--p0", "uniform", "--json"]
    assert aggregator_main([*gof, "--config", str(config), "--db", str(sqlite.db)]) == 0
    test_from_file = json.loads(capsys.readouterr().out)
    assert aggregator_main([*gof, "--config", str(config), "--store", postgres_url]) == 0
    assert json.loads(capsys.readouterr().out) == test_from_file

    # 19 more (min_batch_size 20): the release does not move, whichever node is asked
    upload(a, reports(a.surveys["split"].question("mood"), MOOD, 19, EXPLORATION, 3))
    request = ldp_pb2.EstimateRequest(survey_id="split", question_id="mood")
    assert analyst_of(b).Estimate(request, timeout=30).n == 400
    assert analyst_of(a).Estimate(request, timeout=30).n == 400
    upload(b, reports(a.surveys["split"].question("mood"), MOOD, 1, EXPLORATION, 4))
    assert analyst_of(a).Estimate(request, timeout=30).n == 420
    assert analyst_of(b).Estimate(request, timeout=30).n == 420


@pytest.mark.slow
def test_a_holdout_query_spent_on_one_node_is_spent_on_the_other(nodes) -> None:
    a, b = nodes
    upload(a, reports(a.surveys["split"].question("mood"), MOOD, 600, CONFIRMATION, 9))
    request = ldp_pb2.HoldoutRequest(
        survey_id="split", question_id="mood", test="goodness_of_fit", p0=[0.25] * 4
    )
    first = analyst_of(a).HoldoutTest(request, timeout=60)
    assert first.reject and (first.query, first.rejections) == (1, 1)
    second = analyst_of(b).HoldoutTest(request, timeout=60)
    assert (second.query, second.rejections, second.max_queries) == (2, 2, 20)
    assert second.level < first.level  # the next level of the same holdout
    code, details = code_of(
        analyst_of(b).Preregister, ldp_pb2.PreregisterRequest(survey_id="split", plan=PLAN)
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "one mode per survey" in details
    code, details = code_of(
        analyst_of(a).Estimate,
        ldp_pb2.EstimateRequest(survey_id="split", question_id="mood", side=CONFIRMATION),
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "reusable holdout" in details


@pytest.mark.slow
def test_a_seal_through_one_node_holds_on_the_other(nodes) -> None:
    a, b = nodes
    upload(b, population(a.surveys))
    confirmation = ldp_pb2.EstimateRequest(survey_id="split", question_id="mood", side=CONFIRMATION)
    code, details = code_of(analyst_of(b).Estimate, confirmation)
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "before its results are sealed" in details

    registered = analyst_of(a).Preregister(
        ldp_pb2.PreregisterRequest(survey_id="split", plan=PLAN), timeout=30
    )
    again = analyst_of(b).Preregister(
        ldp_pb2.PreregisterRequest(survey_id="split", plan=PLAN), timeout=30
    )
    assert again.already and again.plan_sha256 == registered.plan_sha256
    sealed = analyst_of(a).Confirm(ldp_pb2.ConfirmRequest(survey_id="split"), timeout=60)
    assert not sealed.already
    assert [r["n"] for r in json.loads(sealed.results_json)["results"]] == [800, 800]

    late = reports(a.surveys["split"].question("mood"), MOOD, 3, CONFIRMATION, 99)
    code, details = code_of(collector_of(b).Upload, ldp_pb2.UploadRequest(reports=late), timeout=30)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "closed" in details
    on_b = analyst_of(b).Confirm(ldp_pb2.ConfirmRequest(survey_id="split"), timeout=30)
    assert on_b.already and on_b.results_json == sealed.results_json
    assert analyst_of(b).Estimate(confirmation, timeout=30).n == 800


@pytest.mark.slow
def test_a_seal_refused_for_too_little_data_leaves_the_side_open(nodes) -> None:
    """As on SQLite: a plan that cannot run seals nothing, and the confirmation side keeps
    taking reports on every node (the close that preceded the computation is undone)."""
    a, b = nodes
    upload(a, reports(a.surveys["split"].question("mood"), MOOD, 50, CONFIRMATION, 7))
    analyst_of(a).Preregister(ldp_pb2.PreregisterRequest(survey_id="split", plan=PLAN), timeout=30)
    code, details = code_of(
        analyst_of(a).Confirm, ldp_pb2.ConfirmRequest(survey_id="split"), timeout=60
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "0 confirmation-side reports" in details
    upload(b, population(a.surveys))  # both sides, on the other node: still open
    sealed = analyst_of(b).Confirm(ldp_pb2.ConfirmRequest(survey_id="split"), timeout=60)
    assert [r["n"] for r in json.loads(sealed.results_json)["results"]] == [850, 800]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--db", "r.sqlite", "--store", "postgresql://x/y"), "give --db or --store, not both"),
        (("--store", "postgresql://x/y", "--server", "127.0.0.1:1"), "not both"),
        (("--store", "mysql://x/y", "--config", "c.toml"), "--store takes a PostgreSQL URL"),
        (("--store", "postgresql://x/y"), "--store needs --config"),
    ],
)
def test_estimate_store_mistakes_are_one_line(capsys, extra, message) -> None:
    command = ["estimate", "--survey", "split", "--question", "mood", *extra]
    assert aggregator_main(command) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_nodes_releasing_one_cell_at_once_store_one_snapshot(
    tmp_path: Path, config: Path, postgres_url: str
) -> None:
    """Eight release loops on one cell at once, from two stores (two nodes' connections),
    while reports arrive: the snapshots released are at least min_batch_size (20) apart, never
    two closer, and the last is within 20 of the final count."""
    from aggregator.store import ingest
    from aggregator.store.postgres import pins
    from aggregator.store.postgres.engine import PostgresStore
    from aggregator.survey_file.config import load_surveys

    surveys = load_surveys(config)
    question = surveys["split"].question("mood")
    cell = ("split", "mood", EXPLORATION, "")
    seen: set[int] = set()
    lock = threading.Lock()
    with PostgresStore(postgres_url) as one, PostgresStore(postgres_url) as other:
        pins.register(one, surveys)
        stop = threading.Event()

        def release(store: PostgresStore) -> None:
            while not stop.is_set():
                snapshot = store.analysis().release([cell], 20)[cell]
                if snapshot is not None:
                    with lock:
                        seen.add(snapshot[0])

        threads = [threading.Thread(target=release, args=(s,)) for s in (one, other) * 4]
        for t in threads:
            t.start()
        for seed in range(30):  # 30 uploads of 7: 210 reports
            batch = reports(question, MOOD, 7, EXPLORATION, seed)
            one.put(ingest.validate_batch(batch, surveys))
        stop.set()
        for t in threads:
            t.join()
        final = one.analysis().release([cell], 20)[cell]
    assert final is not None and final[0] >= 191
    ordered = sorted(seen | {final[0]})
    assert ordered[0] >= 20
    assert all(b - a >= 20 for a, b in itertools.pairwise(ordered))


def monitored(server: ServerThread) -> tuple:
    """The goodness-of-fit monitor of 'mood' over its release history, as plain data."""
    request = ldp_pb2.MonitorRequest(
        survey_id="split", question_id="mood", analysis="goodness_of_fit", p0=[0.25] * 4
    )
    answer = analyst_of(server).Monitor(request, timeout=60)
    looks = [(look.n, look.log_evalue) for look in answer.looks]
    return answer.n, list(answer.estimate), list(answer.low), list(answer.high), looks


def test_the_monitor_reads_one_shared_history_of_looks(nodes, tmp_path: Path, config: Path) -> None:
    """Releases moved through either node append to one history in PostgreSQL: the monitor's
    looks through node A equal those through node B and those of a SQLite store that released
    at the same counts."""
    a, b = nodes
    question = a.surveys["split"].question("mood")
    batches = [reports(question, MOOD, 40, EXPLORATION, seed) for seed in range(10, 14)]
    sqlite = ServerThread(config, tmp_path / "reports.sqlite").start()
    try:
        for i, batch in enumerate(batches):
            upload([a, b][i % 2], batch)
            upload(sqlite, batch)
            for server in ([a, b][(i + 1) % 2], sqlite):  # a look: the release moves
                request = ldp_pb2.EstimateRequest(survey_id="split", question_id="mood")
                assert analyst_of(server).Estimate(request, timeout=30).n == 40 * (i + 1)
        expected = monitored(sqlite)
    finally:
        sqlite.stop()
    assert [n for n, _ in expected[4]] == [40, 80, 120, 160]
    assert monitored(a) == expected
    assert monitored(b) == expected
