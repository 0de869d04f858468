"""Survey designs end to end: devices carrying design keys upload over real gRPC on loopback into
a real SQLite store; ``estimate --design`` and ``test --design`` (and open_survey(design=True))
equal the design statistics of the same decoded reports and frame; keys that do not fit are
refused with WRONG_DESIGN_KEY; a store without design statistics opens; the device keeps its key."""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import closing
from pathlib import Path

import grpc
import numpy as np
import pytest
from aggregator_process import free_port
from cli_runner import run_cli
from conftest import ServerThread

from aggregator import open_survey
from aggregator.errors import InvalidInputError
from aggregator.stats.design.calibration import post_stratified_estimate
from aggregator.stats.design.cells import Design, contributions, design_cells
from aggregator.stats.design.estimate import design_estimate
from aggregator.stats.design.rao_scott import (
    design_goodness_of_fit,
    design_independence,
    design_k_sample,
)
from aggregator.store import checks, ingest
from aggregator.store.sqlite import design_statistics
from aggregator.survey_file.config import ConfigError, load_surveys
from aggregator.survey_file.design import IGNORES_DESIGN
from client.device.design_key import DesignKeyChangedError
from client.device.ledger import Budget
from client.device.reporter import Reporter
from client.device.transport import Transport
from client.survey import SurveyError, SurveySpec, survey_to_json
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

SURVEYS = """
[[survey]]
id = "field"
min_batch_size = 50
group_label = "region"
group_values = ["north", "south"]
design = { table = "frame.csv" }

[[survey.question]]
id = "rr"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 2.0
ordinal = true

[[survey.question]]
id = "noise"
categories = ["x", "y", "z"]
mechanism = "gaussian"
rho = 1.0

[[survey.question]]
id = "pair"
mechanism = "flip_components"
epsilon = 4.0
attributes = [
    { name = "smoker", categories = ["no", "yes"] },
    { name = "exercise", categories = ["never", "weekly", "daily"] },
]

[[survey]]
id = "plain"
min_batch_size = 5

[[survey.question]]
id = "rr"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0
"""
#: key -> (stratum, psu, weight): 3 strata x 6 PSUs x 2 weight classes.
FRAME = {
    f"k{h}{c}{w}": (f"s{h}", f"p{h}{c}", 1.0 + h + 3.0 * w)
    for h in range(3)
    for c in range(6)
    for w in range(2)
}


def write_survey(root: Path, frame: str | None = None) -> Path:
    lines = ["key,stratum,psu,weight"] + [f"{k},{s},{p},{w}" for k, (s, p, w) in FRAME.items()]
    (root / "frame.csv").write_text(frame if frame is not None else "\n".join(lines) + "\n")
    (root / "surveys.toml").write_text(SURVEYS)
    return root / "surveys.toml"


def messages(survey: SurveySpec, question_id: str, n: int, rng) -> tuple[list, dict]:
    """n reports of one question from devices in every PSU, their answers clustered by PSU;
    the messages and what was sent (decoded reports, keys, groups)."""
    question = survey.question(question_id)
    mech = question.mechanism
    keys = rng.choice(sorted(FRAME), size=n)
    groups = rng.choice(["north", "south"], size=n)
    tilt = {psu: rng.dirichlet(np.full(mech.k, 2.0)) for _, psu, _ in FRAME.values()}
    answers = np.array([rng.choice(mech.k, p=tilt[FRAME[key][1]]) for key in keys])
    decoded = mech.simulate(answers, rng)
    sent = [
        ldp_pb2.Report(
            report_id=os.urandom(16),
            survey_id=survey.id,
            question_id=question_id,
            payload=mech.encode(r),
            definition_digest=question.digest,
            group=str(g),
            design_key=str(key),
        )
        for r, g, key in zip(decoded, groups, keys, strict=True)
    ]
    return sent, {"decoded": decoded, "keys": keys, "groups": groups}


def direct_cells(mech, sent: dict, by_group: bool = False):
    """The design cells of the decoded reports themselves (the reference)."""
    rows = [FRAME[key] for key in sent["keys"]]
    design = Design(
        np.array([r[0] for r in rows]),
        np.array([r[1] for r in rows]),
        np.array([r[2] for r in rows]),
    )
    domains = (sent["groups"] == "south").astype(int) if by_group else None
    return design_cells(contributions(mech, sent["decoded"]), design, domains, 2 if by_group else 1)


