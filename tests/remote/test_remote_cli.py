"""``ldp-aggregator ... --server`` and ``aggregator.remote``: a running server's Analyst service
gives what the report store gives. Every command runs twice on the same data, once on the store
file (--db) and once over gRPC (--server, a real server on loopback over the same SQLite store),
and must print the same bytes with the same exit status, errors included; except where the
server releases less (docs/threat-model.md, "What is released"): nothing below min_batch_size,
not even the count, and a pooled read sums the released groups only."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_cli
from conftest import ServerThread

import aggregator.remote
from aggregator.analysis.survey_data import open_survey
from aggregator.errors import InsufficientDataError
from aggregator.remote import ConnectionSettingsError, NotReleasedError, RemoteError
from aggregator.service.analyst.auth import AnalystAccess
from aggregator.service.server import pki
from aggregator.service.server.app import open_store
from aggregator.stats import estimate, goodness_of_fit
from aggregator.store import ingest
from aggregator.survey_file.config import load_surveys
from protos.ldp.v1 import ldp_pb2

CONFIG = """
[[survey]]
id = "s"
title = "remote & local"
min_batch_size = 20

[[survey.question]]
id = "mood"
categories = ["great", "fine", "low", "bad"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.question]]
id = "mood2"
categories = ["great", "fine", "low", "bad"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.question]]
id = "fc"
categories = ["a", "b", "c", "d", "e"]
mechanism = "flip_components"
epsilon = 1.0

[[survey.question]]
id = "sleep"
categories = ["<5", "5-6", "7-8", ">8"]
mechanism = "gaussian"
rho = 0.5

[[survey.question]]
id = "pair"
mechanism = "randomized_response"
epsilon = 2.0
attributes = [
    { name = "x", categories = ["x0", "x1"] },
    { name = "y", categories = ["y0", "y1", "y2"] },
]

[[survey.question]]
id = "rare"
categories = ["yes", "no"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.analysis]]
question = "mood"
test = "goodness_of_fit"
p0 = [0.25, 0.25, 0.25, 0.25]

[[survey.analysis]]
question = "pair"
test = "independence"

[[survey.analysis]]
question = "rare"
test = "goodness_of_fit"
p0 = [0.5, 0.5]

[[survey]]
id = "g"
min_batch_size = 20
group_label = "arm"
group_values = ["control", "treatment", "pilot"]

[[survey.question]]
id = "mood"
categories = ["great", "fine", "low", "bad"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.analysis]]
question = "mood"
test = "two_sample"
groups = ["control", "treatment"]

[[survey.analysis]]
question = "mood"
test = "two_sample"
groups = ["control", "pilot"]

[[survey]]
id = "split"
min_batch_size = 20
exploration_fraction = 0.5

[[survey.question]]
id = "mood"
categories = ["great", "fine", "low", "bad"]
mechanism = "randomized_response"
epsilon = 2.0

[[survey.question]]
id = "pair"
mechanism = "randomized_response"
epsilon = 2.0
attributes = [
    { name = "x", categories = ["x0", "x1"] },
    { name = "y", categories = ["y0", "y1"] },
]

[[survey]]
id = "held"
min_batch_size = 20
exploration_fraction = 0.5

[[survey.question]]
id = "mood"
categories = ["great", "fine", "low", "bad"]
mechanism = "randomized_response"
epsilon = 2.0

[[survey.question]]
id = "late"
categories = ["yes", "no"]
mechanism = "randomized_response"
epsilon = 2.0
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
MOOD = [0.4, 0.3, 0.2, 0.1]
EXPLORATION, CONFIRMATION = ldp_pb2.EXPLORATION, ldp_pb2.CONFIRMATION
#: ISO 8601 times (a report's "generated", a plan's registration, a seal): they differ between
#: two runs, and nothing else may.
TIMES = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)?")
#: The names matplotlib gives an SVG's clip paths and markers: random on every rendering.
CLIP_IDS = re.compile(r"\b[mp][0-9a-f]{10}\b")


def unstamped(text: str) -> str:
    """``text`` without what differs between two renderings of the same results."""
    return CLIP_IDS.sub("p", TIMES.sub("T", text))


