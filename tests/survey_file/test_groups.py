"""A public group label declared in the survey file (one question split by arm, region, wave):
the survey keys and wire fields, ingest status codes, a device's fixed group, per-group reads and
two-sample tests by group over real gRPC on loopback and the real CLI on the same SQLite store,
the label pinned to the data, migration of a schema-3 store, and an export/import round trip."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path

import grpc
import numpy as np
import pytest
from cli_runner import run_cli
from conftest import ServerThread

from aggregator.histogram import Histogram
from aggregator.service.server.app import open_store
from aggregator.stats import estimate, two_sample
from aggregator.store import ingest, shards
from aggregator.store.definitions import GroupLabelChangedError
from aggregator.store.sqlite import pins
from aggregator.store.sqlite.report_store import ReportStore
from aggregator.store.sqlite.schema import SCHEMA_VERSION
from aggregator.survey_file.config import ConfigError, load_surveys
from client.device.group import GroupChangedError
from client.device.ledger import Budget
from client.device.reporter import Reporter
from client.device.transport import Transport
from client.survey import SurveyError, SurveySpec, survey_from_json, survey_to_json
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

SURVEYS = """
[[survey]]
id = "trial"
min_batch_size = 20
group_label = "arm"
group_values = [{values}]

[[survey.question]]
id = "rr"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.question]]
id = "hr"
categories = ["a", "b", "c", "d", "e", "f"]
mechanism = "hadamard_response"
epsilon = 1.0

[[survey]]
id = "plain"
min_batch_size = 5

