"""Explore, then confirm, end to end: a split survey over a real gRPC server on loopback and a
real SQLite store, and the same flow through ldp-aggregator's commands (docs/adaptive-analysis.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3

import grpc
import numpy as np
import pytest
from conftest import ServerThread

from aggregator.analysis.survey_data import open_survey
from aggregator.cli import main
from aggregator.confirm.sparse_validate import level
from aggregator.errors import ConfirmationError
from aggregator.service.server.app import open_store
from aggregator.store import ingest
from aggregator.store.definitions import SplitChangedError
from aggregator.store.sqlite import pins
from aggregator.store.sqlite.report_store import ReportStore
from aggregator.store.sqlite.schema import SCHEMA_VERSION
from aggregator.survey_file.config import load_surveys
from client.device.ledger import Budget
from client.device.reporter import Reporter
from client.device.transport import Transport
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

CONFIG = """
[[survey]]
id = "split"
min_batch_size = 20
exploration_fraction = {fraction}

[[survey.question]]
id = "mood"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 2.0

[[survey.question]]
id = "pair"
mechanism = "randomized_response"
epsilon = 2.0
attributes = [
    {{ name = "x", categories = ["x0", "x1"] }},
    {{ name = "y", categories = ["y0", "y1"] }},
]

[[survey]]
id = "plain"
min_batch_size = 5

[[survey.question]]
id = "q"
categories = ["a", "b"]
mechanism = "randomized_response"
epsilon = 1.0
"""

PLAN = """survey = "split"
alpha = 0.05

[[test]]
title = "mood is not uniform"
question = "mood"
test = "goodness_of_fit"
p0 = [0.25, 0.25, 0.25, 0.25]

