"""Raking declared in the survey file (issue 29): ``design = { table, margins }`` with the frame's
columns naming each key's raking categories. ``estimate --design`` (on --db and over a real gRPC
server at a release point) equals ``raked_estimate`` on the design cells of the same decoded
reports, and says it is raked; bad margins are one-line ConfigErrors."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import numpy as np
import pytest
from cli_runner import run_cli
from conftest import ServerThread
from service.collector.test_design_service import FRAME

from aggregator.presentation.numbers import share
from aggregator.stats.design.cells import Design, contributions, design_cells
from aggregator.stats.design.estimate import design_estimate
from aggregator.stats.design.raking import joint_domains, raked_estimate
from aggregator.survey_file.config import ConfigError, load_surveys
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

AGES = ("young", "mid", "old")
REGIONS = ("n", "s")
#: key -> (age, region): every category of each margin has keys.
CATEGORIES = {key: (AGES[i % 3], REGIONS[(i // 3) % 2]) for i, key in enumerate(sorted(FRAME))}
MARGINS = (
    "margins = { age = { young = 5000, mid = 3000, old = 2000 }, region = { n = 6500, s = 3500 } }"
)
SURVEY = """
[[survey]]
id = "raked"
min_batch_size = 50
design = { table = "frame.csv", MARGINS }

[[survey.question]]
id = "rr"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 2.0
"""


def write(root: Path, margins: str = MARGINS, frame: str | None = None) -> Path:
    lines = ["key,stratum,psu,weight,age,region"] + [
        f"{k},{s},{p},{w},{','.join(CATEGORIES[k])}" for k, (s, p, w) in FRAME.items()
    ]
    (root / "frame.csv").write_text(frame if frame is not None else "\n".join(lines) + "\n")
    (root / "surveys.toml").write_text(SURVEY.replace("MARGINS", margins))
    return root / "surveys.toml"


@pytest.fixture(scope="module")
def raked(tmp_path_factory):
    """A server whose 'raked' survey holds 900 reports whose answers follow age and region."""
    root = tmp_path_factory.mktemp("raking")
    server = ServerThread(write(root), root / "store.sqlite").start()
    question = server.surveys["raked"].question("rr")
    mech = question.mechanism
    rng = np.random.default_rng(77)
    keys = rng.choice(sorted(FRAME), size=900)
    lean = {age: rng.dirichlet(np.full(4, 2.0)) for age in AGES}
    answers = np.array([rng.choice(4, p=lean[CATEGORIES[key][0]]) for key in keys])
    decoded = mech.simulate(answers, rng)
    reports = [
        ldp_pb2.Report(
            report_id=rng.bytes(16),
            survey_id="raked",
            question_id="rr",
            payload=mech.encode(r),
            definition_digest=question.digest,
            design_key=str(key),
        )
        for r, key in zip(decoded, keys, strict=True)
    ]
    with grpc.insecure_channel(server.target) as channel:
        collector = ldp_pb2_grpc.CollectorStub(channel)
        collector.Upload(ldp_pb2.UploadRequest(reports=reports), timeout=30)
    yield server, root / "surveys.toml", mech, decoded, keys
    server.stop()


def _reference(mech, decoded, keys, method: str):
    rows = [FRAME[key] for key in keys]
    design = Design(
        np.array([r[0] for r in rows]),
        np.array([r[1] for r in rows]),
        np.array([r[2] for r in rows]),
    )
    categories = np.array(
        [[AGES.index(CATEGORIES[k][0]), REGIONS.index(CATEGORIES[k][1])] for k in keys]
    )
    x_hat = contributions(mech, decoded)
    cells = design_cells(x_hat, design, joint_domains(categories, (3, 2)), 6)
    margins = [np.array([5000.0, 3000.0, 2000.0]), np.array([6500.0, 3500.0])]
    unraked = design_estimate(design_cells(x_hat, design), mech, method).estimate[0]
    return raked_estimate(cells, margins, method), unraked


@pytest.mark.parametrize("method", ["linearization", "jackknife"])
def test_estimate_design_rakes_to_the_survey_files_margins(raked, method):
    server, config, mech, decoded, keys = raked
    expected, unraked = _reference(mech, decoded, keys, method)
    assert np.max(np.abs(expected.estimate - unraked)) > 0.005  # raking moves this estimate
    where = ["estimate", "--survey", "raked", "--question", "rr", "--design", "--variance", method]
    remote = run_cli("agg", *where, "--json", "--server", server.analyst_target, check=True)
    local = run_cli("agg", *where, "--json", "--config", config, "--db", server.db, check=True)
    assert remote.stdout == local.stdout  # the store sits at the release the server took
    got = json.loads(local.stdout)
    np.testing.assert_allclose(got["estimate"], expected.estimate, rtol=1e-10)
    np.testing.assert_allclose(got["standard_error"], expected.standard_error, rtol=1e-9)
    assert got["n"] == 900 and "deff" not in got
    assert got["design"].endswith("raked to the margins of age, region")
    text = run_cli("agg", *where, "--config", config, "--db", server.db, check=True).stdout
    assert "raked to the margins of age, region" in text.splitlines()[0]


def test_the_report_shows_the_raked_estimate(raked, tmp_path):
    server, config, mech, decoded, keys = raked
    expected, _ = _reference(mech, decoded, keys, "linearization")
    out = tmp_path / "raked.md"
    args = ["report", "--config", config, "--db", server.db, "--survey", "raked", "--out", out]
    run_cli("agg", *args, "--format", "md", check=True)
    text = out.read_text()
    assert "raked to the margins of age, region; variance: linearization" in text
    assert share(expected.estimate[0]) in text and share(expected.standard_error[0]) in text


@pytest.mark.parametrize(
    ("margins", "frame", "message"),
    [
        ("margins = { age = { young = 5000, mid = 3000, old = 1000 }, region = { n = 6500, "
         "s = 3500 } }", None, "margin 'region' sums to 10000, another to 9000"),
        ("margins = { age = { young = 5000, mid = 5000 }, region = { n = 6500, s = 3500 } }",
         None, "'old' is not a category of margin 'age'"),
        ("margins = { age = { young = 2000, mid = 3000, old = 2000, baby = 3000 }, region = "
         "{ n = 6500, s = 3500 } }", None, "no key lies in age 'baby'"),
        ("margins = { age = { young = 10000 } }", None, "needs at least 2 categories"),
        ("margins = { age = { young = 5000, mid = 3000, old = -2 } }", None,
         "must be a finite positive count"),
        ("margins = { weight = { a = 1, b = 2 } }", None, "names a frame column of its own"),
        ("margins = { age = { young = 5, mid = 3, old = 2 } }, population = { a = 1, b = 2 }",
         None, "population (post-strata) or margins (raking), not both"),
        ("margins = { age = 3 }", None, "needs at least 2 categories"),
        (MARGINS, "key,stratum,psu,weight,age\nk,s,p,1,young\n", "missing column(s) region"),
    ],
)  # fmt: skip
def test_bad_margins_are_one_line_config_errors(tmp_path, margins, frame, message):
    config = write(tmp_path, margins, frame)
    with pytest.raises(ConfigError) as caught:
        load_surveys(config)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    out = run_cli("agg", "check-config", config)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