@pytest.fixture(scope="module")
def populated(tmp_path_factory):
    root = tmp_path_factory.mktemp("design")
    config = write_survey(root)
    server = ServerThread(config, root / "store.sqlite").start()
    channel = grpc.insecure_channel(server.target)
    collector = ldp_pb2_grpc.CollectorStub(channel)
    rng = np.random.default_rng(29)
    survey = server.surveys["field"]
    sent = {}
    for question_id in ("rr", "noise", "pair"):
        batch, sent[question_id] = messages(survey, question_id, 1500, rng)
        for start in range(0, len(batch), 500):
            collector.Upload(ldp_pb2.UploadRequest(reports=batch[start : start + 500]), timeout=30)
    yield server, collector, sent, config
    channel.close()
    server.stop()


def _close(a, b, rtol=1e-12):
    np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=rtol)


# -- the CLI and the Python API equal the design statistics of the decoded reports ------------


@pytest.mark.parametrize("question_id", ["rr", "noise"])
def test_estimate_design_equals_the_decoded_reports_design_estimate(populated, question_id):
    server, _, sent, config = populated
    mech = server.surveys["field"].question(question_id).mechanism
    expected = design_estimate(direct_cells(mech, sent[question_id]), mech)
    args = ["estimate", "--config", config, "--db", server.db, "--survey", "field"]
    out = run_cli("agg", *args, "--question", question_id, "--design", "--json", check=True)
    got = json.loads(out.stdout)
    _close(got["estimate"], expected.estimate[0])
    _close(got["standard_error"], expected.standard_error[0])
    _close(got["deff"], expected.deff[0])
    _close(got["clustering_effect"], expected.clustering_effect[0])
    assert got["design"] == "stratified cluster design: 3 strata, 18 PSUs, weights"
    assert got["n"] == 1500 and got["degrees_of_freedom"] == 15
    text = run_cli("agg", *args, "--question", question_id, "--design", check=True).stdout
    assert "deff" in text and "clustering" in text and "3 strata, 18 PSUs" in text


def test_design_tests_equal_the_decoded_reports_tests(populated):
    server, _, sent, config = populated
    mech = server.surveys["field"].question("rr").mechanism
    args = ["test", "--config", config, "--db", server.db, "--survey", "field", "--question", "rr"]
    p0 = np.full(4, 0.25)
    gof = run_cli("agg", *args, "gof", "--p0", "uniform", "--design", "--json", check=True)
    expected = design_goodness_of_fit(direct_cells(mech, sent["rr"]), mech, p0)
    got = json.loads(gof.stdout)
    _close(got["statistic"], expected.statistic)
    _close(got["pvalue"], expected.pvalue, rtol=1e-9)
    assert "Rao-Scott" in got["method"]
    pair = server.surveys["field"].question("pair").mechanism
    independence = run_cli(
        "agg", *args[:-1], "pair", "independence", "--design", "--variance", "jackknife",
        "--correction", "second-order", "--json", check=True,
    )  # fmt: skip
    expected = design_independence(
        direct_cells(pair, sent["pair"]), pair, 2, 3, "second-order", method="jackknife"
    )
    _close(json.loads(independence.stdout)["statistic"], expected.statistic)
    _close(json.loads(independence.stdout)["pvalue"], expected.pvalue, rtol=1e-9)
    wald = run_cli(
        "agg", *args, "homogeneity", "--design", "--correction", "wald", "--json", check=True
    )
    expected = design_k_sample(direct_cells(mech, sent["rr"], by_group=True), mech, "wald")
    _close(json.loads(wald.stdout)["statistic"], expected.statistic)


