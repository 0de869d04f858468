"""Public-coin one-bit reports (RAPTOR) collected end to end: the survey file pins the public
seed and groups, devices answer through the real client over gRPC on loopback into a real SQLite
store, the Analyst RPC runs T3 exactly as the library does on the devices' own reports, estimates
are refused with a typed error, and the store, shards and the Beam job agree on the 2L-number
statistic. T3's Type I error is checked through the mechanism's own simulate path."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import numpy as np
import pytest
from cli_runner import run_cli
from conftest import ServerThread
from scipy import stats

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats import estimate, goodness_of_fit, independence, power, sample_size
from aggregator.store import ingest, shards
from aggregator.store.definitions import DefinitionChangedError
from aggregator.store.sqlite.pins import register
from aggregator.store.sqlite.report_store import ReportStore
from aggregator.survey_file.config import ConfigError, load_surveys
from client.device.ledger import Budget
from client.device.reporter import Reporter
from client.device.transport import Transport
from client.mechanisms import PublicCoinBit
from client.survey import survey_from_json, survey_to_json
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

LABELS = ", ".join(f'"c{j}"' for j in range(12))
SURVEYS = f"""
[[survey]]
id = "coin"
title = "public coin"
min_batch_size = 5

[[survey.question]]
id = "pc"
categories = [{LABELS}]
mechanism = "public_coin_bit"
epsilon = 1.0
public_seed = 12345
groups = 4
"""
P0 = [1 / 12] * 12


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "surveys.toml"
    path.write_text(SURVEYS)
    return path


@pytest.fixture
def server(tmp_path: Path, config: Path):
    running = ServerThread(config, tmp_path / "reports.sqlite").start()
    yield running
    running.stop()


def wire(payload: bytes) -> ldp_pb2.Report:
    return ldp_pb2.Report(
        report_id=os.urandom(16), survey_id="coin", question_id="pc", payload=payload
    )


def test_the_survey_file_pins_seed_and_groups(tmp_path: Path, config: Path) -> None:
    question = load_surveys(config)["coin"].question("pc")
    mech = question.mechanism
    assert isinstance(mech, PublicCoinBit) and (mech.public_seed, mech.groups) == (12345, 4)
    assert question.statistic_size == 8 and question.definition()["public_seed"] == 12345
    again = survey_from_json(survey_to_json(load_surveys(config)["coin"])).question("pc")
    assert again.mechanism == mech and again.digest == question.digest
    other = tmp_path / "other.toml"
    other.write_text(SURVEYS.replace("12345", "12346"))
    assert load_surveys(other)["coin"].question("pc").digest != question.digest
    for broken in (
        SURVEYS.replace("public_seed = 12345\n", ""),
        SURVEYS.replace("groups = 4", "groups = 0"),
        SURVEYS.replace('"public_coin_bit"', '"optimized_unary"'),  # seed on another mechanism
    ):
        other.write_text(broken)
        with pytest.raises(ConfigError, match=r"public_seed|groups"):
            load_surveys(other)
    # A store with reports refuses a new seed: the subsets decide how reports were randomized.
    with ReportStore(tmp_path / "store.sqlite") as store:
        register(store, load_surveys(config))
        store.put(ingest.validate_batch([wire(bytes(4))], load_surveys(config)))
        other.write_text(SURVEYS.replace("12345", "12346"))
        with pytest.raises(DefinitionChangedError, match="public_seed"):
            register(store, load_surveys(other))


def test_devices_to_t3_over_grpc(server, tmp_path: Path) -> None:
    question = server.surveys["coin"].question("pc")
    mech = question.mechanism
    rng = np.random.default_rng(4)
    payloads = []
    with Transport(server.target) as transport:
        for device in range(24):
            reporter = Reporter(transport, tmp_path / f"d{device}.sqlite", Budget(5.0))
            reporter.answer_index("coin", "pc", int(rng.integers(12)))
            payloads.append(reporter.outbox.pending()[0].payload)
            assert reporter.flush().accepted == 1
            reporter.close()
    local = Histogram.from_reports(mech, np.array([mech.decode(p) for p in payloads]))
    assert local.values[:4].sum() == 24
    analyst = ldp_pb2_grpc.AnalystStub(grpc.insecure_channel(server.analyst_target))
    for calibration in ("auto", "monte-carlo"):
        remote = analyst.GoodnessOfFit(
            ldp_pb2.GoodnessOfFitRequest(
                survey_id="coin", question_id="pc", p0=P0, calibration=calibration, seed=3
            )
        )
        mine = goodness_of_fit(local, np.array(P0), calibration=calibration, rng=3)
        assert remote.pvalue == mine.pvalue and remote.statistic == pytest.approx(mine.statistic)
        assert "T3" in remote.method
    with pytest.raises(grpc.RpcError) as refused:
        analyst.Estimate(ldp_pb2.EstimateRequest(survey_id="coin", question_id="pc"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "goodness_of_fit" in refused.value.details()


@pytest.mark.parametrize(
    "payload, code",
    [
        ((8).to_bytes(4, "little"), grpc.StatusCode.OUT_OF_RANGE),  # group 4 of L = 4
        (bytes(3), grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_bad_payloads_get_their_status(server, payload: bytes, code) -> None:
    collector = ldp_pb2_grpc.CollectorStub(grpc.insecure_channel(server.target))
    with pytest.raises(grpc.RpcError) as info:
        collector.Upload(ldp_pb2.UploadRequest(reports=[wire(payload)]), timeout=10)
    assert info.value.code() == code
    good = wire((7).to_bytes(4, "little"))  # group 3, bit 1
    assert collector.Upload(ldp_pb2.UploadRequest(reports=[good])).results[0].status == (
        ldp_pb2.ACCEPTED
    )


@pytest.mark.slow
def test_store_shards_and_beam_job_agree(tmp_path: Path, config: Path) -> None:
    pytest.importorskip("apache_beam", reason="needs the [beam] extra")
    from aggregator.jobs import inputs, pipeline
    from aggregator.jobs.results import Analysis

    surveys = load_surveys(config)
    mech = surveys["coin"].question("pc").mechanism
    rng = np.random.default_rng(2)
    reports = mech.simulate(rng.integers(0, 12, size=500), rng)
    messages = [wire(mech.encode(r)) for r in reports]
    db = tmp_path / "store.sqlite"
    with ReportStore(db) as store:
        register(store, surveys)
        store.put(ingest.validate_batch(messages[:7], surveys))  # bulk and one-by-one paths
        for message in messages[7:]:
            store.put([ingest.validate(message, surveys)])
        n, sums = store.statistics("coin", "pc")
        shards.export_survey(store, surveys["coin"], tmp_path / "shards", 3)
    assert n == 500 and sums.tolist() == mech.aggregate(reports).astype(int).tolist()
    found = inputs.resolve([str(tmp_path / "shards")], surveys)
    analysis = Analysis(seed=1, gof={("coin", "pc"): tuple(P0)})
    spec = pipeline.JobSpec(surveys, found.shards, str(tmp_path / "out.json"), analysis, 0)
    result = pipeline.run(spec, ["--runner=DirectRunner"])["results"][0]
    assert result["n"] == 500 and result["sums"] == sums.tolist()
    assert "goodness_of_fit" in result["estimate"]["error"]
    library = goodness_of_fit(Histogram(mech, n, sums), np.array(P0), rng=1)
    assert result["tests"]["gof"]["pvalue"] == library.pvalue


def test_per_category_analyses_are_refused() -> None:
    mech = PublicCoinBit(6, 1.0, public_seed=1, groups=3)
    hist = Histogram.from_reports(mech, mech.simulate(np.arange(600) % 6, np.random.default_rng(0)))
    for analysis in (lambda: estimate(hist), lambda: independence(hist, (2, 3))):
        with pytest.raises(InvalidInputError, match="goodness_of_fit"):
            analysis()
    with pytest.raises(InvalidInputError, match="goodness of fit"):
        power(mech, np.full(6, 1 / 6), 100, shape=(2, 3))
    with pytest.raises(InvalidInputError, match="sum to n"):
        Histogram(mech, 10, [3, 3, 3, 0, 0, 0])


def _rejections(mech: PublicCoinBit, n: int, p0: np.ndarray, trials: int, **options) -> int:
    """Rejections at alpha = 0.05 over ``trials`` studies of n reports drawn from p0 through the
    mechanism's own report-level simulate path."""
    rng = np.random.default_rng(17)
    rejected = 0
    for _ in range(trials):
        values = rng.choice(mech.k, size=n, p=p0)
        hist = Histogram.from_reports(mech, mech.simulate(values, rng))
        rejected += goodness_of_fit(hist, p0, rng=rng, **options).reject
    return rejected