[[survey.question]]
id = "rr"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0
"""
VALUES = '"control", "treatment", "pilot"'
TRUTH = {  # group -> (rr distribution, hr distribution, devices)
    "control": ([0.25, 0.25, 0.25, 0.25], [1 / 6] * 6, 900),
    "treatment": ([0.45, 0.15, 0.2, 0.2], [0.5, 0.1, 0.1, 0.1, 0.1, 0.1], 700),
    "pilot": ([0.25, 0.25, 0.25, 0.25], [1 / 6] * 6, 4),  # below min_batch_size
}


def survey_file(path: Path, values: str = VALUES) -> Path:
    path.write_text(SURVEYS.replace("{values}", values))
    return path


def reports(survey, question_id: str, p, n: int, group: str, rng) -> tuple[list, Histogram]:
    question = survey.question(question_id)
    mech = question.mechanism
    randomized = mech.simulate(rng.choice(mech.k, size=n, p=p), rng)
    messages = [
        ldp_pb2.Report(
            report_id=os.urandom(16),
            survey_id=survey.id,
            question_id=question_id,
            payload=mech.encode(r),
            definition_digest=question.digest,
            group=group,
        )
        for r in randomized
    ]
    return messages, Histogram.from_reports(mech, randomized)


@pytest.fixture(scope="module")
def populated(tmp_path_factory):
    """A server with both questions of every group uploaded; (server, a channel to its device
    listener, one to its analyst listener, local histograms by (question, group), config)."""
    root = tmp_path_factory.mktemp("groups")
    config = survey_file(root / "surveys.toml")
    server = ServerThread(config, root / "store.sqlite").start()
    channel = grpc.insecure_channel(server.target)
    collector = ldp_pb2_grpc.CollectorStub(channel)
    rng = np.random.default_rng(23)
    local = {}
    survey = server.surveys["trial"]
    for group, (p_rr, p_hr, n) in TRUTH.items():
        for question_id, p in (("rr", p_rr), ("hr", p_hr)):
            messages, local[(question_id, group)] = reports(survey, question_id, p, n, group, rng)
            collector.Upload(ldp_pb2.UploadRequest(reports=messages), timeout=30)
    analyst = grpc.insecure_channel(server.analyst_target)
    yield server, channel, analyst, local, config
    analyst.close()
    channel.close()
    server.stop()


# -- the survey file and the wire -----------------------------------------------------------


def test_the_label_is_read_from_the_survey_file_and_survives_the_wire(tmp_path):
    survey = load_surveys(survey_file(tmp_path / "s.toml"))["trial"]
    assert survey.group_label.name == "arm"
    assert survey.group_label.values == ("control", "treatment", "pilot")
    assert SurveySpec.from_proto(survey.to_proto()) == survey
    assert survey_from_json(survey_to_json(survey)) == survey
    plain = load_surveys(tmp_path / "s.toml")["plain"]
    assert plain.group_label is None and not plain.to_proto().HasField("group_label")


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ('"only"', "2-64 values"),
        ('"a", "a"', "distinct"),
        ('"a", ""', "printable"),
        ('"a", "b\\n"', "printable"),
        (f'"a", "{"x" * 65}"', "1-64 printable"),
        (", ".join(f'"v{i}"' for i in range(65)), "2-64 values"),
        ('"a", 3', "printable"),
    ],
)
def test_bad_group_values_are_refused(tmp_path, values, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_surveys(survey_file(tmp_path / "s.toml", values))


def test_label_and_values_go_together(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SURVEYS.replace("{values}", VALUES).replace('group_label = "arm"\n', ""))
    with pytest.raises(ConfigError, match="both group_label and group_values"):
        load_surveys(path)


# -- ingest -----------------------------------------------------------------------------------


def one(survey_id: str, group: str) -> ldp_pb2.Report:
    return ldp_pb2.Report(
        report_id=os.urandom(16),
        survey_id=survey_id,
        question_id="rr",
        payload=(1).to_bytes(4, "little"),
        group=group,
    )


def counts(server: ServerThread) -> dict:
    with ReportStore(server.db) as store:
        return {
            "trial": store.statistics("trial", "rr")[0],
            "plain": store.statistics("plain", "rr")[0],
        }


@pytest.mark.parametrize(
    ("survey_id", "group", "fragment"),
    [
        ("trial", "", "no arm given"),
        ("trial", "placebo", "unknown arm 'placebo'"),
        ("trial", "Control", "unknown arm 'Control'"),
        ("plain", "control", "has no group label"),
    ],
)
def test_ingest_refuses_a_missing_unknown_or_unexpected_group(
    populated, survey_id, group, fragment
):
    server, channel, _, _, _ = populated
    collector = ldp_pb2_grpc.CollectorStub(channel)
    before = counts(server)
    good = one("trial", "control")
    with pytest.raises(grpc.RpcError) as refused:
        collector.Upload(ldp_pb2.UploadRequest(reports=[good, one(survey_id, group)]), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "report[1]" in refused.value.details() and fragment in refused.value.details()
    stream = collector.UploadStream(
        iter([ldp_pb2.UploadRequest(reports=[one(survey_id, group)])]), timeout=30
    )
    (result,) = stream.results
    assert result.status == ldp_pb2.REJECTED and result.code == "INVALID_ARGUMENT"
    assert fragment in result.reason
    assert counts(server) == before  # nothing stored, not even the good report of the batch


# -- reads ------------------------------------------------------------------------------------


def test_per_group_estimates_match_the_library(populated):
    _, _, channel, local, _ = populated
    analyst = ldp_pb2_grpc.AnalystStub(channel)
    for group in ("control", "treatment"):
        remote = analyst.Estimate(
            ldp_pb2.EstimateRequest(survey_id="trial", question_id="rr", group=group), timeout=30
        )
        library = estimate(local[("rr", group)])
        assert remote.n == TRUTH[group][2]
        np.testing.assert_allclose(remote.frequencies, library.frequencies, rtol=1e-12)
    pooled, call = analyst.Estimate.with_call(
        ldp_pb2.EstimateRequest(survey_id="trial", question_id="rr"), timeout=30
    )
    # The released groups summed: the pilot, below min_batch_size, contributes nothing
    assert pooled.n == TRUTH["control"][2] + TRUTH["treatment"][2]
    assert ("ldp-groups", "pooled") in call.trailing_metadata()  # said, as on the command line
    assert ("ldp-released-groups", '["control", "treatment"]') in call.trailing_metadata()
    test = analyst.GoodnessOfFit(
        ldp_pb2.GoodnessOfFitRequest(
            survey_id="trial", question_id="rr", p0=[0.25] * 4, group="treatment"
        ),
        timeout=30,
    )
    assert test.reject and test.n == TRUTH["treatment"][2]


@pytest.mark.parametrize(
    ("survey_id", "group", "code", "fragment"),
    [
        ("trial", "placebo", "INVALID_ARGUMENT", "unknown arm"),
        ("plain", "control", "INVALID_ARGUMENT", "no group label"),
        ("trial", "pilot", "FAILED_PRECONDITION", "of arm 'pilot' has fewer than 20 reports"),
    ],
)
def test_group_reads_refused(populated, survey_id, group, code, fragment):
    _, _, channel, _, _ = populated
    analyst = ldp_pb2_grpc.AnalystStub(channel)
    with pytest.raises(grpc.RpcError) as refused:
        analyst.Estimate(
            ldp_pb2.EstimateRequest(survey_id=survey_id, question_id="rr", group=group), timeout=30
        )
    assert refused.value.code() == getattr(grpc.StatusCode, code)
    assert fragment in refused.value.details()


def by_groups(question: str, a: str, b: str, **options) -> ldp_pb2.TwoSampleRequest:
    return ldp_pb2.TwoSampleRequest(
        survey_a="trial", question_a=question, group_a=a, group_b=b, **options
    )


@pytest.mark.parametrize(("question", "seed"), [("rr", None), ("hr", 5)])
def test_two_sample_by_group_rejects_a_real_difference_and_matches_the_library(
    populated, question, seed
):
    _, _, channel, local, _ = populated
    analyst = ldp_pb2_grpc.AnalystStub(channel)
    options = {} if seed is None else {"seed": seed}
    remote = analyst.TwoSample(by_groups(question, "control", "treatment", **options), timeout=60)
    library = two_sample(local[(question, "control")], local[(question, "treatment")], rng=seed)
    assert remote.reject and remote.pvalue == library.pvalue
    assert remote.statistic == pytest.approx(library.statistic, rel=1e-12)
    assert remote.n == TRUTH["control"][2] + TRUTH["treatment"][2]
    explicit = analyst.TwoSample(  # B's survey and question may be given when equal to A's
        ldp_pb2.TwoSampleRequest(
            survey_a="trial",
            question_a=question,
            survey_b="trial",
            question_b=question,
            group_a="control",
            group_b="treatment",
            **options,
        ),
        timeout=60,
    )
    assert explicit.pvalue == remote.pvalue


@pytest.mark.parametrize(
    ("request_", "code", "fragment"),
    [
        (by_groups("rr", "control", ""), "INVALID_ARGUMENT", "both groups or neither"),
        (by_groups("rr", "control", "control"), "INVALID_ARGUMENT", "same group"),
        (by_groups("rr", "control", "placebo"), "INVALID_ARGUMENT", "unknown arm"),
        (by_groups("rr", "control", "pilot"), "FAILED_PRECONDITION", "released from 20"),
        (
            ldp_pb2.TwoSampleRequest(
                survey_a="trial", question_a="rr", question_b="hr", group_a="c", group_b="t"
            ),
            "INVALID_ARGUMENT",
            "groups compare one question",
        ),
        (
            ldp_pb2.TwoSampleRequest(
                survey_a="plain", question_a="rr", group_a="control", group_b="treatment"
            ),
            "INVALID_ARGUMENT",
            "no group label",
        ),
    ],
)
def test_two_sample_by_group_refusals(populated, request_, code, fragment):
    _, _, channel, _, _ = populated
    with pytest.raises(grpc.RpcError) as refused:
        ldp_pb2_grpc.AnalystStub(channel).TwoSample(request_, timeout=30)
    assert refused.value.code() == getattr(grpc.StatusCode, code)
    assert fragment in refused.value.details()


# -- the command line -------------------------------------------------------------------------


def aggregator_cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli("agg", *args)  # in this process (tests/cli_runner.py)


def test_cli_reads_one_group_or_says_it_pools_them(populated):
    server, _, _, local, config = populated
    where = ("--config", str(config), "--db", str(server.db))
    done = aggregator_cli(
        "estimate",
        *where,
        *("--survey", "trial", "--question", "rr"),
        *("--group", "treatment", "--json"),
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["group_label"], out["group"], out["n"]) == ("arm", "treatment", 700)
    np.testing.assert_allclose(
        out["frequencies"], estimate(local[("rr", "treatment")]).frequencies, rtol=1e-9
    )
    pooled = aggregator_cli("estimate", *where, "--survey", "trial", "--question", "rr")
    assert pooled.returncode == 0, pooled.stderr
    assert pooled.stdout.startswith("all arm groups pooled (control, treatment, pilot)")
    test = aggregator_cli(
        "test",
        *where,
        *("--survey", "trial", "--question", "rr"),
        *("gof", "--p0", "0.25,0.25,0.25,0.25"),
    )
    assert test.returncode == 0 and "pooled" in test.stdout.splitlines()[0]


def test_cli_two_sample_by_group_matches_the_library(populated):
    server, _, _, local, config = populated
    done = aggregator_cli(
        "two-sample",
        *("--config", str(config), "--db", str(server.db)),
        *("--survey", "trial", "--question", "hr", "--groups", "control", "treatment"),
        *("--seed", "5", "--json"),
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    library = two_sample(local[("hr", "control")], local[("hr", "treatment")], rng=5)
    assert out["reject"] and out["pvalue"] == library.pvalue
    assert (out["a"], out["b"]) == ("trial:hr[control]", "trial:hr[treatment]")


@pytest.mark.parametrize(
    ("args", "status", "fragment"),
    [
        (["--a", "trial:rr", "--b", "plain:rr", "--groups", "control", "treatment"], 2, "either"),
        ([], 2, "either --a and --b"),
        (["--groups", "control", "treatment"], 2, "needs --survey and --question"),
        (["--survey", "trial", "--question", "rr", "--groups", "control", "placebo"], 2, "placebo"),
        (["--survey", "trial", "--question", "rr", "--groups", "control", "control"], 2, "same"),
        (["--survey", "plain", "--question", "rr", "--groups", "x", "y"], 2, "no group label"),
        (["--survey", "trial", "--question", "rr", "--groups", "control", "pilot"], 3, "pilot"),
    ],
)
def test_cli_two_sample_mistakes_are_one_line(populated, args, status, fragment):
    server, _, _, _, config = populated
    done = aggregator_cli("two-sample", "--config", str(config), "--db", str(server.db), *args)
    assert done.returncode == status, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in done.stderr


def test_cli_unknown_group_is_one_line(populated):
    server, _, _, _, config = populated
    done = aggregator_cli(
        "estimate",
        *("--config", str(config), "--db", str(server.db)),
        *("--survey", "trial", "--question", "rr", "--group", "placebo"),
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown arm 'placebo'" in lines[0]


# -- the device -------------------------------------------------------------------------------


def test_a_device_keeps_its_group_and_refuses_another_before_charging(populated, tmp_path):
    server, _, _, _, _ = populated
    state = tmp_path / "device.sqlite"
    reporter = Reporter(Transport(server.target), state, Budget(20.0))
    try:
        with pytest.raises(SurveyError, match="give this device's arm"):
            reporter.answer("trial", "rr", "a")
        with pytest.raises(SurveyError, match="unknown arm 'placebo'"):
            reporter.answer("trial", "rr", "a", group="placebo")
        with pytest.raises(SurveyError, match="no group label"):
            reporter.answer("plain", "rr", "a", group="control")
        assert reporter.ledger.spent() == (0.0, 0.0)
        reporter.answer("trial", "rr", "a", group="pilot")
        spent = reporter.ledger.spent()
        with pytest.raises(GroupChangedError, match="reports in arm 'pilot', not 'control'"):
            reporter.answer("trial", "rr", "b", group="control")
        assert reporter.ledger.spent() == spent  # refused before the ledger was charged
        reporter.answer("trial", "hr", "b")  # the fixed group
        reporter.answer("plain", "rr", "c")
        with ReportStore(server.db) as store:
            before = store.statistics("trial", "rr", group="pilot")[0]
            before_hr = store.statistics("trial", "hr", group="pilot")[0]
        assert reporter.flush().accepted == 3
    finally:
        reporter.close()
    again = Reporter(Transport(server.target), state)  # after a restart too
    try:
        with pytest.raises(GroupChangedError):
            again.answer("trial", "hr", "a", group="treatment")
    finally:
        again.close()
    with ReportStore(server.db) as store:
        assert store.statistics("trial", "rr", group="pilot")[0] == before + 1
        assert store.statistics("trial", "hr", group="pilot")[0] == before_hr + 1


def test_ldp_client_submit_group_mistake_is_one_line(populated, tmp_path):
    server, _, _, _, _ = populated
    state = tmp_path / "cli-device.sqlite"
    base = ["submit", "--server", server.target]
    base += ["--state", str(state), "--survey", "trial", "--question", "rr", "--answer", "a"]
    first = run_cli("client", *base, "--budget", "10", "--group", "control", "--insecure")
    assert first.returncode == 0, first.stderr
    second = run_cli("client", *base, "--group", "treatment", "--insecure")

    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "reports in arm 'control'" in lines[0]


# -- the label pinned to the data, migration, round trip --------------------------------------


def grouped_store(tmp_path: Path) -> tuple[Path, Path]:
    config = survey_file(tmp_path / "s.toml", '"control", "treatment"')
    db = tmp_path / "store.sqlite"
    surveys = load_surveys(config)
    rng = np.random.default_rng(3)
    store = open_store(surveys, str(db))
    try:
        for group in ("control", "treatment"):
            messages, _ = reports(surveys["trial"], "rr", [0.25] * 4, 30, group, rng)
            store.put(ingest.validate_batch(messages, surveys))
    finally:
        store.close()
    return config, db


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda t: t.replace('"control", "treatment"', '"control"'), "2-64 values"),
        (lambda t: t.replace('"control", "treatment"', '"control", "t2"'), "drops arm value"),
        (lambda t: t.replace('group_label = "arm"', 'group_label = "region"'), "renames"),
        (
            lambda t: t.replace('group_label = "arm"\n', "").replace(
                'group_values = ["control", "treatment"]\n', ""
            ),
            "removes its group label",
        ),
    ],
)
def test_the_label_may_only_gain_values_once_reports_exist(tmp_path, edit, fragment):
    config, db = grouped_store(tmp_path)
    config.write_text(edit(config.read_text()))
    try:
        surveys = load_surveys(config)
    except ConfigError as exc:  # an invalid label never gets as far as the store
        assert fragment in str(exc)
        return
    with pytest.raises(GroupLabelChangedError, match=fragment):
        open_store(surveys, str(db)).close()
    done = aggregator_cli(
        "estimate",
        *("--config", str(config), "--db", str(db)),
        *("--survey", "trial", "--question", "rr"),
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert fragment in done.stderr and "Traceback" not in done.stderr


def test_a_new_wave_adds_a_value(tmp_path):
    config, db = grouped_store(tmp_path)
    config.write_text(config.read_text().replace('"treatment"]', '"treatment", "wave3"]'))
    surveys = load_surveys(config)
    open_store(surveys, str(db)).close()
    with ReportStore(db) as store:
        assert store.statistics("trial", "rr", group="control")[0] == 30
        assert store.statistics("trial", "rr", group="wave3")[0] == 0


def test_a_survey_with_reports_cannot_gain_a_label(tmp_path):
    config, db = grouped_store(tmp_path)
    text = config.read_text()
    plain = text.replace('group_label = "arm"\n', "").replace(
        'group_values = ["control", "treatment"]\n', ""
    )
    config.write_text(plain)
    with pytest.raises(GroupLabelChangedError):
        open_store(load_surveys(config), str(db)).close()


def test_a_schema_3_store_is_migrated(tmp_path):
    """A store from before group labels: its reports get the empty group, statistics stay."""
    config = survey_file(tmp_path / "s.toml")
    db = tmp_path / "old.sqlite"
    conn = sqlite3.connect(db)
    conn.executescript(
        """
        CREATE TABLE reports (report_id BLOB PRIMARY KEY, survey_id TEXT NOT NULL,
            question_id TEXT NOT NULL, payload BLOB NOT NULL, received_at INTEGER NOT NULL,
            side INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
        CREATE TABLE statistics (survey_id TEXT NOT NULL, question_id TEXT NOT NULL,
            k INTEGER NOT NULL, n INTEGER NOT NULL, sums BLOB NOT NULL,
            PRIMARY KEY (survey_id, question_id));
        CREATE TABLE side_statistics (survey_id TEXT NOT NULL, question_id TEXT NOT NULL,
            side INTEGER NOT NULL CHECK (side IN (1, 2)), n INTEGER NOT NULL,
            sums BLOB NOT NULL, PRIMARY KEY (survey_id, question_id, side));
        PRAGMA application_id = 1279545427;
        PRAGMA user_version = 3;
        """
    )
    sums = np.array([0, 1, 0, 0], dtype="<i8").tobytes()
    conn.execute("INSERT INTO statistics VALUES ('plain', 'rr', 4, 1, ?)", (sums,))
    payload = (1).to_bytes(4, "little")
    conn.execute("INSERT INTO reports VALUES (?, 'plain', 'rr', ?, 0, 0)", (b"r" * 16, payload))
    conn.commit()
    conn.close()
    surveys = load_surveys(config)
    with ReportStore(db) as store:
        pins.register(store, surveys)
        assert store.statistics("plain", "rr")[0] == 1
        contribution = lambda s, q, p: ingest.contribution(surveys[s].question(q), p)  # noqa: E731
        assert store.rebuild(contribution)["plain", "rr"][0] == 1
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    assert conn.execute("SELECT group_value FROM reports").fetchall() == [("",)]
    assert conn.execute("SELECT count(*) FROM group_statistics").fetchone() == (0,)
    conn.close()


def test_rebuild_export_and_import_keep_the_groups(tmp_path):
    config, db = grouped_store(tmp_path)
    surveys = load_surveys(config)
    with ReportStore(db) as store:
        stored = {g: store.statistics("trial", "rr", group=g) for g in ("control", "treatment")}
        contribution = lambda s, q, p: ingest.contribution(surveys[s].question(q), p)  # noqa: E731
        rebuilt = store.rebuild(contribution)
    for group, (n, sums) in stored.items():
        assert n == 30 and rebuilt["trial", "rr", 0, group][0] == n
        assert rebuilt["trial", "rr", 0, group][1].tolist() == sums.tolist()
    out = tmp_path / "shards"
    where = ("--config", str(config))
    done = aggregator_cli("export", *where, "--db", str(db), "--survey", "trial", "--out", str(out))
    assert done.returncode == 0, done.stderr
    copy = tmp_path / "copy.sqlite"
    # the imported store reads the shards under a label that gained a value (a new wave)
    config.write_text(config.read_text().replace('"treatment"]', '"treatment", "wave3"]'))
    done = aggregator_cli("import", *where, "--db", str(copy), "--from", str(out))
    assert done.returncode == 0, done.stderr
    assert "imported 60 new reports" in done.stdout
    with ReportStore(copy) as store:
        for group, (n, sums) in stored.items():
            n_copy, sums_copy = store.statistics("trial", "rr", group=group)
            assert n_copy == n and sums_copy.tolist() == sums.tolist()


@pytest.mark.slow
@pytest.mark.parametrize("dedup", [0, 8])
def test_the_beam_job_gives_each_group_and_all_pooled(tmp_path, dedup):
    pytest.importorskip("apache_beam", reason="needs the [beam] extra")
    from aggregator.jobs import inputs, pipeline
    from aggregator.jobs.results import Analysis

    config, db = grouped_store(tmp_path)
    surveys = load_surveys(config)
    out = tmp_path / "shards"
    with ReportStore(db) as store:
        shards.export_survey(store, surveys["trial"], out, 3)
        stored = {g: store.statistics("trial", "rr", group=g) for g in ("", "control", "treatment")}
    found = inputs.resolve([str(out)], surveys)
    spec = pipeline.JobSpec(
        surveys, found.shards, str(tmp_path / "r.json"), Analysis(seed=1), dedup, block_bytes=512
    )
    document = pipeline.run(spec, ["--runner=DirectRunner"])
    results = {r["group"]: r for r in document["results"] if r["question"] == "rr"}
    assert set(results) == {"", "control", "treatment"}  # every group, and all pooled
    for group, (n, sums) in stored.items():
        assert (results[group]["n"], results[group]["sums"]) == (n, sums.tolist())
        assert results[group]["group_label"] == "arm"
    assert stored[""][0] == 60 and stored["control"][0] == 30


@pytest.mark.slow
def test_groups_on_a_workers_server(tmp_path):
    """serve --workers 2: grouped uploads through every worker, per-group reads and two-sample
    by group on the analyst listener (the pattern of test_the_flow_on_a_workers_server)."""
    from service.server.test_workers import connection, start, stop

    config = survey_file(tmp_path / "s.toml", '"control", "treatment"')
    surveys = load_surveys(config)
    process, target, analyst_target = start(config, tmp_path / "store.sqlite", tmp_path, 2)
    try:
        channels = [connection(target) for _ in range(3)]
        rng = np.random.default_rng(9)
        local = {}
        for group, (p, _, n) in list(TRUTH.items())[:2]:
            messages, local[group] = reports(surveys["trial"], "rr", p, n, group, rng)
            ldp_pb2_grpc.CollectorStub(channels[0]).Upload(
                ldp_pb2.UploadRequest(reports=messages), timeout=30
            )
        library = two_sample(local["control"], local["treatment"])
        for channel in channels:
            analyst = ldp_pb2_grpc.AnalystStub(connection(analyst_target))
            remote = analyst.TwoSample(by_groups("rr", "control", "treatment"), timeout=30)
            assert remote.pvalue == library.pvalue and remote.n == 1600
            read = analyst.Estimate(
                ldp_pb2.EstimateRequest(survey_id="trial", question_id="rr", group="control"),
                timeout=30,
            )
            assert read.n == TRUTH["control"][2]
            with pytest.raises(grpc.RpcError) as refused:
                ldp_pb2_grpc.CollectorStub(channel).Upload(
                    ldp_pb2.UploadRequest(reports=[one("trial", "")]), timeout=30
                )
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        status, stderr = stop(process)
    assert status == 0, stderr


def test_the_report_and_the_loader_read_one_group_or_all(populated, tmp_path):
    from aggregator.analysis.survey_data import open_survey

    server, _, _, _, config = populated
    one = open_survey(config, server.db, "trial", group="treatment")
    assert one.group == "treatment" and one["rr"].n == 700 and one["rr"].released
    assert not open_survey(config, server.db, "trial", group="pilot")["rr"].released
    assert open_survey(config, server.db, "trial")["rr"].n >= 1604
    with pytest.raises(ConfigError, match="unknown arm"):
        open_survey(config, server.db, "trial", group="placebo")
    out = tmp_path / "report.md"
    where = ("--config", str(config), "--db", str(server.db), "--survey", "trial")
    markdown = ("--out", str(out), "--format", "md")
    done = aggregator_cli("report", *where, *markdown, "--group", "control")
    assert done.returncode == 0, done.stderr
    assert "**arm = control: this group's reports only**" in out.read_text()
    done = aggregator_cli("report", *where, *markdown)
    assert done.returncode == 0, done.stderr
    assert "**all arm groups pooled (control, treatment, pilot)**" in out.read_text()


def test_one_upload_mixing_groups_counts_each_in_its_own(tmp_path):
    """Reports of one question in several groups, interleaved in one request: each lands in its
    group (and the pooled statistic), the flags come back in request order, a resend is a
    duplicate everywhere."""
    config = survey_file(tmp_path / "s.toml", '"control", "treatment"')
    surveys = load_surveys(config)
    messages = [one("trial", ("control", "treatment")[i % 3 == 0]) for i in range(12)]
    store = open_store(surveys, str(tmp_path / "store.sqlite"))
    try:
        upload = ingest.validate_upload(messages, surveys)
        assert [b.group for b in upload.batches] == ["treatment", "control"]
        flags = upload.in_request_order(store.submit_batches(upload.batches).result())
        assert flags == [1] * 12
        again = ingest.validate_upload(messages[:5], surveys)
        assert again.in_request_order(store.submit_batches(again.batches).result()) == [0] * 5
        assert store.statistics("trial", "rr", group="treatment")[0] == 4
        assert store.statistics("trial", "rr", group="control")[0] == 8
        assert store.statistics("trial", "rr")[0] == 12
    finally:
        store.close()


def test_rebuild_checks_and_repairs_each_group(tmp_path):
    config, db = grouped_store(tmp_path)
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("UPDATE group_statistics SET n = n + 1 WHERE group_value = 'treatment'")
    where = ("--config", str(config), "--db", str(db))
    done = aggregator_cli("rebuild", *where, "--json")
    assert done.returncode == 1, done.stderr
    rows = {(r["survey"], r["question"], r.get("group", "")): r for r in json.loads(done.stdout)}
    assert not rows[("trial", "rr", "treatment")]["matched"]
    assert rows[("trial", "rr", "control")]["matched"] and rows[("trial", "rr", "")]["matched"]
    assert rows[("trial", "rr", "treatment")]["n"] == 30
    again = aggregator_cli("rebuild", *where)
    assert again.returncode == 0, again.stdout
    assert "trial/rr [treatment]: n = 30, statistics matches" in again.stdout


def test_simulate_spreads_devices_over_groups(tmp_path):
    config = survey_file(tmp_path / "s.toml", '"control", "treatment"')
    server = ServerThread(config, tmp_path / "store.sqlite").start()
    try:
        base = ["simulate", "--server", server.target]
        base += ["--insecure", "--survey", "trial", "--devices", "400", "--seed", "3"]
        done = run_cli(
            "client",
            *base,
            *("--group-share", "control=0.25,treatment=0.75"),
            *("--truth-for", "treatment:rr=0.7,0.1,0.1,0.1", "--json"),
        )

        assert done.returncode == 0, done.stderr
        groups = json.loads(done.stdout)["groups"]
        assert sum(groups.values()) == 400 and 60 <= groups["control"] <= 140  # Bin(400, 1/4)
        with ReportStore(server.db) as store:
            for group, n in groups.items():
                assert store.statistics("trial", "rr", group=group)[0] == n
                assert store.statistics("trial", "hr", group=group)[0] == n
        for wrong, fragment in (
            (("--truth-for", "placebo:rr=0.7,0.1,0.1,0.1"), "GROUP:QUESTION"),
            (("--group-share", "control=0.5,placebo=0.5"), "not one of the arm values"),
            (("--group-share", "control=0.5,treatment=0.6"), "sum to 1"),
        ):
            bad = run_cli("client", *base, *wrong)

            lines = bad.stderr.strip().splitlines()
            assert bad.returncode == 2 and len(lines) == 1 and fragment in lines[0], bad.stderr
    finally:
        server.stop()