def test_a_survey_with_a_design_is_design_based_by_default(populated):
    """Without a flag, estimate and test answer as --design does; --ignore-design answers as a
    simple random sample and says, in text and JSON, that it ignores the sampling design."""
    server, _, _, config = populated
    where = ["--config", config, "--db", server.db, "--survey", "field", "--question", "rr"]
    for command in (("estimate",), ("test", "gof", "--p0", "uniform")):
        default = run_cli("agg", command[0], *where, *command[1:], "--json", check=True)
        flagged = run_cli("agg", command[0], *where, *command[1:], "--design", "--json", check=True)
        assert json.loads(default.stdout) == json.loads(flagged.stdout)
        assert "design" in json.loads(default.stdout)
        srs = run_cli(
            "agg", command[0], *where, *command[1:], "--ignore-design", "--json", check=True
        )
        got = json.loads(srs.stdout)
        assert got["ignores_design"] is True and got["design_label"] == IGNORES_DESIGN
        assert "design" not in got
        text = run_cli("agg", command[0], *where, *command[1:], "--ignore-design", check=True)
        assert text.stdout.splitlines()[0] == IGNORES_DESIGN
    plain = ["--config", config, "--db", server.db, "--survey", "plain", "--question", "rr"]
    out = run_cli("agg", "estimate", *plain)  # no design: the simple answer (nothing released)
    assert out.returncode == 3 and "design" not in out.stderr


def test_every_command_is_design_based_or_says_it_ignores_the_design(populated):
    """k-sample and two-sample --groups answer the Rao-Scott homogeneity test by default (the
    same as test homogeneity), ordinal the design-based mean scores, conditional the ratios of
    the design-based shares; two questions have no design-based comparison: one line, unless
    --ignore-design, whose answer says it ignores the design."""
    server, _, sent, config = populated
    where = ["--config", config, "--db", server.db]
    one = [*where, "--survey", "field", "--question", "rr"]
    homogeneity = json.loads(
        run_cli("agg", "test", *one, "homogeneity", "--json", check=True).stdout
    )
    k_sample = json.loads(run_cli("agg", "k-sample", *one, "--json", check=True).stdout)
    two = run_cli("agg", "two-sample", *one, "--groups", "north", "south", "--json", check=True)
    for answer in (k_sample, json.loads(two.stdout)):
        assert answer["statistic"] == homogeneity["statistic"]
        assert answer["design"] == homogeneity["design"] and "Rao-Scott" in answer["method"]
    srs = json.loads(
        run_cli("agg", "k-sample", *one, "--ignore-design", "--json", check=True).stdout
    )
    assert srs["ignores_design"] is True and "Rao-Scott" not in srs["method"]
    mech = server.surveys["field"].question("rr").mechanism
    expected = design_estimate(direct_cells(mech, sent["rr"], by_group=True), mech)
    scores = np.arange(1.0, 5.0)
    ordinal = run_cli("agg", "ordinal", *one, "--groups", "north", "south", "--json", check=True)
    got = json.loads(ordinal.stdout)
    assert got["design"].startswith("design-based: stratified cluster design")
    _close([row["mean"] for row in got["mean_scores"]], expected.estimate @ scores)
    assert "F(1, " in run_cli("agg", "ordinal", *one, "--groups", "north", "south").stdout
    plain = run_cli("agg", "ordinal", *one, "--ignore-design", "--json", check=True)
    assert json.loads(plain.stdout)["ignores_design"] is True
    pair = [*where, "--survey", "field", "--question", "pair"]
    conditional = json.loads(run_cli("agg", "conditional", *pair, "--json", check=True).stdout)
    assert conditional["design"].startswith("design-based: stratified cluster design")
    joint = (
        design_estimate(
            direct_cells(server.surveys["field"].question("pair").mechanism, sent["pair"]),
            server.surveys["field"].question("pair").mechanism,
        )
        .estimate[0]
        .reshape(2, 3)
    )
    never = conditional["conditional"][0]["shares"]  # P(smoker | exercise = never)
    _close([never["no"]["share"], never["yes"]["share"]], joint[:, 0] / joint[:, 0].sum())
    assert IGNORES_DESIGN in run_cli("agg", "conditional", *pair, "--ignore-design").stdout
    questions = ["--a", "field:rr", "--b", "field:noise"]
    refused = run_cli("agg", "two-sample", *where, *questions)
    assert refused.returncode == 2 and "two questions is not available" in refused.stderr


