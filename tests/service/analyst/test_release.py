"""No differencing below the release threshold (docs/threat-model.md, "What is released"), over
a real gRPC server on loopback with a real SQLite store: pooled minus the other groups recovers
nothing of a group below ``min_batch_size``; an estimate polled before and after one upload is
identical, and moves once ``min_batch_size`` more reports arrived; the released snapshot survives
a restart and a ``--workers 2`` server; concurrent readers never release two snapshots of a cell
closer than ``min_batch_size``."""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest
from aggregator_process import analyst_port, spawn_serve
from conftest import ServerThread

from aggregator.histogram import Histogram
from aggregator.stats import estimate
from aggregator.store.model import StoredReport
from aggregator.store.sqlite import releases
from aggregator.store.sqlite.report_store import ReportStore
from aggregator.survey_file.config import load_surveys
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

M = 20  # min_batch_size of both surveys
SURVEYS = f"""
[[survey]]
id = "trial"
min_batch_size = {M}
group_label = "arm"
group_values = ["control", "treatment", "pilot"]

[[survey.question]]
id = "rr"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey]]
id = "plain"
min_batch_size = {M}

[[survey.question]]
id = "rr"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "surveys.toml"
    path.write_text(SURVEYS)
    return path


@pytest.fixture
def server(tmp_path: Path, config: Path):
    running = ServerThread(config, tmp_path / "store.sqlite").start()
    yield running
    running.stop()


class Client:
    """A device's uploads and an analyst's reads on one server; the reports' randomized values
    kept per (survey, group), to compare releases with the library."""

    def __init__(self, target: str, analyst: str, surveys, seed: int = 5) -> None:
        self.channel = grpc.insecure_channel(target)
        self.analyst_channel = grpc.insecure_channel(analyst)
        self.collector = ldp_pb2_grpc.CollectorStub(self.channel)
        self.analyst = ldp_pb2_grpc.AnalystStub(self.analyst_channel)
        self.surveys = surveys
        self.rng = np.random.default_rng(seed)
        self.sent: dict[tuple[str, str], list[int]] = {}

    def upload(self, survey_id: str, count: int, group: str = "") -> None:
        question = self.surveys[survey_id].question("rr")
        mech = question.mechanism
        randomized = mech.simulate(self.rng.integers(0, mech.k, size=count), self.rng)
        self.sent.setdefault((survey_id, group), []).extend(int(r) for r in randomized)
        reports = [
            ldp_pb2.Report(
                report_id=os.urandom(16),
                survey_id=survey_id,
                question_id="rr",
                payload=mech.encode(r),
                definition_digest=question.digest,
                group=group,
            )
            for r in randomized
        ]
        response = self.collector.Upload(ldp_pb2.UploadRequest(reports=reports), timeout=30)
        assert [r.status for r in response.results] == [ldp_pb2.ACCEPTED] * count

    def estimate(self, survey_id: str, group: str = "") -> tuple[ldp_pb2.EstimateResponse, dict]:
        request = ldp_pb2.EstimateRequest(survey_id=survey_id, question_id="rr", group=group)
        response, call = self.analyst.Estimate.with_call(request, timeout=30)
        return response, dict(call.trailing_metadata())

    def library(self, survey_id: str, *groups: str) -> Histogram:
        """The histogram of everything sent to ``groups`` (the library's view of a release)."""
        mech = self.surveys[survey_id].question("rr").mechanism
        values = [v for group in groups for v in self.sent.get((survey_id, group), [])]
        return Histogram.from_reports(mech, np.array(values, dtype=np.int64))

    def close(self) -> None:
        self.channel.close()
        self.analyst_channel.close()


def refused(call, *args) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(*args)
    return caught.value


def test_pooled_minus_the_other_groups_recovers_nothing_below_the_threshold(server):
    client = Client(server.target, server.analyst_target, server.surveys)
    client.upload("trial", 60, "control")
    client.upload("trial", 40, "treatment")
    client.upload("trial", M - 1, "pilot")  # one short of the threshold
    pooled, metadata = client.estimate("trial")
    control, _ = client.estimate("trial", "control")
    treatment, _ = client.estimate("trial", "treatment")
    assert metadata["ldp-released-groups"] == '["control", "treatment"]'
    assert pooled.n - control.n - treatment.n == 0  # the pilot's reports are in no release
    released = estimate(client.library("trial", "control", "treatment"))
    np.testing.assert_allclose(pooled.frequencies, released.frequencies, rtol=1e-12)
    error = refused(client.estimate, "trial", "pilot")  # still refused on its own
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "has fewer than 20 reports" in error.details()
    assert str(M - 1) not in error.details()  # and its count is not said
    client.upload("trial", 1, "pilot")  # now it reaches the threshold: released, and pooled
    pooled, metadata = client.estimate("trial")
    assert metadata["ldp-released-groups"] == '["control", "treatment", "pilot"]'
    assert pooled.n == 60 + 40 + M
    client.close()


def test_pooled_read_with_no_group_released_is_refused(server):
    client = Client(server.target, server.analyst_target, server.surveys)
    for group in ("control", "treatment", "pilot"):
        client.upload("trial", M - 1, group)  # 57 reports in all, no group at 20
    error = refused(client.estimate, "trial")
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no arm of trial/rr has reached 20 reports" in error.details()
    client.close()


@pytest.mark.parametrize(
    ("survey_id", "group"), [("trial", ""), ("trial", "control"), ("plain", "")]
)
def test_one_upload_between_two_reads_changes_nothing_until_the_threshold_more(
    server, survey_id, group
):
    client = Client(server.target, server.analyst_target, server.surveys)
    into = group or ("control" if survey_id == "trial" else "")
    client.upload(survey_id, 3 * M, into)
    first, _ = client.estimate(survey_id, group)
    assert first.n == 3 * M
    for _trial in range(M - 1):  # every one-report upload that stays short of a new step
        before, _ = client.estimate(survey_id, group)
        client.upload(survey_id, 1, into)
        after, _ = client.estimate(survey_id, group)
        assert after == before == first  # identical: the upload is not in the release
    test = client.analyst.GoodnessOfFit(
        ldp_pb2.GoodnessOfFitRequest(
            survey_id=survey_id, question_id="rr", p0=[0.25] * 4, group=group
        ),
        timeout=30,
    )
    assert test.n == first.n  # the tests read the same release
    client.upload(survey_id, 1, into)  # the M-th report since the snapshot: the release moves
    moved, _ = client.estimate(survey_id, group)
    assert moved.n == 4 * M
    mine = estimate(client.library(survey_id, into))
    np.testing.assert_allclose(moved.frequencies, mine.frequencies, rtol=1e-12)
    client.close()


def test_twenty_single_uploads_each_watched_reveal_nothing(server):
    """The attack of issue 24 on the pooled read: poll, upload one report, poll; 20 trials."""
    client = Client(server.target, server.analyst_target, server.surveys)
    client.upload("trial", 2 * M, "control")
    client.upload("trial", 2 * M, "treatment")
    first, _ = client.estimate("trial")
    revealed = 0
    for trial in range(20):  # ten reports into each released group: neither grows by M
        before, _ = client.estimate("trial")
        client.upload("trial", 1, ("control", "treatment")[trial % 2])
        after, _ = client.estimate("trial")
        revealed += before != after or after != first
    assert revealed == 0
    client.close()


def released_rows(db: Path) -> list[tuple]:
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute(
            "SELECT survey_id, question_id, side, group_value, n FROM releases"
        ).fetchall()


def test_the_snapshot_survives_a_restart(tmp_path, config):
    db = tmp_path / "store.sqlite"
    server = ServerThread(config, db).start()
    client = Client(server.target, server.analyst_target, server.surveys)
    client.upload("plain", M + 5)
    before, _ = client.estimate("plain")
    client.upload("plain", M - 1)
    client.close()
    server.stop()
    assert released_rows(db) == [("plain", "rr", 0, "", M + 5)]
    server = ServerThread(config, db).start()
    client = Client(server.target, server.analyst_target, server.surveys)
    after, _ = client.estimate("plain")
    assert after == before  # the M - 1 reports since the snapshot are still not released
    client.upload("plain", 1)
    moved, _ = client.estimate("plain")
    assert moved.n == 2 * M + 5
    client.close()
    server.stop()


@contextmanager
def serving(tmp_path: Path, config: Path, workers: int) -> Iterator[tuple[str, str]]:
    """A server on ``config``: in this process (0), or ``serve --workers N``; its device and
    Analyst targets."""
    db = tmp_path / "store.sqlite"
    if not workers:
        server = ServerThread(config, db).start()
        yield server.target, server.analyst_target
        server.stop()
        return
    port_file = tmp_path / "port"
    process, port = spawn_serve(
        port_file, "--config", str(config), "--db", str(db), "--insecure",
        "--workers", str(workers),
    )  # fmt: skip
    try:
        yield f"127.0.0.1:{port}", f"127.0.0.1:{analyst_port(port_file)}"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


@pytest.mark.parametrize("workers", [0, 2])
def test_concurrent_readers_never_release_two_snapshots_closer_than_the_threshold(
    tmp_path, config, workers
):
    """Six analysts (their own connections; with --workers 2 the uploads spread over both
    processes and the Analyst listener is the first worker's) poll while reports arrive one by
    one."""
    surveys = load_surveys(config)
    seen: list[ldp_pb2.EstimateResponse] = []
    done = threading.Event()
    with serving(tmp_path, config, workers) as (target, analyst):
        uploader = Client(target, analyst, surveys)
        uploader.upload("plain", M)

        def read() -> None:
            reader = Client(target, analyst, surveys)
            while not done.is_set():
                try:
                    seen.append(reader.estimate("plain")[0])
                except grpc.RpcError as exc:  # one caller's concurrent analyses are limited
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            reader.close()

        readers = [threading.Thread(target=read) for _ in range(6)]
        for thread in readers:
            thread.start()
        for _ in range(5 * M):  # one report at a time, while six analysts poll
            uploader.upload("plain", 1)
        done.set()
        for thread in readers:
            thread.join(timeout=60)
        uploader.close()
    ns = sorted({response.n for response in seen})
    assert ns[0] >= M and all(b - a >= M for a, b in itertools.pairwise(ns))
    assert ns[-1] >= 4 * M  # the release did move as the reports arrived
    by_n = {response.n: response for response in seen}
    assert all(response == by_n[response.n] for response in seen)  # one snapshot per n


def test_a_workers_server_releases_the_same_snapshots(tmp_path, config):
    """``--workers 2``: the worker serving the Analyst writes a due snapshot on its own
    connection while uploads reach both workers; a server on the same store after it releases
    the same one."""
    db = tmp_path / "store.sqlite"
    port_file = tmp_path / "port"
    process, port = spawn_serve(
        port_file, "--config", str(config), "--db", str(db), "--insecure", "--workers", "2"
    )
    surveys = load_surveys(config)
    analyst = f"127.0.0.1:{analyst_port(port_file)}"
    try:
        clients = [Client(f"127.0.0.1:{port}", analyst, surveys, seed=i) for i in range(4)]
        clients[0].upload("trial", M, "treatment")
        reads = [client.estimate("trial", "treatment")[0] for client in clients]
        clients[1].upload("trial", M - 1, "treatment")
        reads += [client.estimate("trial", "treatment")[0] for client in clients]
        assert all(read == reads[0] for read in reads) and reads[0].n == M
        for client in clients:
            client.close()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    assert released_rows(db) == [("trial", "rr", 0, "treatment", M)]
    server = ServerThread(config, db).start()
    client = Client(server.target, server.analyst_target, server.surveys)
    assert client.estimate("trial", "treatment")[0] == reads[0]
    client.close()
    server.stop()


def test_a_snapshot_write_decides_again_on_what_is_committed(tmp_path):
    """Two analysts race: A finds a snapshot due, B reads after more reports and stores a newer
    one before A's write transaction starts. A's write stores nothing older: it releases B's."""
    store = ReportStore(tmp_path / "store.sqlite")
    store.register_question("plain", "rr", 4)
    cell = ("plain", "rr", 0, "")

    def put(count: int) -> None:
        rows = np.eye(4, dtype=np.int64)[np.arange(count) % 4]
        store.put([StoredReport(os.urandom(16), "plain", "rr", b"\x00", row) for row in rows])

    class Late:
        """The store, whose next write transaction starts after B's release (a real race's
        order, made certain)."""

        path = store.path

        @staticmethod
        def run_in_writer(fn):
            put(5)
            assert releases.release(store, [cell], M) == {cell: (M + 5, [7, 6, 6, 6])}  # B
            return store.run_in_writer(fn)

    put(M)
    assert releases.release(Late, [cell], M) == {cell: (M + 5, [7, 6, 6, 6])}  # A: B's
    store.close()
    assert released_rows(tmp_path / "store.sqlite") == [(*cell, M + 5)]