[[test]]
title = "x and y are dependent"
question = "pair"
test = "independence"
"""
OTHER_PLAN = PLAN.replace("alpha = 0.05", "alpha = 0.01")
MOOD = [0.4, 0.3, 0.2, 0.1]
PAIR = [0.4, 0.1, 0.1, 0.4]  # strongly dependent
EXPLORATION, CONFIRMATION = ldp_pb2.EXPLORATION, ldp_pb2.CONFIRMATION


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "surveys.toml"
    path.write_text(CONFIG.format(fraction=0.5))
    return path


def reports(question, truth, n, side, seed, survey="split"):
    """n randomized reports of ``question`` drawn from ``truth``, all on ``side``."""
    rng = np.random.default_rng(seed)
    mech = question.mechanism
    values = mech.simulate(rng.choice(len(truth), size=n, p=truth), rng)
    return [
        ldp_pb2.Report(
            report_id=os.urandom(16),
            survey_id=survey,
            question_id=question.id,
            payload=mech.encode(v),
            side=side,
        )
        for v in values
    ]


def population(surveys, seed=0, n=800):
    """Both questions on both sides: n reports each."""
    survey = surveys["split"]
    out = []
    for i, side in enumerate((EXPLORATION, CONFIRMATION)):
        out += reports(survey.question("mood"), MOOD, n, side, seed + 2 * i)
        out += reports(survey.question("pair"), PAIR, n, side, seed + 2 * i + 1)
    return out


def fill(db, surveys, batch):
    """Store reports offline (as a server would): validated, committed."""
    store = open_store(surveys, str(db))
    try:
        upload = ingest.validate_upload(batch, surveys)
        store.submit_batches(upload.batches).result()
    finally:
        store.close()


def cli(capsys, *args):
    """ldp-aggregator in this process: (exit status, stdout, stderr)."""
    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def one_line_error(err: str, fragment: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in err, err


def code_of(call, *args, **kwargs) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value.code(), info.value.details()


def test_the_flow_over_grpc(tmp_path, config, capsys):
    """Explore freely, find the confirmation side locked, preregister, confirm once, get the
    sealed results unchanged on every later call, and find the confirmation side closed to
    uploads and open to reading, also after a restart."""
    db = tmp_path / "reports.sqlite"
    server = ServerThread(config, db).start()
    try:
        channel = grpc.insecure_channel(server.target)
        collector = ldp_pb2_grpc.CollectorStub(channel)
        analyst = ldp_pb2_grpc.AnalystStub(grpc.insecure_channel(server.analyst_target))
        collector.Upload(ldp_pb2.UploadRequest(reports=population(server.surveys)))

        request = ldp_pb2.EstimateRequest(survey_id="split", question_id="mood")
        estimate, call = analyst.Estimate.with_call(request)
        assert estimate.n == 800
        assert ("ldp-label", "exploratory") in tuple(call.trailing_metadata())

        for reading in (
            lambda: analyst.Estimate(
                ldp_pb2.EstimateRequest(survey_id="split", question_id="mood", side=CONFIRMATION)
            ),
            lambda: analyst.GoodnessOfFit(
                ldp_pb2.GoodnessOfFitRequest(
                    survey_id="split", question_id="mood", p0=[0.25] * 4, side=CONFIRMATION
                )
            ),
            lambda: analyst.Independence(
                ldp_pb2.IndependenceRequest(
                    survey_id="split", question_id="pair", side=CONFIRMATION
                )
            ),
        ):
            code, details = code_of(reading)
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert "cannot be read before its results are sealed" in details
        status, _, err = cli(
            capsys, "estimate", "--config", str(config), "--db", str(db),
            "--survey", "split", "--question", "mood", "--side", "confirmation",
        )  # fmt: skip
        assert status == 2
        one_line_error(err, "cannot be read before its results are sealed")
        status, _, err = cli(
            capsys, "report", "--config", str(config), "--db", str(db), "--survey", "split",
            "--out", str(tmp_path / "r.html"), "--side", "confirmation",
        )  # fmt: skip
        assert status == 2 and not (tmp_path / "r.html").exists()
        one_line_error(err, "cannot be read before its results are sealed")

        confirm = ldp_pb2.ConfirmRequest(survey_id="split")
        code, details = code_of(analyst.Confirm, confirm)
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "no plan is registered" in details

        registered = analyst.Preregister(ldp_pb2.PreregisterRequest(survey_id="split", plan=PLAN))
        assert registered.plan_sha256 == hashlib.sha256(PLAN.encode()).hexdigest()
        assert not registered.already
        again = analyst.Preregister(ldp_pb2.PreregisterRequest(survey_id="split", plan=PLAN))
        assert again.already and again.registered_at == registered.registered_at
        other = ldp_pb2.PreregisterRequest(survey_id="split", plan=OTHER_PLAN)
        code, details = code_of(analyst.Preregister, other)
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "another plan" in details
        holdout = ldp_pb2.HoldoutRequest(
            survey_id="split", question_id="mood", test="goodness_of_fit", p0=[0.25] * 4
        )
        code, details = code_of(analyst.HoldoutTest, holdout)
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "one mode per survey" in details
        locked = ldp_pb2.EstimateRequest(survey_id="split", question_id="mood", side=CONFIRMATION)
        code, _ = code_of(analyst.Estimate, locked)
        assert code == grpc.StatusCode.FAILED_PRECONDITION  # registered is not sealed

        sealed = analyst.Confirm(confirm)
        assert not sealed.already and sealed.plan_sha256 == registered.plan_sha256
        record = json.loads(sealed.results_json)
        assert [r["reject"] for r in record["results"]] == [True, True]
        assert [r["n"] for r in record["results"]] == [800, 800]
        assert record["multiplicity"] == "holm" and record["plan"] == PLAN
        second = analyst.Confirm(confirm)
        assert second.already
        assert (second.results_json, second.sealed_at, second.plan_sha256) == (
            sealed.results_json,
            sealed.sealed_at,
            sealed.plan_sha256,
        )

        late = reports(server.surveys["split"].question("mood"), MOOD, 3, CONFIRMATION, 99)
        code, details = code_of(collector.Upload, ldp_pb2.UploadRequest(reports=late))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert "confirmation side is closed" in details
        fresh = reports(server.surveys["split"].question("mood"), MOOD, 3, EXPLORATION, 98)
        results = collector.Upload(ldp_pb2.UploadRequest(reports=fresh)).results
        assert all(r.status == ldp_pb2.ACCEPTED for r in results)

        device = Reporter(Transport(server.target), tmp_path / "device.sqlite", Budget(10.0))
        while device.side("split") != CONFIRMATION:  # a device on the closed side
            device.close()
            (tmp_path / "device.sqlite").unlink()
            device = Reporter(Transport(server.target), tmp_path / "device.sqlite", Budget(10.0))
        device.answer("split", "mood", "a")
        flushed = device.flush()
        device.close()
        assert (flushed.accepted, flushed.rejected, flushed.pending) == (0, 1, 0)
        assert flushed.refusals[0].startswith("FAILED_PRECONDITION")

        readable = analyst.Estimate(
            ldp_pb2.EstimateRequest(survey_id="split", question_id="mood", side=CONFIRMATION)
        )
        assert readable.n == 800  # the refused upload changed nothing
        code, details = code_of(analyst.Preregister, other)
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "sealed" in details

        server.stop()
        server = ServerThread(config, db).start()
        channel = grpc.insecure_channel(server.target)
        collector = ldp_pb2_grpc.CollectorStub(channel)
        analyst = ldp_pb2_grpc.AnalystStub(grpc.insecure_channel(server.analyst_target))
        code, _ = code_of(collector.Upload, ldp_pb2.UploadRequest(reports=late))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        after = analyst.Confirm(confirm)
        assert after.already and after.results_json == sealed.results_json
    finally:
        server.stop()


def test_the_side_must_fit_the_survey(tmp_path, config):
    server = ServerThread(config, tmp_path / "reports.sqlite").start()
    try:
        channel = grpc.insecure_channel(server.target)
        collector = ldp_pb2_grpc.CollectorStub(channel)
        analyst = ldp_pb2_grpc.AnalystStub(grpc.insecure_channel(server.analyst_target))
        mood = server.surveys["split"].question("mood")
        plain = server.surveys["plain"].question("q")
        for bad, fragment in (
            (reports(mood, MOOD, 1, ldp_pb2.SIDE_UNSPECIFIED, 1), "must carry its side"),
            (reports(mood, MOOD, 1, 7, 1), "must carry its side"),
            (reports(plain, [0.5, 0.5], 1, EXPLORATION, 2, "plain"), "not split"),
        ):
            code, details = code_of(collector.Upload, ldp_pb2.UploadRequest(reports=bad))
            assert code == grpc.StatusCode.FAILED_PRECONDITION and fragment in details
        request = ldp_pb2.EstimateRequest(survey_id="plain", question_id="q", side=EXPLORATION)
        code, _ = code_of(analyst.Estimate, request)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        code, details = code_of(analyst.Confirm, ldp_pb2.ConfirmRequest(survey_id="plain"))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "not split" in details
    finally:
        server.stop()


def test_the_flow_through_the_commands(tmp_path, config, capsys):
    db = tmp_path / "reports.sqlite"
    surveys = load_surveys(config)
    fill(db, surveys, population(surveys))
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    common = ("--config", str(config), "--db", str(db))

    status, out, _ = cli(capsys, "estimate", *common, "--survey", "split", "--question", "mood")
    assert status == 0 and out.startswith("exploratory:") and "n = 800" in out
    status, out, _ = cli(
        capsys, "estimate", *common, "--survey", "split", "--question", "mood", "--json"
    )
    assert json.loads(out)["exploratory"] is True
    status, _, err = cli(capsys, "confirm", *common, "--survey", "split")
    assert status == 2
    one_line_error(err, "no plan is registered")

    status, out, _ = cli(capsys, "preregister", *common, "--survey", "split", "--plan", str(plan))
    sha = hashlib.sha256(PLAN.encode()).hexdigest()
    assert status == 0 and f"plan sha256 {sha} registered at" in out
    status, out, _ = cli(capsys, "preregister", *common, "--survey", "split", "--plan", str(plan))
    assert status == 0 and "already registered" in out

    status, first, _ = cli(capsys, "confirm", *common, "--survey", "split")
    assert status == 0 and "sealed now" in first and sha in first
    assert first.count("reject H0") == 2 and "do not reject" not in first
    status, second, _ = cli(capsys, "confirm", *common, "--survey", "split")
    assert status == 0 and second == first.replace("sealed now", "sealed earlier, unchanged")
    status, again, _ = cli(capsys, "confirm", *common, "--survey", "split", "--json")
    record = json.loads(again)
    assert record["already"] and record["plan_sha256"] == sha

    plan.write_text(OTHER_PLAN)
    status, _, err = cli(capsys, "preregister", *common, "--survey", "split", "--plan", str(plan))
    assert status == 2
    one_line_error(err, "its results are sealed; a different plan is refused")

    status, out, _ = cli(
        capsys, "estimate", *common, "--survey", "split", "--question", "mood",
        "--side", "confirmation",
    )  # fmt: skip
    assert status == 0 and "exploratory" not in out and "n = 800" in out
    data = open_survey(config, db, "split", "confirmation")
    assert data["mood"].n == 800 and not data.exploratory
    for side, label in (("exploration", "exploratory:"), ("confirmation", "after its results")):
        out_file = tmp_path / f"{side}.md"
        status, _, _ = cli(
            capsys, "report", *common, "--survey", "split", "--out", str(out_file),
            "--format", "md", "--side", side,
        )  # fmt: skip
        assert status == 0 and label in out_file.read_text()
    status, _, err = cli(
        capsys, "estimate", *common, "--survey", "plain", "--question", "q", "--side", "exploration"
    )
    assert status == 2
    one_line_error(err, "not split")


def test_holdout_stops_after_m_queries(tmp_path, config, capsys):
    """Data where H0 holds: no rejections, so the holdout closes after m = 3 answers; each
    answer shows its level beta_i = alpha / (m l_i) and the guarantee."""
    db = tmp_path / "reports.sqlite"
    surveys = load_surveys(config)
    uniform = [0.25] * 4
    fill(db, surveys, reports(surveys["split"].question("mood"), uniform, 600, CONFIRMATION, 5))
    common = ("--config", str(config), "--db", str(db), "--survey", "split")
    query = (*common, "--question", "mood", "gof", "--p0", "0.25,0.25,0.25,0.25")
    for i in range(1, 4):
        status, out, _ = cli(capsys, "holdout", *query, "--max-queries", "3")
        assert status == 0, out
        assert f"holdout query {i} (goodness_of_fit on mood): do not reject H0" in out
        assert f"at level {level(i, 3, 3, 0.05):.3g}" in out
        assert "at most 0.05" in out
    assert "answered its 3 queries" in out
    status, _, err = cli(capsys, "holdout", *query)
    assert status == 2
    one_line_error(err, "answered its 3 queries and is closed")
    status, _, err = cli(capsys, "holdout", *query, "--max-queries", "5")
    assert status == 2
    one_line_error(err, "cannot change")
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    status, _, err = cli(capsys, "preregister", *common, "--plan", str(plan))
    assert status == 2
    one_line_error(err, "one mode per survey")
    status, _, err = cli(
        capsys, "estimate", *common, "--question", "mood", "--side", "confirmation"
    )
    assert status == 2
    one_line_error(err, "reusable holdout")


def test_holdout_stops_after_b_rejections(tmp_path, config, capsys):
    db = tmp_path / "reports.sqlite"
    surveys = load_surveys(config)
    fill(db, surveys, reports(surveys["split"].question("mood"), MOOD, 800, CONFIRMATION, 6))
    query = (
        "--config", str(config), "--db", str(db), "--survey", "split", "--question", "mood",
        "gof", "--p0", "0.25,0.25,0.25,0.25",
    )  # fmt: skip
    status, out, _ = cli(capsys, "holdout", *query, "--max-rejections", "2", "--max-queries", "9")
    assert status == 0 and "holdout query 1" in out and ": reject H0" in out
    status, out, _ = cli(capsys, "holdout", *query)
    assert status == 0 and "holdout query 2" in out and ": reject H0" in out
    assert "budget of 2 rejections" in out
    status, _, err = cli(capsys, "holdout", *query)
    assert status == 2
    one_line_error(err, "reached its budget of 2 rejections")


def test_too_little_confirmation_data_seals_nothing(tmp_path, config, capsys):
    db = tmp_path / "reports.sqlite"
    surveys = load_surveys(config)
    fill(db, surveys, reports(surveys["split"].question("mood"), MOOD, 50, CONFIRMATION, 7))
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    common = ("--config", str(config), "--db", str(db), "--survey", "split")
    assert cli(capsys, "preregister", *common, "--plan", str(plan))[0] == 0
    status, _, err = cli(capsys, "confirm", *common)
    assert status == 3
    one_line_error(err, "nothing sealed")
    with pytest.raises(ConfirmationError):
        open_survey(config, db, "split", "confirmation")  # still locked


def test_a_split_change_is_refused_once_data_exist(tmp_path, config, capsys):
    db = tmp_path / "reports.sqlite"
    surveys = load_surveys(config)
    store = open_store(surveys, str(db))
    store.close()
    config.write_text(CONFIG.format(fraction=0.3))  # no reports yet: the pin follows
    changed = load_surveys(config)
    fill(db, changed, reports(changed["split"].question("mood"), MOOD, 30, EXPLORATION, 8))
    config.write_text(CONFIG.format(fraction=0.5))
    with pytest.raises(SplitChangedError, match=r"exploration_fraction is 0\.5"):
        open_store(load_surveys(config), str(db)).close()
    status, _, err = cli(
        capsys, "estimate", "--config", str(config), "--db", str(db), "--survey", "split",
        "--question", "mood",
    )  # fmt: skip
    assert status == 2
    one_line_error(err, "the split of a survey with reports cannot change")
    config.write_text(CONFIG.format(fraction=0))
    with pytest.raises(SplitChangedError):
        open_store(load_surveys(config), str(db)).close()


def test_a_version_1_store_is_migrated(tmp_path, config):
    """A store written before splits: its reports stay, on side 0, and it gains the side
    column and table; statistics and a rebuild agree."""
    db = tmp_path / "old.sqlite"
    conn = sqlite3.connect(db)
    conn.executescript(
        """
        CREATE TABLE reports (report_id BLOB PRIMARY KEY, survey_id TEXT NOT NULL,
            question_id TEXT NOT NULL, payload BLOB NOT NULL, received_at INTEGER NOT NULL
        ) WITHOUT ROWID;
        CREATE TABLE statistics (survey_id TEXT NOT NULL, question_id TEXT NOT NULL,
            k INTEGER NOT NULL, n INTEGER NOT NULL, sums BLOB NOT NULL,
            PRIMARY KEY (survey_id, question_id));
        PRAGMA application_id = 1279545427;
        PRAGMA user_version = 1;
        """
    )
    sums = np.array([0, 1], dtype="<i8").tobytes()
    conn.execute("INSERT INTO statistics VALUES ('plain', 'q', 2, 1, ?)", (sums,))
    payload = (1).to_bytes(4, "little")
    conn.execute("INSERT INTO reports VALUES (?, 'plain', 'q', ?, 0)", (b"r" * 16, payload))
    conn.commit()
    conn.close()
    surveys = load_surveys(config)
    with ReportStore(db) as store:
        pins.register(store, surveys)
        assert store.statistics("plain", "q")[0] == 1
        one_hot = lambda s, q, p: ingest.contribution(surveys[s].question(q), p)  # noqa: E731
        assert store.rebuild(one_hot)["plain", "q"][0] == 1
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("SELECT side FROM reports").fetchall() == [(0,)]
    conn.close()


def test_a_split_survey_is_exported_one_readable_side_at_a_time(tmp_path, config, capsys):
    """export writes one side (named in the manifest), the confirmation side only once sealed;
    the Beam job labels the exploration side's results exploratory, refuses a mix of sides, and
    import puts the reports back on their side."""
    db = tmp_path / "reports.sqlite"
    surveys = load_surveys(config)
    fill(db, surveys, population(surveys, n=60))
    common = ("--config", str(config), "--db", str(db), "--survey", "split")
    status, _, err = cli(
        capsys, "export", *common, "--side", "confirmation", "--out", str(tmp_path / "c")
    )
    assert status == 2 and not (tmp_path / "c").exists()
    one_line_error(err, "cannot be read before its results are sealed")
    status, out, _ = cli(capsys, "export", *common, "--out", str(tmp_path / "e"))
    assert status == 0 and "120 reports of split (exploration side)" in out
    assert json.loads((tmp_path / "e" / "manifest.json").read_text())["side"] == "exploration"

    results = tmp_path / "results.json"
    job = ["job", "--surveys", str(config), "--shards", str(tmp_path / "e"), "--out", str(results)]
    status, out, _ = cli(capsys, *job)
    assert status == 0 and "released, exploration side (exploratory)" in out
    document = json.loads(results.read_text())
    assert {(r["question"], r["n"], r["side"], r["exploratory"]) for r in document["results"]} == {
        ("mood", 60, "exploration", True),
        ("pair", 60, "exploration", True),
    }

    registered = tmp_path / "plan.toml"
    registered.write_text(PLAN)
    assert cli(capsys, "preregister", *common, "--plan", str(registered))[0] == 0
    assert cli(capsys, "confirm", *common)[0] == 0
    status, out, _ = cli(
        capsys, "export", *common, "--side", "confirmation", "--out", str(tmp_path / "c")
    )
    assert status == 0 and "(confirmation side)" in out
    both = [*job[:5], str(tmp_path / "c"), *job[5:]]  # --shards E C
    status, _, err = cli(capsys, *both)
    assert status == 2
    one_line_error(err, "a job reads one side of a split survey")

    copy = tmp_path / "copy.sqlite"
    source = str(tmp_path / "e")
    status, out, _ = cli(
        capsys, "import", "--config", str(config), "--db", str(copy), "--from", source
    )
    assert status == 0 and "imported 120 new reports" in out
    with ReportStore(copy) as store:
        assert store.statistics("split", "mood", EXPLORATION)[0] == 60
        assert store.statistics("split", "mood", CONFIRMATION)[0] == 0


def test_holdout_over_grpc(tmp_path, config):
    """HoldoutTest answers one bit with its level, counters and guarantee; the survey is then
    in holdout mode, so Preregister is refused."""
    surveys = load_surveys(config)
    db = tmp_path / "reports.sqlite"
    fill(db, surveys, reports(surveys["split"].question("mood"), MOOD, 600, CONFIRMATION, 9))
    server = ServerThread(config, db).start()
    try:
        analyst = ldp_pb2_grpc.AnalystStub(grpc.insecure_channel(server.analyst_target))
        request = ldp_pb2.HoldoutRequest(
            survey_id="split", question_id="mood", test="goodness_of_fit", p0=[0.25] * 4
        )
        answer = analyst.HoldoutTest(request)
        assert answer.reject and answer.query == 1 and answer.rejections == 1
        assert (answer.max_queries, answer.max_rejections, answer.alpha) == (20, 3, 0.05)
        assert answer.level == level(1, 20, 3, 0.05)
        assert "at most 0.05" in answer.guarantee
        bad = ldp_pb2.HoldoutRequest(survey_id="split", question_id="mood", test="anova")
        code, _ = code_of(analyst.HoldoutTest, bad)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert analyst.HoldoutTest(request).query == 2  # the refused query used none
        prereg = ldp_pb2.PreregisterRequest(survey_id="split", plan=PLAN)
        code, details = code_of(analyst.Preregister, prereg)
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "one mode per survey" in details
    finally:
        server.stop()


def test_rebuild_recomputes_each_side(tmp_path, config, capsys):
    db = tmp_path / "reports.sqlite"
    surveys = load_surveys(config)
    fill(db, surveys, population(surveys, n=40))
    common = ("--config", str(config), "--db", str(db))
    status, out, _ = cli(capsys, "rebuild", *common, "--json")
    rows = {(r["survey"], r["question"], r.get("side")): r for r in json.loads(out)}
    assert status == 0 and all(r["matched"] for r in rows.values())
    assert rows["split", "mood", "exploration"]["n"] == 40
    assert rows["split", "mood", "confirmation"]["n"] == 40
    assert rows["plain", "q", None]["n"] == 0


def test_a_closed_side_fails_only_its_own_upload_through_a_worker_link(tmp_path):
    """serve --workers: uploads of one worker message share a store submit; the one with a
    confirmation-side report of a sealed survey fails alone, as ConfirmationClosedError (so
    FAILED_PRECONDITION), and the others are stored."""
    import asyncio
    import threading
    from multiprocessing import Pipe

    from aggregator.service.server.store_link import RemoteStore, serve_link
    from aggregator.store.errors import ConfirmationClosedError
    from aggregator.store.model import ReportBatch

    db = tmp_path / "link.sqlite"
    store = ReportStore(db)
    store.register_question("s", "q", 2)
    store.run_in_writer(lambda conn: store.close_confirmation("s"))
    ours, writers = Pipe()
    link = threading.Thread(target=serve_link, args=(store, writers), daemon=True)
    link.start()

    def batch(first: int, side: int) -> ReportBatch:
        rows = np.array([[1, 0]], dtype=np.int64)
        return ReportBatch("s", "q", [bytes([first]) * 16], [b"x"], rows, side)

    async def scenario() -> list:
        remote = await RemoteStore.connect(ours, db)
        together = [
            remote.submit_batches([batch(1, EXPLORATION)]),
            remote.submit_batches([batch(2, CONFIRMATION)]),
            remote.submit_batches([batch(3, EXPLORATION)]),
        ]
        out = await asyncio.gather(
            *(asyncio.wrap_future(f) for f in together), return_exceptions=True
        )
        await asyncio.to_thread(remote.close)
        return out

    try:
        first, closed, third = asyncio.run(scenario())
        link.join(10)
        assert first == [1] and third == [1]
        assert isinstance(closed, ConfirmationClosedError)
        assert store.statistics("s", "q", EXPLORATION)[0] == 2
        assert store.statistics("s", "q", CONFIRMATION)[0] == 0
    finally:
        store.close()


@pytest.mark.slow
def test_the_flow_on_a_workers_server(tmp_path, config):
    """serve --workers 2: Preregister and Confirm seal through the analyst worker's own
    transaction, the writer process refuses confirmation-side uploads from then on (whichever
    worker takes them), and the sealed results read back on the analyst listener."""
    from service.server.test_workers import connection, start, stop

    db = tmp_path / "reports.sqlite"
    surveys = load_surveys(config)
    process, target, analyst_target = start(config, db, tmp_path, workers=2)
    try:
        channels = [connection(target) for _ in range(4)]  # TCP connections spread over workers
        ldp_pb2_grpc.CollectorStub(channels[0]).Upload(
            ldp_pb2.UploadRequest(reports=population(surveys)), timeout=30
        )
        analyst = ldp_pb2_grpc.AnalystStub(connection(analyst_target))
        registered = analyst.Preregister(
            ldp_pb2.PreregisterRequest(survey_id="split", plan=PLAN), timeout=30
        )
        assert registered.plan_sha256 == hashlib.sha256(PLAN.encode()).hexdigest()
        sealed = analyst.Confirm(ldp_pb2.ConfirmRequest(survey_id="split"), timeout=60)
        assert not sealed.already
        assert [r["n"] for r in json.loads(sealed.results_json)["results"]] == [800, 800]
        for channel in channels:
            again = ldp_pb2_grpc.AnalystStub(connection(analyst_target)).Confirm(
                ldp_pb2.ConfirmRequest(survey_id="split"), timeout=30
            )
            assert again.already and again.results_json == sealed.results_json
            late = reports(surveys["split"].question("mood"), MOOD, 3, CONFIRMATION, 99)
            code, details = code_of(
                ldp_pb2_grpc.CollectorStub(channel).Upload,
                ldp_pb2.UploadRequest(reports=late),
                timeout=30,
            )
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "closed" in details
            estimate = ldp_pb2_grpc.AnalystStub(connection(analyst_target)).Estimate(
                ldp_pb2.EstimateRequest(survey_id="split", question_id="mood", side=CONFIRMATION),
                timeout=30,
            )
            assert estimate.n == 800
    finally:
        status, stderr = stop(process)
    assert status == 0, stderr