def test_the_python_api_is_design_based_by_default(populated):
    """open_survey reads a survey's design without being asked; a question's estimate and tests
    are then design-based (equal to the command line's), design=False the simple ones."""
    server, _, _, config = populated
    data = open_survey(config, server.db, "field")
    rr = data["rr"]
    where = ["--config", config, "--db", server.db, "--survey", "field", "--question", "rr"]
    cli = json.loads(run_cli("agg", "estimate", *where, "--json", check=True).stdout)
    _close(rr.estimate().estimate, cli["estimate"])
    assert rr.estimate().design == cli["design"]
    gof = json.loads(
        run_cli("agg", "test", *where, "gof", "--p0", "uniform", "--json", check=True).stdout
    )
    _close(rr.goodness_of_fit(np.full(4, 0.25)).statistic, gof["statistic"])
    assert "Rao-Scott" in data["pair"].independence().method
    simple = rr.estimate(design=False)
    assert not hasattr(simple, "design") and simple.n == rr.n
    plain = open_survey(config, server.db, "field", design=False)["rr"]
    assert (
        plain.stored_design is None
        and "Rao-Scott" not in plain.goodness_of_fit(np.full(4, 0.25)).method
    )
    with pytest.raises(InvalidInputError, match="opened with design=False"):
        plain.estimate(design=True)


def test_open_survey_design_gives_the_cells(populated):
    server, _, sent, config = populated
    data = open_survey(config, server.db, "field", design=True)
    mech = data["rr"].question.mechanism
    got = design_estimate(data["rr"].design.cells(), mech, "jackknife")
    expected = design_estimate(direct_cells(mech, sent["rr"]), mech, "jackknife")
    _close(got.estimate, expected.estimate)
    _close(got.covariance, expected.covariance, rtol=1e-10)
    north = open_survey(config, server.db, "field", group="north", design=True)["rr"].design
    assert north.n == int((sent["rr"]["groups"] == "north").sum())
    with pytest.raises(ConfigError, match="no sampling design"):
        open_survey(config, server.db, "plain", design=True)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("estimate", "--simultaneous", "--design"), "--simultaneous is not for a design-based"),
        (("estimate", "--estimator", "unbiased", "--design"), "is not for a design-based answer"),
        (("test", "gof", "--p0", "uniform", "--method", "pearson", "--design"), "--method is"),
        (("test", "independence", "--calibration", "monte-carlo", "--design"), "--calibration"),
        # design-based by default: the SRS options point to the opt-out
        (("estimate", "--simultaneous"), "declares a sampling design); its options"),
        (("test", "gof", "--p0", "uniform", "--method", "pearson"), "--ignore-design analyses"),
        (("test", "homogeneity", "--ignore-design"), "homogeneity is the design-based test"),
        (("estimate", "--design", "--ignore-design"), "contradict each other"),
    ],
)
def test_options_that_do_not_apply_are_one_line(populated, extra, message):
    server, _, _, config = populated
    where = ["--config", config, "--db", server.db, "--survey", "field", "--question", "rr"]
    out = run_cli("agg", extra[0], *where, *extra[1:])
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_design_on_a_survey_without_one_is_one_line(populated):
    server, _, _, config = populated
    args = ["estimate", "--config", config, "--db", server.db, "--survey", "plain"]
    out = run_cli("agg", *args, "--question", "rr", "--design")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "has no sampling design" in lines[0]


# -- ingest ------------------------------------------------------------------------------------


def _one(survey: str, key: str, group: str = "north") -> ldp_pb2.Report:
    return ldp_pb2.Report(
        report_id=os.urandom(16),
        survey_id=survey,
        question_id="rr",
        payload=(1).to_bytes(4, "little"),
        group=group if survey == "field" else "",
        design_key=key,
    )