def reports(surveys, survey_id, question_id, truth, n, seed, side=0, group=""):
    """n randomized reports of one question drawn from ``truth``."""
    rng = np.random.default_rng(seed)
    mech = surveys[survey_id].question(question_id).mechanism
    values = mech.simulate(rng.choice(len(truth), size=n, p=truth), rng)
    return [
        ldp_pb2.Report(
            report_id=os.urandom(16),
            survey_id=survey_id,
            question_id=question_id,
            payload=mech.encode(v),
            side=side,
            group=group,
        )
        for v in values
    ]


def population(surveys):
    """Every question released except s/rare (3 reports), g's pilot group (5 reports) and
    held/late (5 confirmation-side reports)."""
    uniform = {k: [1 / k] * k for k in (2, 4, 5)}
    out = reports(surveys, "s", "mood", MOOD, 400, 1)
    out += reports(surveys, "s", "mood2", uniform[4], 300, 2)
    out += reports(surveys, "s", "fc", uniform[5], 200, 3)
    out += reports(surveys, "s", "sleep", MOOD, 200, 4)
    out += reports(surveys, "s", "pair", [0.3, 0.1, 0.1, 0.1, 0.1, 0.3], 300, 5)
    out += reports(surveys, "s", "rare", uniform[2], 3, 6)
    for seed, (group, n) in enumerate((("control", 200), ("treatment", 150), ("pilot", 5))):
        out += reports(surveys, "g", "mood", MOOD, n, 10 + seed, group=group)
    for seed, side in enumerate((EXPLORATION, CONFIRMATION)):
        out += reports(surveys, "split", "mood", MOOD, 300, 20 + seed, side)
        out += reports(surveys, "split", "pair", [0.4, 0.1, 0.1, 0.4], 300, 22 + seed, side)
        out += reports(surveys, "held", "mood", MOOD, 300, 24 + seed, side)
    out += reports(surveys, "held", "late", [0.5, 0.5], 5, 30, CONFIRMATION)
    return out


