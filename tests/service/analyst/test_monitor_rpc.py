"""The Analyst's Monitor RPC over real gRPC on a real SQLite store: devices upload in batches,
the release history grows only at release points (steps of min_batch_size), and the answer is
exactly the anytime functions fed with the stored looks (docs/monitoring.md)."""

from __future__ import annotations

import os

import grpc
import numpy as np
import pytest
from conftest import ServerThread

import aggregator.remote
from aggregator.stats.anytime import (
    difference_sequence,
    frequency_path,
    frequency_sequence,
    looks_from_sums,
    mean_score_sequence,
    sequential_goodness_of_fit,
    sequential_homogeneity,
    sequential_independence,
)
from aggregator.store.model import StoredReport
from aggregator.store.sqlite import release_history, releases
from aggregator.store.sqlite.report_store import ReportStore
from aggregator.survey_file.config import load_surveys
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

CONFIG = """
[[survey]]
id = "s"
min_batch_size = 50

[[survey.question]]
id = "mood"
categories = ["great", "fine", "low", "bad"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.question]]
id = "pair"
mechanism = "randomized_response"
epsilon = 2.0
attributes = [
    { name = "x", categories = ["x0", "x1"] },
    { name = "y", categories = ["y0", "y1"] },
]

[[survey]]
id = "g"
min_batch_size = 50
group_label = "arm"
group_values = ["control", "treatment"]

[[survey.question]]
id = "mood"
categories = ["great", "fine", "low", "bad"]
mechanism = "randomized_response"
epsilon = 1.0
"""
MOOD = [0.4, 0.3, 0.2, 0.1]
WAIT = 30


def upload(server, question, survey_id, truth, n, seed, group=""):
    """n reports of ``question`` drawn from ``truth``, uploaded over gRPC in one batch."""
    rng = np.random.default_rng(seed)
    mech = question.mechanism
    values = mech.simulate(rng.choice(len(truth), size=n, p=truth), rng)
    batch = [
        ldp_pb2.Report(
            report_id=os.urandom(16),
            survey_id=survey_id,
            question_id=question.id,
            payload=mech.encode(v),
            group=group,
        )
        for v in values
    ]
    with grpc.insecure_channel(server.target) as channel:
        answer = ldp_pb2_grpc.CollectorStub(channel).Upload(
            ldp_pb2.UploadRequest(reports=batch), timeout=WAIT
        )
    assert len(answer.results) == n


@pytest.fixture
def world(tmp_path):
    config = tmp_path / "surveys.toml"
    config.write_text(CONFIG)
    server = ServerThread(config, tmp_path / "reports.sqlite").start()
    channel = grpc.insecure_channel(server.analyst_target)
    yield load_surveys(config), server, ldp_pb2_grpc.AnalystStub(channel)
    channel.close()
    server.stop()


def monitor(analyst, **fields):
    return analyst.Monitor(ldp_pb2.MonitorRequest(**fields), timeout=WAIT)


def test_looks_are_release_points_and_the_answer_is_the_functions_on_them(world):
    surveys, server, analyst = world
    mood = surveys["s"].question("mood")
    ask: dict[str, object] = {"survey_id": "s", "question_id": "mood"}
    ask |= {"analysis": "goodness_of_fit", "p0": [0.25] * 4, "max_n": 5000}
    ns = []
    for step, size in enumerate([120, 30, 30, 200, 10, 60]):
        upload(server, mood, "s", MOOD, size, step)
        ns.append(monitor(analyst, **ask).n)
    assert ns == [120, 120, 180, 380, 380, 450]  # a snapshot moves once 50 more are in
    history = release_history.read(str(server.db), [("s", "mood", 0, "")])
    assert [n for _, n, _ in history] == [120, 180, 380, 450]
    looks = looks_from_sums(mood.mechanism, [(n, sums) for _, n, sums in history])
    answer = monitor(analyst, **ask)
    expected = sequential_goodness_of_fit(looks, [0.25] * 4, 0.05, max_n=5000)
    cs = frequency_sequence(looks[-1], 0.05, tuned_n=5000)
    np.testing.assert_allclose(answer.estimate, cs.estimate, rtol=0, atol=1e-12)
    np.testing.assert_allclose(answer.low, cs.low, rtol=0, atol=1e-12)
    np.testing.assert_allclose(answer.high, cs.high, rtol=0, atol=1e-12)
    assert answer.evalue == pytest.approx(expected.evalue, rel=1e-12)
    assert answer.max_evalue == pytest.approx(expected.max_evalue, rel=1e-12)
    assert answer.pvalue == pytest.approx(expected.pvalue, rel=1e-12)
    assert [look.n for look in answer.looks] == [n for n, _ in expected.path]
    assert not answer.looks[0].estimate  # the path of intervals only with with_path
    drawn = monitor(analyst, **ask, with_path=True)
    for look, cs_then in zip(drawn.looks, frequency_path(looks, 0.05, tuned_n=5000), strict=True):
        np.testing.assert_allclose(look.low, cs_then.low, rtol=0, atol=1e-12)
        np.testing.assert_allclose(look.high, cs_then.high, rtol=0, atol=1e-12)
        np.testing.assert_allclose(look.estimate, cs_then.estimate, rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        [look.log_evalue for look in answer.looks],
        [np.log(e) for _, e in expected.path],
        rtol=0,
        atol=1e-12,
    )
    assert answer.decision == ("reject" if expected.reject else "continue")
    assert answer.labels == ["great", "fine", "low", "bad"]
    assert "time-uniform" in answer.interval_guarantee
    assert "anytime-valid" in answer.test_guarantee
    assert not answer.HasField("evalue") or answer.method.startswith("sequential")