@pytest.mark.parametrize(
    ("survey", "key", "message"),
    [
        ("field", "k999", "unknown design key 'k999'"),
        ("field", "", "no design key given"),
        ("plain", "k000", "has no sampling design"),
    ],
)
def test_a_key_that_does_not_fit_is_refused(populated, survey, key, message):
    server, collector, _, config = populated
    before = open_survey(config, server.db, "field", design=True)["rr"].design.n
    good = _one("field", "k000")
    with pytest.raises(grpc.RpcError) as caught:
        collector.Upload(ldp_pb2.UploadRequest(reports=[good, _one(survey, key)]), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "report[1]" in caught.value.details() and message in caught.value.details()
    stream = collector.UploadStream(
        iter([ldp_pb2.UploadRequest(reports=[_one(survey, key)])]), timeout=10
    )
    (result,) = stream.results
    assert result.status == ldp_pb2.REJECTED and result.code == "INVALID_ARGUMENT"
    assert message in result.reason
    assert open_survey(config, server.db, "field", design=True)["rr"].design.n == before
    with pytest.raises(checks.ReportRejectedError) as rejected:
        ingest.validate(_one(survey, key), server.surveys)
    assert rejected.value.reason is checks.Rejection.WRONG_DESIGN_KEY


# -- the survey file ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        ("key,stratum,weight\nk,s,1\n", "missing column(s) psu"),
        ("key,stratum,psu,weight\nk,s,p,1\nk,s,q,2\n", "key 'k' appears twice"),
        ("key,stratum,psu,weight\nk,s,p,0\n", "weight must be a finite positive number"),
        ("key,stratum,psu,weight\nk,s,p,nan\n", "weight must be a finite positive number"),
        ("key,stratum,psu,weight\nk,s,p,1\nj,t,p,1\n", "psu 'p' lies in strata 's' and 't'"),
        ("key,stratum,psu,weight,fpc\nk,s,p,1,10\nj,s,q,1,12\n", "fpc differs within stratum"),
        ("key,stratum,psu,weight\n", "lists no keys"),
        ("key,stratum,psu,weight,size\nk,s,p,1,3\n", "unexpected or repeated column"),
    ],
)
def test_frame_mistakes_are_one_line_config_errors(tmp_path, frame, message):
    config = write_survey(tmp_path, frame)
    with pytest.raises(ConfigError) as caught:
        load_surveys(config)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    out = run_cli("agg", "check-config", config)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1


def test_a_frame_saved_with_a_byte_order_mark_reads(tmp_path):
    lines = ["key,stratum,psu,weight"] + [f"{k},{s},{p},{w}" for k, (s, p, w) in FRAME.items()]
    config = write_survey(tmp_path, "\ufeff" + "\n".join(lines) + "\n")
    frame = load_surveys(config)["field"].design
    assert frame is not None and frame.check_key("field", "k000") == "k000"


def test_too_many_per_key_sums_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("aggregator.survey_file.design.MAX_DESIGN_CELLS", 100)
    with pytest.raises(ConfigError, match=r"question rr: 36 design keys x 4 categories need 144"):
        load_surveys(write_survey(tmp_path))


def test_too_many_keys_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("aggregator.survey_file.design.MAX_DESIGN_KEYS", 10)
    with pytest.raises(ConfigError, match="more than 10 keys"):
        load_surveys(write_survey(tmp_path))


def test_the_wire_says_a_key_is_required_and_keeps_it_out_of_the_digest(tmp_path):
    survey = load_surveys(write_survey(tmp_path))["field"]
    message = survey.to_proto(key_digests=True)
    assert message.design_key_required
    device = SurveySpec.from_proto(message)
    assert device.design is not None and device.check_design_key("k000") == "k000"
    with pytest.raises(SurveyError, match="unknown design key 'anything'"):
        device.check_design_key("anything")  # the frame's key digests travel with the survey
    assert device.question("rr").digest == survey.question("rr").digest
    plain = write_survey(tmp_path)
    text = plain.read_text().replace('design = { table = "frame.csv" }\n', "")
    plain.write_text(text)
    assert load_surveys(plain)["field"].question("rr").digest == survey.question("rr").digest


# -- a store without design statistics, the device ----------------------------------------------


def test_a_store_without_design_statistics_opens_and_gains_them(tmp_path):
    config = write_survey(tmp_path)
    server = ServerThread(config, tmp_path / "store.sqlite").start()
    try:
        with grpc.insecure_channel(server.target) as channel:
            collector = ldp_pb2_grpc.CollectorStub(channel)
            plain = [_one("plain", "") for _ in range(10)]
            collector.Upload(ldp_pb2.UploadRequest(reports=plain), timeout=10)
            with closing(sqlite3.connect(server.db)) as conn:
                tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
            assert "design_statistics" not in tables  # a survey without a design pays nothing
            data = open_survey(config, server.db, "field", design=True)
            empty = data["rr"].stored_design
            assert empty is not None and empty.n == 0  # withheld below min_batch_size, and empty
            rng = np.random.default_rng(1)
            batch, _ = messages(server.surveys["field"], "rr", 60, rng)
            collector.Upload(ldp_pb2.UploadRequest(reports=batch), timeout=10)
        assert open_survey(config, server.db, "field", design=True)["rr"].design.n == 60
    finally:
        server.stop()


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """A server of its own for the device's tests, so that their reports change nothing the
    comparisons above read (whichever order or worker runs them)."""
    root = tmp_path_factory.mktemp("design-device")
    server = ServerThread(write_survey(root), root / "store.sqlite").start()
    yield server, root / "surveys.toml"
    server.stop()