def _band(trials: int, alpha: float = 0.05) -> tuple[float, float]:
    return stats.binom.ppf(0.005, trials, alpha), stats.binom.ppf(0.995, trials, alpha)


@pytest.mark.slow
@pytest.mark.parametrize(
    "n, calibration",
    [(3_000, "auto"), (40, "auto"), (3_000, "monte-carlo")],  # chi-square(L), exact, exact
)
def test_t3_type_one_error_in_the_99_band_at_k_1024(n: int, calibration: str) -> None:
    k, trials = 1024, 600
    mech = PublicCoinBit(k, 1.0, public_seed=2026, groups=10)
    p0 = np.random.default_rng(5).dirichlet(np.full(k, 2.0))
    options = {"calibration": calibration, "n_draws": 199}
    low, high = _band(trials)
    rejected = _rejections(mech, n, p0, trials, **options)
    assert low <= rejected <= high, (rejected, low, high)
    chosen = goodness_of_fit(_one(mech, n), p0, **options).calibration
    assert chosen == ("asymptotic" if (n, calibration) == (3_000, "auto") else "monte-carlo")


def _one(mech: PublicCoinBit, n: int) -> Histogram:
    rng = np.random.default_rng(1)
    return Histogram.from_reports(mech, mech.simulate(rng.integers(0, mech.k, size=n), rng))


