"""Two-sample tests as an analyst runs them: the ``TwoSample`` Analyst RPC over real gRPC on
loopback with reports uploaded through the Collector, and ``ldp-aggregator two-sample`` as a real
process on the same SQLite store. Results equal the library's on the same histograms; questions
whose definitions differ are refused, saying what differs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import grpc
import numpy as np
import pytest
from cli_runner import run_cli
from conftest import ServerThread

from aggregator.histogram import Histogram
from aggregator.stats import two_sample
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

SURVEYS = """
[[survey]]
id = "trial"
title = "two arms"
min_batch_size = 5

[[survey.question]]
id = "arm_a"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.question]]
id = "arm_b"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.question]]
id = "other_eps"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 2.0

[[survey.question]]
id = "other_labels"
categories = ["a", "b", "c", "e"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.question]]
id = "fc_a"
categories = ["a", "b", "c", "d", "e"]
mechanism = "flip_components"
epsilon = 1.0

[[survey.question]]
id = "few"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.question]]
id = "hr_a"
categories = ["a", "b", "c", "d", "e", "f"]
mechanism = "hadamard_response"
epsilon = 1.0

[[survey.question]]
id = "hr_b"
categories = ["a", "b", "c", "d", "e", "f"]
mechanism = "hadamard_response"
epsilon = 1.0

[[survey.question]]
id = "oue_a"
categories = ["a", "b", "c", "d", "e", "f"]
mechanism = "optimized_unary"
epsilon = 1.0

[[survey.question]]
id = "oue_b"
categories = ["a", "b", "c", "d", "e", "f"]
mechanism = "optimized_unary"
epsilon = 1.0

[[survey.question]]
id = "ss_a"
categories = ["a", "b", "c", "d", "e", "f"]
mechanism = "subset_selection"
epsilon = 1.0

[[survey.question]]
id = "ss_b"
categories = ["a", "b", "c", "d", "e", "f"]
mechanism = "subset_selection"
epsilon = 1.0

[[survey.question]]
id = "olh_a"
categories = ["a", "b", "c", "d", "e", "f"]
mechanism = "local_hashing"
epsilon = 1.0

[[survey.question]]
id = "olh_b"
categories = ["a", "b", "c", "d", "e", "f"]
mechanism = "local_hashing"
epsilon = 1.0

[[survey.question]]
id = "pc_a"
categories = ["a", "b", "c", "d", "e", "f", "g", "h"]
mechanism = "public_coin_bit"
epsilon = 1.0
public_seed = 2026
groups = 4

[[survey.question]]
id = "pc_b"
categories = ["a", "b", "c", "d", "e", "f", "g", "h"]
mechanism = "public_coin_bit"
epsilon = 1.0
public_seed = 2026
groups = 4

[[survey.question]]
id = "pc_seed"
categories = ["a", "b", "c", "d", "e", "f", "g", "h"]
mechanism = "public_coin_bit"
epsilon = 1.0
public_seed = 2027
groups = 4

[[survey]]
id = "wave2"
title = "second wave"
min_batch_size = 5