def test_a_device_keeps_its_design_key(fresh, tmp_path):
    server, _ = fresh
    state = tmp_path / "device.sqlite"
    reporter = Reporter(Transport(server.target), state, Budget(20.0))
    try:
        with pytest.raises(SurveyError, match="give this device's design key"):
            reporter.answer("field", "rr", "a", group="north")
        with pytest.raises(SurveyError, match="no sampling design"):
            reporter.answer("plain", "rr", "a", design_key="k000")
        assert reporter.ledger.spent() == (0.0, 0.0)
        reporter.answer("field", "rr", "a", group="north", design_key="k010")
        with pytest.raises(DesignKeyChangedError, match="under design key 'k010'"):
            reporter.answer("field", "noise", "x", design_key="k011")
        assert reporter.flush().accepted == 1
    finally:
        reporter.close()
    with closing(sqlite3.connect(server.db)) as conn:
        stats = design_statistics.read(conn, "field", "rr")
    assert [(stat.group, stat.key, stat.n) for stat in stats] == [("north", "k010", 1)]


def test_ldp_client_submit_design_key(fresh, tmp_path):
    server, _ = fresh
    base = ["submit", "--server", server.target, "--state", tmp_path / "d.sqlite", "--insecure"]
    base += ["--survey", "field", "--question", "rr", "--answer", "b", "--group", "south"]
    first = run_cli("client", *base, "--budget", "10", "--design-key", "k020")
    assert first.returncode == 0, first.stderr
    other = [*base[:-6], "--question", "noise", "--answer", "x", "--design-key", "k021"]
    second = run_cli("client", *other)
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "under design key 'k020'" in lines[0]


@pytest.mark.parametrize("fmt", ["html", "md"])
def test_the_report_shows_design_effects_beside_the_estimate(populated, tmp_path, fmt):
    server, _, _, config = populated
    out = tmp_path / f"field.{fmt}"
    args = ["report", "--config", config, "--db", server.db, "--survey", "field"]
    run_cli("agg", *args, "--out", out, "--format", fmt, check=True)
    text = out.read_text()
    assert "Design-based estimate (stratified cluster design: 3 strata, 18 PSUs, weights" in text
    data = open_survey(config, server.db, "field", design=True)["rr"]  # other tests add reports
    expected = design_estimate(data.design.cells(), data.question.mechanism)
    assert f"{expected.deff[0, 0]:.3g}" in text and "clustering" in text


def test_check_config_describes_the_frame(tmp_path):
    config = write_survey(tmp_path)
    out = run_cli("agg", "check-config", config, check=True).stdout
    assert "sampling design" in out and "36 keys, 3 strata, 18 PSUs" in out
    rows = json.loads(run_cli("agg", "check-config", config, "--json", check=True).stdout)
    design = {row["survey"]: row["design"] for row in rows["surveys"]}
    assert design["plain"] is None and design["field"]["psus"] == 18


def test_a_stratum_with_one_psu_is_one_line_exit_3(tmp_path):
    frame = "key,stratum,psu,weight\na,s0,p0,1\nb,s0,p1,2\nc,s1,p2,1\n"
    config = write_survey(tmp_path, frame)
    server = ServerThread(config, tmp_path / "store.sqlite").start()
    try:
        survey = server.surveys["field"]
        rng = np.random.default_rng(4)
        mech = survey.question("rr").mechanism
        batch = [
            ldp_pb2.Report(
                report_id=os.urandom(16),
                survey_id="field",
                question_id="rr",
                payload=mech.encode(r),
                group="north",
                design_key=str(key),
            )
            for r, key in zip(mech.simulate(rng.choice(4, 90), rng), "abc" * 30, strict=True)
        ]
        with grpc.insecure_channel(server.target) as channel:
            collector = ldp_pb2_grpc.CollectorStub(channel)
            collector.Upload(ldp_pb2.UploadRequest(reports=batch), timeout=10)
        args = ["estimate", "--config", config, "--db", server.db, "--survey", "field"]
        out = run_cli("agg", *args, "--question", "rr", "--design")
        assert out.returncode == 3
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "1 stratum(s) with a single PSU" in lines[0]
    finally:
        server.stop()