def test_t3_power_and_sample_size_follow_raptor_power() -> None:
    """At k = 64, eps = 1, L = 10 the planned n gives power near 0.8 in simulation (each study
    draws its own seed, as the plan averages over the public subsets)."""
    k, groups = 64, 10
    p0 = np.full(k, 1 / k)
    p1 = p0 * (1 + 0.8 * np.where(np.arange(k) < k // 2, 1, -1))
    n = sample_size(PublicCoinBit(k, 1.0, 0, groups), p1, null=p0)
    other = PublicCoinBit(k, 1.0, 99, groups)  # the planned power does not depend on the seed
    assert power(other, p1, n, null=p0) >= 0.8 > power(other, p1, n - 1, null=p0)
    rng = np.random.default_rng(8)
    trials, rejected = 300, 0
    for seed in range(trials):
        mech = PublicCoinBit(k, 1.0, seed, groups)
        sums, sizes = mech.simulate_groups(n, p1, rng)
        hist = Histogram(mech, n, np.concatenate([sizes, sums]))
        rejected += goodness_of_fit(hist, p0, calibration="asymptotic").reject
    low, high = stats.binom.ppf([0.005, 0.995], trials, 0.8)
    assert low <= rejected <= high, (rejected, n)


def test_digest_follows_the_documented_encoding(config: Path) -> None:
    """docs/config.md, "Definition digest": fields 8 are public_seed=… and groups=…"""
    import hashlib
    import struct

    fields = ["ldp-question-definition/1", "pc", "public_coin_bit"]
    fields += [struct.pack(">d", 1.0).hex(), "", "1", "pc", "12"]
    fields += [f"c{j}" for j in range(12)] + ["public_seed=12345", "groups=4"]
    encoded = b"".join(len(f.encode()).to_bytes(4, "big") + f.encode() for f in fields)
    question = load_surveys(config)["coin"].question("pc")
    assert question.digest == hashlib.sha256(encoded).digest()


def test_client_simulate_and_aggregator_cli(tmp_path: Path, config: Path) -> None:
    """ldp-client simulate uploads through a served store; ldp-aggregator test runs T3 on it and
    estimate refuses in one line."""
    import signal

    from aggregator_process import spawn_serve

    run = run_cli  # in this process (tests/cli_runner.py)

    db = tmp_path / "store.sqlite"
    process, port = spawn_serve(
        tmp_path / "port", "--config", str(config), "--db", str(db), "--insecure"
    )
    try:
        target = ["--server", f"127.0.0.1:{port}", "--insecure", "--survey", "coin"]
        sim = run("client.cli", "simulate", *target, "--devices", "200", "--seed", "1", "--json")
        assert sim.returncode == 0, sim.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)
    common = ["--config", str(config), "--db", str(db), "--survey", "coin", "--question", "pc"]
    p0 = ",".join(["0.0833333333333333"] * 11 + ["0.0833333333333337"])
    done = run("aggregator.cli", "test", *common, "gof", "--p0", p0, "--seed", "2", "--json")
    assert done.returncode == 0, done.stderr
    assert '"T3' in done.stdout and '"n": 200' in done.stdout
    rebuilt = run("aggregator.cli", "rebuild", "--config", str(config), "--db", str(db), "--json")
    assert rebuilt.returncode == 0 and '"matched": true' in rebuilt.stdout, rebuilt.stderr
    refused = run("aggregator.cli", "estimate", *common)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "goodness_of_fit" in refused.stderr


def test_the_survey_report_shows_t3_and_says_why_there_is_no_estimate(config: Path) -> None:
    from aggregator.report import build_report, render_html, render_markdown
    from aggregator.survey_file.analyses import Analysis

    survey = load_surveys(config)["coin"]
    mech = survey.question("pc").mechanism
    rng = np.random.default_rng(6)
    hist = Histogram.from_reports(mech, mech.simulate(rng.integers(0, 12, size=300), rng))
    declared = [Analysis("uniform occupations", "pc", "goodness_of_fit", p0=tuple(P0))]
    report = build_report(survey, {"pc": hist}, declared)
    section = report.questions[0]
    assert section.released and section.estimate is None and section.tests[0].result is not None
    assert "T3" in section.tests[0].result.method
    for text in (render_markdown(report), render_html(report)):
        assert "No estimate" in text and "goodness_of_fit" in text and "Not released" not in text


def test_plan_knows_public_coin_bit() -> None:
    from aggregator.planning.study import plan_study

    k = 1024
    p0 = np.full(k, 1 / k)
    p1 = p0 + 0.2 / k * np.where(np.arange(k) < k // 2, 1.0, -1.0)
    mech = PublicCoinBit(k, 1.0, 0, 5)
    plan = plan_study(
        k=k, epsilon=1.0, alternative=p1, null=p0, mechanisms=[mech], target_power=0.8
    )
    row = plan.rows[0]
    assert row.method == "t3" and row.n == sample_size(mech, p1, null=p0)
    assert row.n == 2_231_046  # the prediction in docs/validation.md (reports needed)