def fill(db: Path, surveys) -> None:
    """Store the reports as a server would: validated, committed."""
    store = open_store(surveys, str(db))
    try:
        store.submit_batches(ingest.validate_upload(population(surveys), surveys).batches).result()
    finally:
        store.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A filled store and a server on it: (config, the store, the server, its analyst address)."""
    root = tmp_path_factory.mktemp("remote")
    config = root / "surveys.toml"
    config.write_text(CONFIG)
    db = root / "reports.sqlite"
    fill(db, load_surveys(config))
    pristine = root / "pristine.sqlite"
    shutil.copyfile(db, pristine)  # for the commands that write: a copy without a server
    server = ServerThread(config, db).start()
    yield config, db, server, server.analyst_target
    server.stop()


def both(world, *command: str, remote_config: bool = False):
    """The command on the store and over the server: two CompletedProcess."""
    config, db, _, address = world
    local = run_cli("agg", *command, "--config", config, "--db", db)
    extra = ("--config", config) if remote_config else ()
    remote = run_cli("agg", *command, "--server", address, *extra)
    return local, remote


def assert_same(local, remote) -> None:
    assert (remote.returncode, remote.stdout, remote.stderr) == (
        local.returncode,
        local.stdout,
        local.stderr,
    )


def one_line(done) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and "Traceback" not in done.stderr, done
    return lines[0]


READS = [
    ("k-sample", "--survey", "g", "--question", "mood", "--groups", "control", "treatment"),
    ("conditional", "--survey", "s", "--question", "pair", "--json"),
    ("estimate", "--survey", "s", "--question", "mood"),
    ("estimate", "--survey", "s", "--question", "mood", "--simultaneous", "--json"),
    ("estimate", "--survey", "s", "--question", "fc", "--confidence", "0.9"),
    ("estimate", "--survey", "s", "--question", "sleep", "--json"),
    ("estimate", "--survey", "s", "--question", "pair"),
    ("estimate", "--survey", "g", "--question", "mood", "--group", "treatment", "--json"),
    ("estimate", "--survey", "split", "--question", "mood"),
    ("test", "gof", "--survey", "s", "--question", "mood", "--p0", "uniform"),
    ("test", "gof", "--survey", "s", "--question", "fc", "--p0", "uniform", "--json"),
    ("test", "gof", "--survey", "s", "--question", "sleep", "--p0", "0.4,0.3,0.2,0.1"),
    (
        "test",
        "gof",
        "--survey",
        "s",
        "--question",
        "mood2",
        "--p0",
        "uniform",
        "--calibration",
        "monte-carlo",
        "--seed",
        "7",
        "--json",
    ),
    ("test", "independence", "--survey", "s", "--question", "pair", "--seed", "3"),
    ("test", "independence", "--survey", "split", "--question", "pair", "--json"),
    ("two-sample", "--a", "s:mood", "--b", "s:mood2", "--seed", "4"),
    (
        "two-sample",
        "--survey",
        "g",
        "--question",
        "mood",
        "--groups",
        "control",
        "treatment",
        "--json",
        "--seed",
        "5",
    ),
]
REFUSALS = [  # (command, exit status, a fragment of the one line)
    (("estimate", "--survey", "s", "--question", "nope"), 2, "has no question 'nope'"),
    (("estimate", "--survey", "nope", "--question", "mood"), 2, "unknown survey 'nope'"),
    (
        ("test", "gof", "--survey", "s", "--question", "nope", "--p0", "uniform", "--json"),
        2,
        "has no question",
    ),
    (
        ("estimate", "--survey", "split", "--question", "mood", "--side", "confirmation"),
        2,
        "cannot be read before its results are sealed",
    ),
    (
        ("estimate", "--survey", "s", "--question", "mood", "--side", "confirmation"),
        2,
        "is not split",
    ),
    (
        ("estimate", "--survey", "g", "--question", "mood", "--group", "nobody"),
        2,
        "unknown arm 'nobody'",
    ),
    (
        ("test", "independence", "--survey", "s", "--question", "mood"),
        2,
        "does not have exactly 2 attributes",
    ),
]
BELOW = [  # below min_batch_size: (command, what the store says, what the server says)
    (("estimate", "--survey", "s", "--question", "rare"), "has 3 reports", "fewer than 20"),
    (
        ("test", "gof", "--survey", "s", "--question", "rare", "--p0", "uniform", "--json"),
        "has 3 reports",
        "fewer than 20",
    ),
    (
        ("estimate", "--survey", "g", "--question", "mood", "--group", "pilot"),
        "has 5 reports of arm 'pilot'",
        "of arm 'pilot' has fewer than 20",
    ),
    (
        ("two-sample", "--survey", "g", "--question", "mood", "--groups", "control", "pilot"),
        "has 5 reports",
        "fewer than 20",
    ),
    (("k-sample", "--survey", "g", "--question", "mood"), "has 5 reports", "fewer than 20"),
]


@pytest.mark.parametrize("command", READS, ids=lambda c: " ".join(c))
def test_reads_print_the_same_over_the_server(world, command):
    local, remote = both(world, *command)
    assert local.returncode == 0, local.stderr
    assert_same(local, remote)


@pytest.mark.parametrize("command, status, fragment", REFUSALS, ids=lambda c: str(c))
def test_refusals_are_the_same_one_line_over_the_server(world, command, status, fragment):
    local, remote = both(world, *command)
    assert local.returncode == status and fragment in one_line(local), local
    assert_same(local, remote)


@pytest.mark.parametrize("command, stored, served", BELOW, ids=lambda c: str(c))
def test_below_the_threshold_both_exit_3_and_the_server_keeps_the_count(
    world, command, stored, served
):
    local, remote = both(world, *command)
    assert local.returncode == remote.returncode == 3
    assert stored in one_line(local), local
    line = one_line(remote)
    assert served in line and "results are released from 20" in line
    assert not any(f" {n} report" in line for n in (3, 5)), line


def test_a_pooled_read_sums_the_released_groups_and_says_which(world):
    """The store pools every group (pilot's 5 reports too); the server sums the groups it
    releases, and the output names them."""
    local, remote = both(world, "estimate", "--survey", "g", "--question", "mood")
    assert "pooled (control, treatment, pilot)" in local.stdout and "n = 355" in local.stdout
    assert "pooled (control, treatment);" in remote.stdout and "n = 350" in remote.stdout
    control, treatment = (
        both(world, "estimate", "--survey", "g", "--question", "mood", "--group", g)[1]
        for g in ("control", "treatment")
    )
    assert control.returncode == treatment.returncode == 0


def test_a_survey_file_given_with_server_is_checked_against_the_servers(world, tmp_path):
    address = world[3]
    local, remote = both(
        world, "estimate", "--survey", "s", "--question", "mood", remote_config=True
    )
    assert_same(local, remote)
    changed = tmp_path / "changed.toml"
    changed.write_text(CONFIG.replace('title = "remote & local"', 'title = "renamed"'))
    done = run_cli(
        "agg",
        "estimate",
        "--config",
        changed,
        "--server",
        address,
        "--survey",
        "s",
        "--question",
        "mood",
    )
    assert "differently from the server" in one_line(done) and done.returncode == 2


@pytest.mark.parametrize("fmt", ["html", "md"])
def test_report_is_the_same_over_the_server(world, tmp_path, fmt):
    """A split survey's report (exploration side, every question released): the same file but
    for the time it was generated."""
    config, db, _, address = world
    out_db, out_server = tmp_path / f"db.{fmt}", tmp_path / f"server.{fmt}"
    common = ("report", "--survey", "split", "--format", fmt, "--config", config)
    local = run_cli("agg", *common, "--db", db, "--out", out_db)
    remote = run_cli("agg", *common, "--server", address, "--out", out_server)
    assert local.returncode == remote.returncode == 0, (local.stderr, remote.stderr)
    assert remote.stdout == local.stdout.replace(str(out_db), str(out_server))
    assert unstamped(out_server.read_text()) == unstamped(out_db.read_text())


def test_a_report_over_the_server_gives_the_servers_reason_for_what_it_withholds(world, tmp_path):
    """s/rare (3 reports) and g's pilot group (5): the store's report counts them, the server's
    says it releases nothing below 20 and never shows their counts; the released questions
    read the same."""
    config, db, _, address = world
    for survey, held in (("s", "s/rare has fewer than 20"), ("g", "of arm 'pilot' has fewer")):
        out_db, out_server = tmp_path / f"{survey}-db.md", tmp_path / f"{survey}-server.md"
        common = ("report", "--survey", survey, "--format", "md", "--config", config)
        run_cli("agg", *common, "--db", db, "--out", out_db, check=True)
        run_cli("agg", *common, "--server", address, "--out", out_server, check=True)
        text = out_server.read_text()
        assert held in text and "5 reports" not in text and "3 reports" not in text
        if survey == "s":  # every other question reads the same
            cut = [unstamped(out.read_text()).split("\n## rare")[0] for out in (out_db, out_server)]
            assert cut[0] == cut[1]


def test_report_without_a_survey_file_has_no_declared_tests(world, tmp_path):
    _, _, _, address = world
    out = tmp_path / "r.md"
    done = run_cli(
        "agg", "report", "--survey", "s", "--format", "md", "--server", address, "--out", out
    )
    assert done.returncode == 0, done.stderr
    assert "Is mood" not in out.read_text() and "mood" in out.read_text()


def test_preregister_confirm_and_holdout_print_the_same_over_the_server(world, tmp_path):
    """The writing commands on a copy of the store (no server) and through the server: the
    same lines but for the registration and sealing times."""
    config, db, _, address = world
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(db.parent / "pristine.sqlite", copy)
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)

    def twice(*command: str):
        local = run_cli("agg", *command, "--config", config, "--db", copy)
        remote = run_cli("agg", *command, "--server", address)
        assert TIMES.sub("T", remote.stdout) == TIMES.sub("T", local.stdout)
        assert (remote.returncode, remote.stderr) == (local.returncode, local.stderr)
        return local

    assert twice("confirm", "--survey", "split").returncode == 2  # no plan yet
    first = twice("preregister", "--survey", "split", "--plan", str(plan))
    assert "registered at" in first.stdout and first.returncode == 0
    assert (
        "already registered"
        in twice("preregister", "--survey", "split", "--plan", str(plan)).stdout
    )
    assert "sealed now" in twice("confirm", "--survey", "split").stdout
    assert twice("confirm", "--survey", "split", "--json").returncode == 0  # already sealed
    sealed = twice("estimate", "--survey", "split", "--question", "mood", "--side", "confirmation")
    assert sealed.returncode == 0
    texts = []
    for source in (("--config", config, "--db", copy), ("--server", address)):
        out = tmp_path / f"sealed-{len(texts)}.md"
        common = ("report", "--survey", "split", "--side", "confirmation", "--format", "md")
        run_cli("agg", *common, *source, "--out", out, check=True)
        texts.append(unstamped(out.read_text()))
    assert texts[0] == texts[1] and "mood is not uniform" in texts[0]
    for p0 in ("uniform", "0.4,0.3,0.2,0.1"):
        answer = twice("holdout", "gof", "--survey", "held", "--question", "mood", "--p0", p0)
        assert "holdout query" in answer.stdout and answer.returncode == 0
    twice("holdout", "independence", "--survey", "held", "--question", "mood")  # refused alike
    late = twice("holdout", "gof", "--survey", "held", "--question", "late", "--p0", "uniform")
    assert late.returncode == 3 and "no query used: held/late has 5" in one_line(late)


def test_options_the_server_does_not_take_are_refused_in_one_line(world, tmp_path):
    _, _, _, address = world
    for command in (
        ("confirm", "--survey", "split", "--seed", "3"),
        (
            "holdout",
            "gof",
            "--survey",
            "held",
            "--question",
            "mood",
            "--p0",
            "uniform",
            "--alpha",
            "0.1",
        ),
    ):
        done = run_cli("agg", *command, "--server", address)
        assert "with --db" in one_line(done) and done.returncode == 2


@pytest.mark.parametrize(
    "options, fragment",
    [
        ((), "give --db FILE (a report store) or --server HOST:PORT"),
        (("--db", "x.sqlite", "--server", "127.0.0.1:1"), "not both"),
        (("--db", "x.sqlite"), "--db needs --config"),
        (("--server", "10.1.2.3:50051"), "plaintext is allowed to a loopback address only"),
        (("--server", "analyst.example:443"), "plaintext is allowed to a loopback address only"),
        (("--server", "no-port"), "expected HOST:PORT"),
        (("--server", "127.0.0.1:1", "--tls-cert", "c.pem"), "--tls-cert and --tls-key go"),
        (("--server", "127.0.0.1:1", "--token-file", "missing.txt"), "cannot read token file"),
        (("--server", "127.0.0.1:1", "--tls-ca", "missing.pem"), "cannot read CA certificate"),
        (("--config", "c.toml", "--db", "x.sqlite", "--token-file", "t"), "go with --server"),
        (("--server", "127.0.0.1:1"), "cannot reach the server at 127.0.0.1:1"),
    ],
)
def test_connection_mistakes_are_one_line(options, fragment, tmp_path):
    done = run_cli("agg", "estimate", "--survey", "s", "--question", "mood", *options, cwd=tmp_path)
    assert fragment in one_line(done) and done.returncode == 2


def test_an_unreachable_server_is_one_line(tmp_path):
    out = tmp_path / "r.html"
    done = run_cli("agg", "report", "--survey", "s", "--server", "localhost:1", "--out", out)
    assert "cannot reach the server" in one_line(done) and done.returncode == 2
    assert not out.exists()
    done = run_cli(
        "agg", "estimate", "--survey", "s", "--question", "q", "--server", "[::1]:1", "--json"
    )
    error = json.loads(one_line(done))
    assert error["status"] == 2 and "cannot reach the server at [::1]:1" in error["error"]


def test_the_python_api_gives_the_local_results(world):
    """aggregator.remote.connect: the same histograms, estimates and tests as open_survey on
    the store; withheld questions carry their count; refusals are typed."""
    config, db, _, address = world
    local = open_survey(config, db, "s")
    with aggregator.remote.connect(address) as analyst:
        remote = analyst.open_survey("s")
        assert list(remote) == list(local)
        for question_id, item in local.items():
            assert remote[question_id].released == item.released
            if item.released:
                np.testing.assert_array_equal(
                    remote[question_id].histogram.values, item.histogram.values
                )
        est = analyst.estimate("s", "mood")
        np.testing.assert_array_equal(
            est.frequencies, estimate(local["mood"].histogram).frequencies
        )
        assert est.to_dict() == estimate(local["mood"].histogram).to_dict()
        test = analyst.goodness_of_fit("s", "mood", [0.25] * 4, calibration="asymptotic")
        expected = goodness_of_fit(
            local["mood"].histogram, np.full(4, 0.25), calibration="asymptotic"
        )
        assert test.to_dict() == expected.to_dict()
        assert analyst.independence("s", "pair", rng=1).to_dict()["method"]
        with pytest.raises(NotReleasedError) as below:
            analyst.histogram("s", "rare")
        assert below.value.min_batch_size == 20 and "3" not in str(below.value)
        with pytest.raises(InsufficientDataError, match="fewer than 20"):
            remote["rare"].histogram  # noqa: B018 (the property raises)
        for unknown_question in (
            lambda: analyst.survey("nope"),
            lambda: analyst.histogram("s", "x"),
        ):
            with pytest.raises(RemoteError) as unknown:
                unknown_question()
            assert unknown.value.code.name == "NOT_FOUND"
        assert not analyst.open_survey("g", group="pilot")["mood"].released
        pooled = analyst.released("g", "mood")
        assert pooled.groups == ("control", "treatment") and pooled.histogram.n == 350
    with pytest.raises(ConnectionSettingsError, match="loopback"):
        aggregator.remote.connect("192.0.2.1:50051")


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """A device CA (server, device-0001) and an analyst CA (analyst-0001), as gen_pki writes
    them."""
    root = tmp_path_factory.mktemp("remote-pki")
    pki.write_pki(root, devices=1, days=1, analysts=1)
    return root


def test_analyst_credentials_over_tls_read_the_same(world, certs, tmp_path):
    """An analyst listener requiring an analyst certificate and a token: --tls-ca, --tls-cert,
    --tls-key and --token-file read what the store gives; a device certificate, a missing
    token or a wrong CA is refused in one line."""
    config, db, _, _ = world
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(db.parent / "pristine.sqlite", copy)
    tokens = tmp_path / "analysts.tokens"
    token = run_cli("agg", "analyst-token", "add", "alice", "--tokens", tokens, check=True)
    token_file = tmp_path / "alice.token"
    token_file.write_text(token.stdout)
    access = AnalystAccess(
        tls_cert=certs / "server.pem",
        tls_key=certs / "server.key",
        client_ca=certs / "analyst-ca.pem",
        device_ca=certs / "ca.pem",
        tokens=tokens,
    )
    server = ServerThread(config, copy, analyst_access=access).start()
    try:
        address = server.analyst_target.replace("127.0.0.1", "localhost")
        command = ("estimate", "--survey", "s", "--question", "mood", "--json")
        local = run_cli("agg", *command, "--config", config, "--db", copy)
        tls = ("--server", address, "--tls-ca", certs / "ca.pem")
        analyst, device = (
            ("--tls-cert", certs / f"{name}.pem", "--tls-key", certs / f"{name}.key")
            for name in ("analyst-0001", "device-0001")
        )
        assert_same(local, run_cli("agg", *command, *tls, *analyst, "--token-file", token_file))
        for refused, fragment in (
            ((*tls, *analyst), "UNAUTHENTICATED"),
            ((*tls, *device, "--token-file", token_file), "PERMISSION_DENIED"),
            ((*tls, "--token-file", token_file), "cannot reach"),  # no certificate: handshake
            ((*tls[:3], certs / "analyst-ca.pem", *analyst), "CERTIFICATE_VERIFY_FAILED"),
        ):
            error = json.loads(one_line(run_cli("agg", *command, *refused)))
            assert error["status"] == 2 and fragment in error["error"], error
    finally:
        server.stop()