def test_a_strong_alternative_rejects_and_max_n_stops(world):
    surveys, server, analyst = world
    mood = surveys["s"].question("mood")
    for step in range(4):
        upload(server, mood, "s", [0.7, 0.1, 0.1, 0.1], 150, 10 + step)
        answer = monitor(
            analyst, survey_id="s", question_id="mood", analysis="goodness_of_fit", p0=[0.25] * 4
        )
    assert answer.decision == "reject" and answer.max_evalue >= 20 and answer.pvalue <= 0.05
    assert answer.rejected_at <= answer.n
    frequencies = monitor(analyst, survey_id="s", question_id="mood", max_n=600)
    assert frequencies.decision == "stop at max_n" and not frequencies.HasField("evalue")
    assert [look.n for look in frequencies.looks] == [150, 300, 450, 600]
    assert not any(look.HasField("log_evalue") for look in frequencies.looks)
    assert all(lo <= hi for lo, hi in zip(frequencies.low, frequencies.high, strict=True))


def test_independence_and_two_groups_match_the_functions(world):
    surveys, server, analyst = world
    pair, grouped = surveys["s"].question("pair"), surveys["g"].question("mood")
    for step in range(3):
        upload(server, pair, "s", [0.4, 0.1, 0.1, 0.4], 100, 20 + step)
        upload(server, grouped, "g", MOOD, 60, 30 + step, "control")
        upload(server, grouped, "g", [0.1, 0.2, 0.3, 0.4], 70, 40 + step, "treatment")
        ind = monitor(analyst, survey_id="s", question_id="pair", analysis="independence")
        two = monitor(
            analyst,
            survey_id="g",
            question_id="mood",
            analysis="two_sample",
            group_a="control",
            group_b="treatment",
        )
    history = release_history.read(str(server.db), [("s", "pair", 0, "")])
    looks = looks_from_sums(pair.mechanism, [(n, s) for _, n, s in history])
    expected = sequential_independence(looks, (2, 2))
    assert ind.evalue == pytest.approx(expected.evalue, rel=1e-12)
    assert [look.n for look in ind.looks] == [n for n, _ in expected.path]
    cells = [("g", "mood", 0, "control"), ("g", "mood", 0, "treatment")]
    merged = release_history.looks(
        release_history.read(str(server.db), cells), [[cells[0]], [cells[1]]], 4
    )
    both = [[looks_from_sums(grouped.mechanism, [s])[0] for s in look] for look in merged]
    homogeneity = sequential_homogeneity(both)
    diff = difference_sequence(both[-1][0], both[-1][1], tuned_n=10_000)
    assert two.evalue == pytest.approx(homogeneity.evalue, rel=1e-12)
    np.testing.assert_allclose(two.low, diff.low, rtol=0, atol=1e-12)
    assert two.n == both[-1][0].n + both[-1][1].n == 390
    with aggregator.remote.connect(server.analyst_target) as remote:  # the Python client
        again = remote.monitor("g", "mood", "two_sample", groups=("control", "treatment"))
        assert again == two
        with pytest.raises(aggregator.remote.RemoteError, match="group_a and group_b"):
            remote.monitor("g", "mood", "frequencies", groups=("control", "control"), group="x")
    pooled = monitor(analyst, survey_id="g", question_id="mood")
    assert pooled.n == 390  # the pooled stream sums the groups' latest snapshots


