"""Design-based answers over the Analyst service (issue 29): a real gRPC server on loopback and
a real SQLite store, devices carrying design keys. At a release point ``estimate|test --design
--server`` print exactly what ``--design --db`` prints; min_batch_size - 1 more reports move the
store's answer and not the server's; the design rows are snapshotted with the release (their n
is the released n); refusals are specific status codes and one-line CLI errors."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing

import grpc
import numpy as np
import pytest
from cli_runner import run_cli
from conftest import ServerThread
from service.collector.test_design_service import SURVEYS, messages, write_survey

from aggregator.store.contract import ReleasesDesigns
from aggregator.store.sqlite.analysis import SqliteAnalysis
from aggregator.survey_file.config import load_surveys
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

LONELY = """
[[survey]]
id = "lonely"
min_batch_size = 20
design = { table = "lonely.csv" }

[[survey.question]]
id = "rr"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 2.0
"""


@pytest.fixture
def served(tmp_path):
    """A server on a fresh store, its collector and Analyst stubs; 'field' holds 600 reports
    of rr and of pair, 'lonely' 40 reports of a frame whose second stratum has one PSU."""
    config = write_survey(tmp_path)
    (tmp_path / "lonely.csv").write_text("key,stratum,psu,weight\nx,s,p,1\ny,s,q,2\nz,t,r,1\n")
    config.write_text(SURVEYS + LONELY)
    server = ServerThread(config, tmp_path / "store.sqlite").start()
    channel = grpc.insecure_channel(server.target)
    analyst_channel = grpc.insecure_channel(server.analyst_target)
    collector = ldp_pb2_grpc.CollectorStub(channel)
    rng = np.random.default_rng(2029)
    survey = server.surveys["field"]
    for question_id in ("rr", "pair"):
        batch, _ = messages(survey, question_id, 600, rng)
        collector.Upload(ldp_pb2.UploadRequest(reports=batch), timeout=30)
    lonely = server.surveys["lonely"].question("rr")
    reports = [
        ldp_pb2.Report(
            report_id=rng.bytes(16),
            survey_id="lonely",
            question_id="rr",
            payload=lonely.mechanism.encode(int(answer)),
            definition_digest=lonely.digest,
            design_key=key,
        )
        for answer, key in zip(
            rng.integers(0, 4, 40), np.tile(["x", "y", "z", "x"], 10), strict=True
        )
    ]
    collector.Upload(ldp_pb2.UploadRequest(reports=reports), timeout=30)
    yield server, collector, ldp_pb2_grpc.AnalystStub(analyst_channel), config, rng
    channel.close()
    analyst_channel.close()
    server.stop()


def _both(server, config, *args: str) -> tuple[str, str]:
    """stdout of the command over --server and over --db (the server first: it releases)."""
    remote = run_cli("agg", *args, "--server", server.analyst_target)
    assert remote.returncode == 0, remote.stderr
    local = run_cli("agg", *args, "--config", config, "--db", server.db, check=True)
    return remote.stdout, local.stdout


def _upload_north(server, collector, rng, n: int) -> None:
    batch, _ = messages(server.surveys["field"], "rr", 4 * n, rng)
    north = [report for report in batch if report.group == "north"][:n]
    assert len(north) == n
    collector.Upload(ldp_pb2.UploadRequest(reports=north), timeout=30)


def test_server_equals_store_at_a_release_point_and_holds_between(served):
    server, collector, _, config, rng = served
    where = ["--survey", "field", "--question", "rr", "--design"]
    for extra in (["--json"], [], ["--group", "north", "--variance", "jackknife", "--json"]):
        remote, local = _both(server, config, "estimate", *where, *extra)
        assert remote == local
    before = json.loads(_both(server, config, "estimate", *where, "--json")[0])
    assert before["n"] == 600 and before["design"].startswith("stratified cluster design")
    _upload_north(server, collector, rng, server.surveys["field"].min_batch_size - 1)
    remote, local = _both(server, config, "estimate", *where, "--json")
    assert json.loads(remote) == before  # the release has not moved: nor has the answer
    assert json.loads(local)["n"] == 600 + 49 and json.loads(local) != before
    _upload_north(server, collector, rng, 1)  # the north group's release moves at +50
    remote, local = _both(server, config, "estimate", *where, "--json")
    assert remote == local and json.loads(remote)["n"] == 650


def test_design_tests_over_the_server_equal_the_store(served):
    server, _, stub, config, _ = served
    design = ldp_pb2.DesignOptions(variance="jackknife")
    gof = ["test", "--survey", "field", "--question", "rr", "gof", "--p0", "uniform", "--design"]
    for extra in ([], ["--correction", "wald", "--json"], ["--group", "south", "--json"]):
        remote, local = _both(server, config, *gof, *extra)
        assert remote == local
    homogeneity = ["test", "--survey", "field", "--question", "rr", "homogeneity", "--design"]
    for extra in ([], ["--correction", "wald", "--variance", "jackknife", "--json"]):
        remote, local = _both(server, config, *homogeneity, *extra)
        assert remote == local and "k-sample homogeneity" in remote
    both = ldp_pb2.TwoSampleRequest(survey_a="field", question_a="rr", design=design)
    named = ldp_pb2.TwoSampleRequest(
        survey_a="field", question_a="rr", group_a="north", group_b="south", design=design
    )
    assert stub.TwoSample(both, timeout=60) == stub.TwoSample(named, timeout=60)  # no group: all
    pair = ["test", "--survey", "field", "--question", "pair", "independence", "--design"]
    remote, local = _both(server, config, *pair, "--correction", "second-order", "--json")
    assert remote == local and json.loads(remote)["design_df"] == 15


def test_the_design_rows_are_snapshotted_with_the_release(served):
    server, collector, _, _, rng = served
    run_cli("agg", "estimate", "--server", server.analyst_target, "--survey", "field",
            "--question", "rr", "--design", check=True)  # fmt: skip
    _upload_north(server, collector, rng, 10)  # live statistics move, snapshots do not
    with closing(sqlite3.connect(server.db)) as conn:
        released = dict(
            conn.execute(
                "SELECT group_value, n FROM releases WHERE survey_id = 'field'"
                " AND question_id = 'rr'"
            ).fetchall()
        )
        design = dict(
            conn.execute(
                "SELECT group_value, SUM(n) FROM design_releases WHERE survey_id = 'field'"
                " AND question_id = 'rr' GROUP BY group_value"
            ).fetchall()
        )
        live = conn.execute(
            "SELECT SUM(n) FROM design_statistics WHERE survey_id = 'field' AND question_id = 'rr'"
        ).fetchone()[0]
    assert design == released and sum(released.values()) == 600 and live == 610


def test_refusals_are_status_codes_and_one_line(served):
    server, _, stub, _, _ = served
    design = ldp_pb2.DesignOptions()
    cases = [
        (ldp_pb2.EstimateRequest(survey_id="plain", question_id="rr", design=design),
         grpc.StatusCode.FAILED_PRECONDITION, "has no sampling design"),
        (ldp_pb2.EstimateRequest(survey_id="lonely", question_id="rr", design=design),
         grpc.StatusCode.FAILED_PRECONDITION, "PSU"),
        (ldp_pb2.EstimateRequest(survey_id="field", question_id="noise", design=design),
         grpc.StatusCode.FAILED_PRECONDITION, "results are released from 50"),
        (ldp_pb2.EstimateRequest(survey_id="field", question_id="rr",
                                 design=ldp_pb2.DesignOptions(variance="delta")),
         grpc.StatusCode.INVALID_ARGUMENT, "design variance must be one of"),
        (ldp_pb2.EstimateRequest(survey_id="field", question_id="rr",
                                 design=ldp_pb2.DesignOptions(replicates=10**6)),
         grpc.StatusCode.INVALID_ARGUMENT, "design replicates must be at most 10,000"),
        (ldp_pb2.EstimateRequest(survey_id="nope", question_id="rr", design=design),
         grpc.StatusCode.NOT_FOUND, "unknown survey"),
    ]  # fmt: skip
    for request, code, words in cases:
        with pytest.raises(grpc.RpcError) as caught:
            stub.Estimate(request, timeout=30)
        assert caught.value.code() == code and words in caught.value.details()
    request = ldp_pb2.IndependenceRequest(survey_id="field", question_id="rr", design=design)
    with pytest.raises(grpc.RpcError) as caught:
        stub.Independence(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    base = ["estimate", "--server", server.analyst_target, "--question"]
    for survey, question, status in (("field", "noise", 3), ("plain", "rr", 2)):
        out = run_cli("agg", *base, question, "--survey", survey, "--design")
        assert out.returncode == status and "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    homogeneity = ["test", "--server", server.analyst_target, "--survey", "field"]
    out = run_cli(
        "agg", *homogeneity, "--question", "rr", "homogeneity", "--design", "--group", "north"
    )
    assert out.returncode == 2 and "(no --group)" in out.stderr
    for request, code, words in (
        (ldp_pb2.TwoSampleRequest(survey_a="field", question_a="rr", group_a="north",
                                  design=design),
         grpc.StatusCode.INVALID_ARGUMENT, "give both groups or neither"),
        (ldp_pb2.TwoSampleRequest(survey_a="field", question_a="rr", question_b="pair",
                                  design=design),
         grpc.StatusCode.INVALID_ARGUMENT, "compares groups of one question"),
        (ldp_pb2.TwoSampleRequest(survey_a="lonely", question_a="rr", design=design),
         grpc.StatusCode.FAILED_PRECONDITION, "has no group label"),
        (ldp_pb2.TwoSampleRequest(survey_a="field", question_a="nope", design=design),
         grpc.StatusCode.NOT_FOUND, "has no question"),
    ):  # fmt: skip
        with pytest.raises(grpc.RpcError) as caught:
            stub.TwoSample(request, timeout=30)
        assert caught.value.code() == code and words in caught.value.details()


TRIO = """
[[survey]]
id = "trio"
min_batch_size = 50
group_label = "site"
group_values = ["west", "north", "east"]
design = { table = "frame.csv" }