[[survey.question]]
id = "fc_b"
categories = ["a", "b", "c", "d", "e"]
mechanism = "flip_components"
epsilon = 1.0
"""

ANSWERS = {  # (survey, question) -> (answer distribution, number of devices)
    ("trial", "arm_a"): ([0.25, 0.25, 0.25, 0.25], 1500),
    ("trial", "arm_b"): ([0.40, 0.20, 0.20, 0.20], 1200),
    ("trial", "other_eps"): ([0.25, 0.25, 0.25, 0.25], 50),
    ("trial", "other_labels"): ([0.25, 0.25, 0.25, 0.25], 50),
    ("trial", "fc_a"): ([0.2, 0.2, 0.2, 0.2, 0.2], 600),
    ("trial", "few"): ([0.25, 0.25, 0.25, 0.25], 3),
    ("wave2", "fc_b"): ([0.2, 0.2, 0.2, 0.2, 0.2], 500),
    **{
        ("trial", f"{name}_{side}"): (p, 600)
        for name in ("hr", "oue", "ss", "olh")
        for side, p in (("a", [1 / 6] * 6), ("b", [0.75, 0.15, 0.025, 0.025, 0.025, 0.025]))
    },
    ("trial", "pc_a"): ([1 / 8] * 8, 800),
    ("trial", "pc_b"): ([0.5, 0.3, 0.04, 0.04, 0.03, 0.03, 0.03, 0.03], 700),
    ("trial", "pc_seed"): ([1 / 8] * 8, 50),
}


@pytest.fixture(scope="module")
def populated(tmp_path_factory):
    """A server with every question's reports uploaded; yields (server, analyst, local
    histograms of exactly what was uploaded)."""
    root = tmp_path_factory.mktemp("two_sample")
    config = root / "surveys.toml"
    config.write_text(SURVEYS)
    server = ServerThread(config, root / "store.sqlite").start()
    channel = grpc.insecure_channel(server.target)
    collector = ldp_pb2_grpc.CollectorStub(channel)
    rng = np.random.default_rng(17)
    local = {}
    for (survey, question_id), (p, n) in ANSWERS.items():
        mech = server.surveys[survey].question(question_id).mechanism
        reports = mech.simulate(rng.choice(mech.k, size=n, p=p), rng)
        messages = [
            ldp_pb2.Report(
                report_id=os.urandom(16),
                survey_id=survey,
                question_id=question_id,
                payload=mech.encode(r),
            )
            for r in reports
        ]
        for start in range(0, n, 1000):
            collector.Upload(ldp_pb2.UploadRequest(reports=messages[start : start + 1000]))
        local[(survey, question_id)] = Histogram.from_reports(mech, reports)
    analyst = grpc.insecure_channel(server.analyst_target)
    yield server, ldp_pb2_grpc.AnalystStub(analyst), local, config
    analyst.close()
    channel.close()
    server.stop()


def request(a: str, b: str, **options) -> ldp_pb2.TwoSampleRequest:
    (survey_a, question_a), (survey_b, question_b) = a.split(":"), b.split(":")
    return ldp_pb2.TwoSampleRequest(
        survey_a=survey_a,
        question_a=question_a,
        survey_b=survey_b,
        question_b=question_b,
        **options,
    )


def test_rpc_detects_a_difference_and_matches_the_library(populated):
    _, analyst, local, _ = populated
    remote = analyst.TwoSample(request("trial:arm_a", "trial:arm_b"))
    library = two_sample(local[("trial", "arm_a")], local[("trial", "arm_b")])
    assert remote.reject and remote.pvalue == pytest.approx(library.pvalue, rel=1e-12)
    assert remote.statistic == pytest.approx(library.statistic, rel=1e-12)
    assert remote.n == 2700 and remote.dof == 3 and remote.calibration == "asymptotic"


def test_rpc_across_surveys_with_a_seeded_monte_carlo_null(populated):
    _, analyst, local, _ = populated
    remote = analyst.TwoSample(
        request("trial:fc_a", "wave2:fc_b", calibration="monte-carlo", seed=4, alpha=0.01)
    )
    library = two_sample(
        local[("trial", "fc_a")],
        local[("wave2", "fc_b")],
        0.01,
        calibration="monte-carlo",
        rng=4,
    )
    assert remote.pvalue == library.pvalue and remote.n_draws == 999
    assert not remote.HasField("dof") and remote.alpha == 0.01


@pytest.mark.parametrize("name", ["hr", "oue", "ss", "olh"])
def test_rpc_support_count_mechanisms_match_the_library(populated, name):
    """Issue 17: the new mechanisms go through the same RPC (bootstrap at the pooled estimate)."""
    _, analyst, local, _ = populated
    remote = analyst.TwoSample(request(f"trial:{name}_a", f"trial:{name}_b", seed=4))
    library = two_sample(local[("trial", f"{name}_a")], local[("trial", f"{name}_b")], rng=4)
    assert remote.pvalue == library.pvalue and remote.calibration == "monte-carlo"
    assert remote.statistic == pytest.approx(library.statistic, rel=1e-12)
    assert remote.reject and remote.n == 1200 and not remote.HasField("dof")


@pytest.mark.parametrize("calibration", ["auto", "monte-carlo"])
def test_rpc_public_coin_reports_match_the_library(populated, calibration):
    """Public-coin one-bit reports: the per-group homogeneity chi-square through the same RPC."""
    _, analyst, local, _ = populated
    remote = analyst.TwoSample(request("trial:pc_a", "trial:pc_b", calibration=calibration, seed=4))
    library = two_sample(
        local[("trial", "pc_a")], local[("trial", "pc_b")], calibration=calibration, rng=4
    )
    assert remote.pvalue == library.pvalue and remote.reject
    assert remote.statistic == pytest.approx(library.statistic, rel=1e-12)
    assert remote.method == library.method and remote.n == 1500
    assert list(remote.observed) == list(library.observed)
    if calibration == "auto":
        assert remote.calibration == "asymptotic" and remote.dof == 4
    else:
        assert remote.n_draws == 999 and not remote.HasField("dof")


@pytest.mark.parametrize(
    ("a", "b", "code", "fragment"),
    [
        ("trial:arm_a", "trial:other_eps", "FAILED_PRECONDITION", "differ in epsilon (1.0 vs 2.0)"),
        ("trial:arm_a", "trial:other_labels", "FAILED_PRECONDITION", "differ in categories"),
        ("trial:arm_a", "trial:fc_a", "FAILED_PRECONDITION", "differ in mechanism"),
        ("trial:hr_a", "trial:oue_a", "FAILED_PRECONDITION", "differ in mechanism"),
        ("trial:pc_a", "trial:pc_seed", "FAILED_PRECONDITION", "differ in public_seed"),
        ("trial:arm_a", "trial:few", "FAILED_PRECONDITION", "released from 5"),
        ("trial:arm_a", "trial:nope", "NOT_FOUND", "nope"),
        ("trial:arm_a", "trial:arm_a", "INVALID_ARGUMENT", "name the same question"),
    ],
)
def test_rpc_refusals(populated, a, b, code, fragment):
    _, analyst, _, _ = populated
    with pytest.raises(grpc.RpcError) as refused:
        analyst.TwoSample(request(a, b))
    assert refused.value.code() == getattr(grpc.StatusCode, code)
    assert fragment in refused.value.details()


def test_rpc_bad_calibration_is_invalid_argument(populated):
    _, analyst, _, _ = populated
    with pytest.raises(grpc.RpcError) as refused:
        analyst.TwoSample(request("trial:arm_a", "trial:arm_b", calibration="exact"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def cli(config: Path, db: Path, *args: str) -> subprocess.CompletedProcess:
    """``ldp-aggregator two-sample`` in this process (tests/cli_runner.py)."""
    return run_cli("agg", "two-sample", "--config", str(config), "--db", str(db), *args)


def test_cli_json_and_text(populated):
    server, _, local, config = populated
    done = cli(config, server.db, "--a", "trial:arm_a", "--b", "trial:arm_b", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    library = two_sample(local[("trial", "arm_a")], local[("trial", "arm_b")])
    assert result["reject"] and result["pvalue"] == pytest.approx(library.pvalue, rel=1e-12)
    assert (result["a"], result["b"], result["n"]) == ("trial:arm_a", "trial:arm_b", 2700)
    text = cli(
        config,
        server.db,
        "--a",
        "trial:fc_a",
        "--b",
        "wave2:fc_b",
        "--calibration",
        "monte-carlo",
        "--seed",
        "4",
    )
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("A = trial:fc_a (n = 600), B = wave2:fc_b (n = 500)")
    assert "parametric bootstrap" in text.stdout
    hr = cli(config, server.db, "--a", "trial:hr_a", "--b", "trial:hr_b", "--seed", "4", "--json")
    assert hr.returncode == 0, hr.stderr
    library = two_sample(local[("trial", "hr_a")], local[("trial", "hr_b")], rng=4)
    assert json.loads(hr.stdout)["pvalue"] == library.pvalue
    coin = cli(config, server.db, "--a", "trial:pc_a", "--b", "trial:pc_b")
    assert coin.returncode == 0, coin.stderr
    library = two_sample(local[("trial", "pc_a")], local[("trial", "pc_b")])
    assert "grouped homogeneity chi-square on public-coin bits" in coin.stdout
    assert f"statistic = {library.statistic:.4f}, dof = 4" in coin.stdout


@pytest.mark.parametrize(
    ("args", "status", "fragment"),
    [
        (["--a", "trial:arm_a", "--b", "trial:other_eps"], 2, "differ in epsilon"),
        (["--a", "trial:pc_a", "--b", "trial:pc_seed"], 2, "differ in public_seed"),
        (["--a", "trial:arm_a", "--b", "trial"], 2, "expected SURVEY:QUESTION"),
        (["--a", "trial:arm_a", "--b", "trial:arm_a"], 2, "compares two groups"),
        (["--a", "trial:arm_a", "--b", "trial:arm_b", "--side", "exploration"], 2, "not split"),
        (["--a", "trial:arm_a", "--b", "trial:few"], 3, "released from 5"),
        (["--a", "trial:arm_a", "--b", "trial:arm_b", "--alpha", "2"], 2, "alpha"),
    ],
)
def test_cli_user_errors_are_one_line(populated, args, status, fragment):
    server, _, _, config = populated
    done = cli(config, server.db, *args)
    assert done.returncode == status, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in done.stderr