POST_STRATIFIED = 'design = { table = "frame.csv", population = { young = 6000, old = 4000 } }'


def test_estimate_design_post_stratifies_to_known_counts(tmp_path):
    """A frame with a post_stratum column and population counts: estimate --design equals
    post_stratified_estimate on the decoded reports' cells with the post-strata as domains."""
    band = {key: ("young" if int(key[2]) % 2 else "old") for key in FRAME}
    lines = ["key,stratum,psu,weight,post_stratum"]
    lines += [f"{k},{s},{p},{w},{band[k]}" for k, (s, p, w) in FRAME.items()]
    config = write_survey(tmp_path, "\n".join(lines) + "\n")
    config.write_text(SURVEYS.replace('design = { table = "frame.csv" }', POST_STRATIFIED))
    server = ServerThread(config, tmp_path / "store.sqlite").start()
    try:
        batch, sent = messages(server.surveys["field"], "rr", 600, np.random.default_rng(6))
        with grpc.insecure_channel(server.target) as channel:
            collector = ldp_pb2_grpc.CollectorStub(channel)
            collector.Upload(ldp_pb2.UploadRequest(reports=batch), timeout=30)
        args = ["estimate", "--config", config, "--db", server.db, "--survey", "field"]
        out = run_cli("agg", *args, "--question", "rr", "--design", "--json", check=True)
        got = json.loads(out.stdout)
        mech = server.surveys["field"].question("rr").mechanism
        rows = [FRAME[key] for key in sent["keys"]]
        design = Design(*(np.array([r[i] for r in rows]) for i in range(3)))
        domains = np.array([band[key] == "old" for key in sent["keys"]], dtype=int)  # young, old
        cells = design_cells(contributions(mech, sent["decoded"]), design, domains, 2)
        expected = post_stratified_estimate(cells, np.array([6000.0, 4000.0]))
        _close(got["estimate"], expected.estimate)
        _close(got["standard_error"], expected.standard_error)
        assert "post-stratified to 2 post-strata" in got["design"]
        text = run_cli("agg", *args, "--question", "rr", "--design", check=True).stdout
        assert "post-stratified to 2 post-strata" in text
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("design", "frame_extra", "message"),
    [
        ('design = { table = "frame.csv", population = { young = 1 } }', "young", "at least 2"),
        (POST_STRATIFIED.replace("4000", "-1"), "young", "must be a finite positive count"),
        (POST_STRATIFIED, "middle", "post_stratum 'middle' has no population count"),
        (POST_STRATIFIED, "young", "no key lies in post-stratum 'old'"),
        ('design = { table = "frame.csv" }', "young", "a post_stratum column needs population"),
        ('design = { table = "frame.csv", weights = "w" }', None, "must be { table"),
    ],
)
def test_post_strata_mistakes_are_one_line(tmp_path, design, frame_extra, message):
    header = "key,stratum,psu,weight" + (",post_stratum" if frame_extra else "")
    rows = [
        f"{k},{s},{p},{w}" + (f",{frame_extra}" if frame_extra else "")
        for k, (s, p, w) in FRAME.items()
    ]
    config = write_survey(tmp_path, "\n".join([header, *rows]) + "\n")
    config.write_text(SURVEYS.replace('design = { table = "frame.csv" }', design))
    with pytest.raises(ConfigError) as caught:
        load_surveys(config)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_split_survey_reads_one_side_and_one_group(tmp_path):
    """Design statistics are kept per side and group: estimate --design --group G on the
    exploration side equals the design estimate of exactly those reports."""
    config = write_survey(tmp_path)
    config.write_text(
        SURVEYS.replace("min_batch_size = 50", "min_batch_size = 20\nexploration_fraction = 0.5")
    )
    server = ServerThread(config, tmp_path / "store.sqlite").start()
    try:
        survey = server.surveys["field"]
        batch, sent = messages(survey, "rr", 800, np.random.default_rng(8))
        sides = np.random.default_rng(9).choice([ldp_pb2.EXPLORATION, ldp_pb2.CONFIRMATION], 800)
        for report, side in zip(batch, sides, strict=True):
            report.side = int(side)
        with grpc.insecure_channel(server.target) as channel:
            collector = ldp_pb2_grpc.CollectorStub(channel)
            collector.Upload(ldp_pb2.UploadRequest(reports=batch), timeout=30)
        args = ["estimate", "--config", config, "--db", server.db, "--survey", "field"]
        args += ["--question", "rr", "--design", "--group", "south", "--json"]
        got = json.loads(run_cli("agg", *args, "--side", "exploration", check=True).stdout)
        mask = (sides == ldp_pb2.EXPLORATION) & (sent["groups"] == "south")
        mech = survey.question("rr").mechanism
        picked = {name: values[mask] for name, values in sent.items()}
        expected = design_estimate(direct_cells(mech, picked), mech)
        assert got["n"] == int(mask.sum())
        _close(got["estimate"], expected.estimate[0])
        _close(got["standard_error"], expected.standard_error[0])
    finally:
        server.stop()