[[survey.question]]
id = "rr"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 2.0
"""


def test_homogeneity_of_every_group_over_the_server_equals_the_store(tmp_path):
    """TwoSample with a design and no groups: the k-sample test of every group of the label,
    each released on its own (one below min_batch_size: refused), equal to ``test homogeneity
    --design --db``."""
    config = write_survey(tmp_path)
    config.write_text(SURVEYS + TRIO)
    server = ServerThread(config, tmp_path / "store.sqlite").start()
    rng = np.random.default_rng(36)
    batch, _ = messages(server.surveys["trio"], "rr", 900, rng)
    sites = ["west"] * 300 + ["north"] * 300 + ["east"] * 300
    for report, site in zip(batch, sites, strict=True):
        report.group = site
    design = ldp_pb2.DesignOptions(correction="second-order")
    request = ldp_pb2.TwoSampleRequest(survey_a="trio", question_a="rr", design=design)
    homogeneity = ["test", "--survey", "trio", "--question", "rr", "homogeneity", "--design"]
    local = [*homogeneity, "--correction", "second-order", "--json", "--config", config]
    try:
        with grpc.insecure_channel(server.target) as channel:
            collector = ldp_pb2_grpc.CollectorStub(channel)
            collector.Upload(ldp_pb2.UploadRequest(reports=batch[:640]), timeout=30)  # east: 40
            with grpc.insecure_channel(server.analyst_target) as analyst_channel:
                stub = ldp_pb2_grpc.AnalystStub(analyst_channel)
                with pytest.raises(grpc.RpcError) as caught:
                    stub.TwoSample(request, timeout=60)
                assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "east" in caught.value.details()
                assert run_cli("agg", *local, "--db", server.db).returncode == 3
                collector.Upload(ldp_pb2.UploadRequest(reports=batch[640:]), timeout=30)
                got = stub.TwoSample(request, timeout=60)
        want = json.loads(run_cli("agg", *local, "--db", server.db, check=True).stdout)
    finally:
        server.stop()
    assert got.n == want["n"] == 900 and got.design_df == want["design_df"] == 15
    assert "k-sample homogeneity" in got.method and got.numerator_df == want["numerator_df"]
    np.testing.assert_allclose(
        [got.statistic, got.pvalue, got.pearson, *got.eigenvalues],
        [want["statistic"], want["pvalue"], want["pearson"], *want["eigenvalues"]],
        rtol=1e-12,
    )
    assert len(got.eigenvalues) == 2 * 3  # (k - 1) x (groups - 1)


def test_a_release_older_than_design_snapshots_waits_for_the_next(served):
    server, collector, stub, _, rng = served
    request = ldp_pb2.EstimateRequest(
        survey_id="field", question_id="rr", group="north", design=ldp_pb2.DesignOptions()
    )
    assert stub.Estimate(request, timeout=30).n > 0
    with closing(sqlite3.connect(server.db)) as conn, conn:
        conn.execute("DROP TABLE design_releases")  # as a store released before design rows
    with pytest.raises(grpc.RpcError) as caught:
        stub.Estimate(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "predates design snapshots" in caught.value.details()
    _upload_north(server, collector, rng, 50)
    assert stub.Estimate(request, timeout=30).n == stub.Estimate(request, timeout=30).n > 0


def test_both_engines_release_designs_and_plain_stores_are_unchanged(tmp_path):
    from aggregator.store.postgres.analysis import PostgresAnalysis

    assert issubclass(SqliteAnalysis, ReleasesDesigns)
    assert issubclass(PostgresAnalysis, ReleasesDesigns)  # tests/store/postgres/: its answers
    server = ServerThread(write_survey(tmp_path), tmp_path / "store.sqlite").start()
    try:
        with grpc.insecure_channel(server.target) as channel:
            plain = server.surveys["plain"].question("rr")
            reports = [
                ldp_pb2.Report(
                    report_id=bytes([i]) * 16,
                    survey_id="plain",
                    question_id="rr",
                    payload=plain.mechanism.encode(i % 4),
                    definition_digest=plain.digest,
                )
                for i in range(10)
            ]
            ldp_pb2_grpc.CollectorStub(channel).Upload(
                ldp_pb2.UploadRequest(reports=reports), timeout=10
            )
        with grpc.insecure_channel(server.analyst_target) as channel:
            request = ldp_pb2.EstimateRequest(survey_id="plain", question_id="rr")
            assert ldp_pb2_grpc.AnalystStub(channel).Estimate(request, timeout=30).n == 10
        with closing(sqlite3.connect(server.db)) as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        assert "releases" in tables and "design_releases" not in tables
    finally:
        server.stop()


@pytest.mark.slow
def test_design_answers_on_a_workers_server(tmp_path):
    """serve --workers 1: the analyst worker moves the release on its own connection, and the
    design rows move with it: --server equals --db at the release point."""
    from service.server.test_workers import connection, start, stop

    config = write_survey(tmp_path)
    db = tmp_path / "store.sqlite"
    process, target, analyst_target = start(config, db, tmp_path, workers=1)
    try:
        batch, _ = messages(load_surveys(config)["field"], "rr", 300, np.random.default_rng(5))
        with connection(target) as channel:
            ldp_pb2_grpc.CollectorStub(channel).Upload(
                ldp_pb2.UploadRequest(reports=batch), timeout=30
            )
        where = ["estimate", "--survey", "field", "--question", "rr", "--design", "--json"]
        remote = run_cli("agg", *where, "--server", analyst_target, check=True).stdout
        local = run_cli("agg", *where, "--config", config, "--db", db, check=True).stdout
        assert remote == local and json.loads(remote)["n"] == 300
    finally:
        status, stderr = stop(process)
    assert status == 0, stderr


def test_the_wire_is_design_based_by_default(served):
    """Without ``design`` a survey that declares one is answered design-based; ignore_design
    answers as a simple random sample with the trailer ``ldp-design: ignored``; both at once,
    or a method sent where the answer is design-based by default, are INVALID_ARGUMENT. The
    command line over --server agrees without a flag."""
    server, _, stub, config, _ = served
    default = stub.Estimate(ldp_pb2.EstimateRequest(survey_id="field", question_id="rr"))
    designed = stub.Estimate(
        ldp_pb2.EstimateRequest(survey_id="field", question_id="rr", design=ldp_pb2.DesignOptions())
    )
    assert default == designed and default.design.startswith("stratified cluster design")
    plain, call = stub.Estimate.with_call(
        ldp_pb2.EstimateRequest(survey_id="field", question_id="rr", ignore_design=True)
    )
    assert not plain.design and plain.n == 600
    assert ("ldp-design", "ignored") in tuple(call.trailing_metadata())
    gof = ldp_pb2.GoodnessOfFitRequest(survey_id="field", question_id="rr", p0=[0.25] * 4)
    assert "Rao-Scott" in stub.GoodnessOfFit(gof).method
    gof.ignore_design = True
    assert "Rao-Scott" not in stub.GoodnessOfFit(gof).method
    refused = [
        ldp_pb2.EstimateRequest(
            survey_id="field", question_id="rr", design=ldp_pb2.DesignOptions(), ignore_design=True
        ),
        ldp_pb2.GoodnessOfFitRequest(
            survey_id="field", question_id="rr", p0=[0.25] * 4, method="pearson"
        ),
    ]
    for request in refused:
        call = stub.Estimate if isinstance(request, ldp_pb2.EstimateRequest) else stub.GoodnessOfFit
        with pytest.raises(grpc.RpcError) as caught:
            call(request, timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    remote, local = _both(server, config, "estimate", "--survey", "field", "--question", "rr")
    assert remote == local and "design-based estimate" in remote


def test_the_interval_is_chosen_alike_over_the_server_and_the_store(served):
    """--interval beta (the default, inside [0, 1]), logit and wald, and --small-sample
    bell-mccaffrey (the default) or as-r: the server answers what the store answers, the answer
    names its interval and degrees of freedom; an unknown one is INVALID_ARGUMENT."""
    server, _, stub, config, _ = served
    where = ["estimate", "--survey", "field", "--question", "rr", "--json"]
    answers = {}
    for interval in ("beta", "logit", "wald"):
        remote, local = _both(server, config, *where, "--interval", interval)
        assert remote == local
        answers[interval] = json.loads(remote)
    assert answers["beta"] == json.loads(_both(server, config, *where)[0])
    assert answers["beta"]["interval_method"].startswith("Korn-Graubard")
    assert answers["beta"]["ci_low"] != answers["wald"]["ci_low"]
    assert all(low >= 0 for low in answers["beta"]["ci_low"])
    bad = ldp_pb2.EstimateRequest(
        survey_id="field", question_id="rr", design=ldp_pb2.DesignOptions(interval="exact")
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub.Estimate(bad, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "design interval must be one of" in caught.value.details()
    as_r, _ = _both(server, config, *where, "--small-sample", "as-r")
    as_r = json.loads(as_r)
    assert answers["beta"]["small_sample"] == "bell-mccaffrey" and as_r["small_sample"] == "as-r"
    assert as_r["interval_df"] == as_r["degrees_of_freedom"] == 15
    assert answers["beta"]["interval_df"] < 15 and as_r["ci_low"] != answers["beta"]["ci_low"]
    bad = ldp_pb2.EstimateRequest(
        survey_id="field", question_id="rr", design=ldp_pb2.DesignOptions(small_sample="exact")
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub.Estimate(bad, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