@pytest.mark.parametrize(
    ("fields", "code", "words"),
    [
        ({"survey_id": "nope", "question_id": "mood"}, "NOT_FOUND", "nope"),
        ({"survey_id": "s", "question_id": "nope"}, "NOT_FOUND", "nope"),
        (
            {"survey_id": "s", "question_id": "mood", "analysis": "guess"},
            "INVALID_ARGUMENT",
            "analysis must be one of",
        ),
        (
            {
                "survey_id": "s",
                "question_id": "mood",
                "analysis": "goodness_of_fit",
                "p0": [0.5, 0.6, 0, 0],
            },
            "INVALID_ARGUMENT",
            "p0",
        ),
        (
            {"survey_id": "s", "question_id": "mood", "analysis": "independence"},
            "FAILED_PRECONDITION",
            "independence needs exactly 2",
        ),
        (
            {"survey_id": "s", "question_id": "pair"},
            "FAILED_PRECONDITION",
            "results are released from 50",
        ),
        ({"survey_id": "s", "question_id": "mood", "alpha": 1.5}, "INVALID_ARGUMENT", "alpha"),
        (
            {"survey_id": "s", "question_id": "mood", "alpha": float("nan")},
            "INVALID_ARGUMENT",
            "alpha",
        ),
        (
            {
                "survey_id": "s",
                "question_id": "mood",
                "analysis": "goodness_of_fit",
                "p0": [float("nan")] * 4,
            },
            "INVALID_ARGUMENT",
            "p0",
        ),
        (
            {"survey_id": "s", "question_id": "mood", "group_a": "control"},
            "INVALID_ARGUMENT",
            "group_a and group_b go with two_sample",
        ),
        ({"survey_id": "s", "question_id": "mood", "side": 1}, "INVALID_ARGUMENT", "not split"),
        (
            {
                "survey_id": "g",
                "question_id": "mood",
                "analysis": "two_sample",
                "group_a": "control",
            },
            "INVALID_ARGUMENT",
            "group",
        ),
    ],
)
def test_bad_requests_get_specific_codes(world, fields, code, words):
    surveys, server, analyst = world
    upload(server, surveys["s"].question("mood"), "s", MOOD, 60, 1)
    with pytest.raises(grpc.RpcError) as info:
        monitor(analyst, **fields)
    assert info.value.code() == getattr(grpc.StatusCode, code), info.value.details()
    assert words in info.value.details()


def test_a_store_made_before_the_history_starts_it_at_its_snapshot(tmp_path):
    """A cell released before release_history existed: its next move records the snapshot it
    held and the new one, in order, and a race that stores nothing records nothing."""
    store = ReportStore(tmp_path / "store.sqlite")
    store.register_question("plain", "rr", 4)
    cell = ("plain", "rr", 0, "")

    def put(count: int) -> None:
        rows = np.eye(4, dtype=np.int64)[np.arange(count) % 4]
        store.put([StoredReport(os.urandom(16), "plain", "rr", b"\x00", row) for row in rows])

    try:
        put(50)
        assert releases.release(store, [cell], 50)[cell] == (50, [13, 13, 12, 12])
        store.run_in_writer(lambda conn: conn.execute("DROP TABLE release_history"))
        assert release_history.read(store.path, [cell]) == []  # as a store made before it
        put(49)
        assert releases.release(store, [cell], 50)[cell] == (50, [13, 13, 12, 12])  # not due
        put(1)
        releases.release(store, [cell], 50)
        assert [(n, sums) for _, n, sums in release_history.read(store.path, [cell])] == [
            (50, [13, 13, 12, 12]),
            (100, [27, 25, 24, 24]),
        ]
    finally:
        store.close()


def test_the_mean_score_sequence_over_the_looks(world):
    """analysis "mean_score": one row, the running mean score and its confidence sequence,
    exactly mean_score_sequence on the stored looks (default scores 1..k, or given ones); not
    for a question of two attributes, and scores of the wrong length are INVALID_ARGUMENT."""
    surveys, server, analyst = world
    mood = surveys["s"].question("mood")
    for step in range(3):
        upload(server, mood, "s", MOOD, 60, 40 + step)
        monitor(analyst, survey_id="s", question_id="mood")  # a look at each release
    history = release_history.read(str(server.db), [("s", "mood", 0, "")])
    looks = looks_from_sums(mood.mechanism, [(n, sums) for _, n, sums in history])
    for scores in ([], [0.0, 1.0, 5.0, 10.0]):
        ask = {"survey_id": "s", "question_id": "mood", "analysis": "mean_score"}
        answer = monitor(analyst, **ask, scores=scores, with_path=True)
        given = scores or None
        expected = mean_score_sequence(looks[-1], given, 0.05)
        assert answer.labels == ["mean score"] and answer.n == 180
        assert list(answer.estimate) == pytest.approx([expected.mean], abs=1e-12)
        assert list(answer.low) == pytest.approx([expected.low], abs=1e-12)
        assert list(answer.high) == pytest.approx([expected.high], abs=1e-12)
        assert not answer.HasField("evalue") and answer.decision == "continue"
        first = mean_score_sequence(looks[0], given, 0.05)
        assert list(answer.looks[0].low) == pytest.approx([first.low], abs=1e-12)
    with pytest.raises(grpc.RpcError) as info:
        monitor(analyst, survey_id="s", question_id="mood", analysis="mean_score", scores=[1, 2])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    upload(server, surveys["s"].question("pair"), "s", [0.25] * 4, 60, 50)
    with pytest.raises(grpc.RpcError) as info:
        monitor(analyst, survey_id="s", question_id="pair", analysis="mean_score")
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