def test_ldp_client_simulate_gives_devices_design_keys(tmp_path):
    config = write_survey(tmp_path)
    server = ServerThread(config, tmp_path / "store.sqlite").start()
    try:
        base = ["simulate", "--server", server.target, "--insecure", "--survey", "field"]
        base += ["--devices", "80", "--seed", "3"]
        missing = run_cli("client", *base)
        assert missing.returncode == 2
        lines = missing.stderr.strip().splitlines()
        assert len(lines) == 1 and "--design-keys FRAME.csv" in lines[0]
        run_cli("client", *base, "--design-keys", tmp_path / "frame.csv", check=True)
        data = open_survey(config, server.db, "field", design=True)
        assert data["rr"].design.n == 80 and {s.key for s in data["rr"].design.keys} <= set(FRAME)
        args = ["estimate", "--config", config, "--db", server.db, "--survey", "field"]
        run_cli("agg", *args, "--question", "noise", "--design", check=True)
    finally:
        server.stop()


def test_a_report_refused_for_good_exits_non_zero(fresh, tmp_path):
    """A report the server refuses for good makes submit and flush exit 1 with the reason in one
    line on stderr, the JSON carries it, and the Python result is not ok (issue 40 item 1: submit
    exited 0). Here a design key not in the frame, answered offline under an older definition
    without the frame's key digests: only the server can refuse it (issue 40 item 2)."""
    server, _ = fresh
    older = SurveySpec.from_proto(server.surveys["field"].to_proto())  # no key digests
    definition = tmp_path / "older.survey.json"
    definition.write_text(survey_to_json(older))
    offline = ["--server", f"127.0.0.1:{free_port()}", "--insecure", "--timeout", "1"]
    answer = ["--survey", "field", "--question", "rr", "--answer", "b", "--group", "south"]
    states = [tmp_path / "a.sqlite", tmp_path / "b.sqlite"]
    for state in states:
        run_cli("client", "install-survey", definition, "--state", state, check=True)
        out = run_cli(
            "client", "submit", *offline, "--state", state, *answer, "--budget", "10",
            "--design-key", "nope",
        )  # fmt: skip
        assert out.returncode == 0 and "unreachable" in out.stdout, out.stderr
    online = ["--server", server.target, "--insecure", "--state"]
    flushed = run_cli("client", "flush", *online, states[0], "--json")
    assert flushed.returncode == 1, flushed.stderr
    lines = flushed.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused for good" in lines[0] and "unknown design key" in lines[0]
    got = json.loads(flushed.stdout)
    assert got["rejected"] == 1 and "unknown design key 'nope'" in got["refusals"][0]
    plain = ["--survey", "plain", "--question", "rr", "--answer", "a"]
    out = run_cli("client", "submit", *online, states[1], *plain)  # its flush sends both
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused for good" in lines[0] and "design key" in lines[0]
    assert "refused for good" in out.stdout
    state = tmp_path / "p.sqlite"
    reporter = Reporter(Transport(f"127.0.0.1:{free_port()}", max_attempts=1), state, Budget(10))
    try:
        reporter.cache.put(older, str(definition))
        reporter.answer("field", "rr", "a", group="north", design_key="missing")
        assert reporter.offline and reporter.ledger.spent()[0] > 0
    finally:
        reporter.close()
    reporter = Reporter(Transport(server.target), state)
    try:
        result = reporter.flush()
    finally:
        reporter.close()
    assert not result.ok and result.rejected == 1 and "design key" in result.refusals[0]
