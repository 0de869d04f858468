"""``ldp-client simulate --design-keys FRAME --icc RHO``: the true answers of simulated devices,
clustered by the frame's PSUs, and their keys consistent with the survey's groups.

The draws are read off the reports themselves: each mechanism's ``randomize`` is replaced by the
identity here, so a report's payload is its device's true answer, and a fake transport keeps
what ``run_simulate`` uploads. Checked: RHO = 0 draws exactly what simulate drew before --icc
existed (sha256 of every report's group, key and answer for fixed seeds); the realized
intra-cluster correlation (ANOVA estimator over PSUs) is RHO within its sampling error; a frame
that implies groups gives every device a key of its own group; bad flags are refused.
"""

from __future__ import annotations

import hashlib
import shlex

import numpy as np
import pytest
from cli_runner import run_cli

from aggregator.survey_file.config import load_surveys
from client.cli.main import build_parser
from client.simulate import population
from client.simulate.population import SimulationError
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2

#: The design and group surveys of scripts/cli_transcript.py, whose digests below were taken on
#: the code before --icc (commit 7ab4a42).
FIELD = """
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
id = "clinics"
min_batch_size = 100
group_label = "clinic"
group_values = ["north", "south", "east", "west"]

[[survey.question]]
id = "smoker"
categories = ["never", "former", "current"]
mechanism = "randomized_response"
epsilon = 2.0

[[survey.question]]
id = "mood"
categories = ["1", "2", "3", "4", "5"]
mechanism = "randomized_response"
epsilon = 2.0
scores = [0, 25, 50, 75, 100]

[[survey.question]]
id = "pain"
categories = ["none", "mild", "moderate", "severe"]
mechanism = "flip_components"
epsilon = 2.0
ordinal = true

[[survey.question]]
id = "sleep"
categories = ["<5", "5-6", "7-8", ">8"]
mechanism = "randomized_response"
epsilon = 2.0

[[survey]]
id = "plain"
min_batch_size = 10

[[survey.question]]
id = "q"
categories = ["a", "b", "c"]
mechanism = "randomized_response"
epsilon = 2.0
"""
#: 3 strata x 6 PSUs x 2 weight classes (scripts/cli_transcript.py, design_frames).
TRANSCRIPT_FRAME = "key,stratum,psu,weight\n" + "".join(
    f"k{h}{c}{w},s{h},p{h}{c},{1.0 + h + 3.0 * w:g}\n"
    for h in range(3)
    for c in range(6)
    for w in range(2)
)


class Capture:
    """A transport that serves one survey and keeps every uploaded report."""

    def __init__(self, survey: SurveySpec) -> None:
        self.survey, self.reports = survey, []

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def get_survey(self, survey_id: str) -> SurveySpec:
        return self.survey

    def upload(self, batch, signer=None):
        self.reports += batch
        return [ldp_pb2.ReportResult(status=ldp_pb2.ACCEPTED) for _ in batch]


@pytest.fixture
def simulate(tmp_path, monkeypatch):
    """``simulate(survey_toml, survey_id, "--devices ...", keys_text)``: the reports one run
    uploads, each payload its device's true answer (2 bytes). ``keys_text`` is written to
    keys.csv (the --design-keys file); the survey file's own frame.csv is a one-key frame (the
    device side never sees it)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "frame.csv").write_text("key,stratum,psu,weight\nk,s,p,1\n")

    def run(toml: str, survey_id: str, flags: str, keys: str | None = None) -> list:
        if keys is not None:
            (tmp_path / "keys.csv").write_text(keys)
        (tmp_path / "surveys.toml").write_text(toml)
        spec = SurveySpec.from_proto(load_surveys(tmp_path / "surveys.toml")[survey_id].to_proto())
        for question in spec.questions:
            kind = type(question.mechanism)
            monkeypatch.setattr(kind, "randomize", lambda self, answer: answer)
            monkeypatch.setattr(kind, "encode", lambda self, answer: int(answer).to_bytes(2, "big"))
        argv = ["simulate", "--server", "h:1", "--insecure", "--json", "--survey", survey_id]
        capture = Capture(spec)
        args = build_parser().parse_args(argv + shlex.split(flags))
        population.run_simulate(args, lambda: capture)
        return capture.reports

    return run


def digest(reports: list) -> str:
    h = hashlib.sha256()
    for r in reports:
        h.update(f"{r.question_id}|{r.group}|{r.design_key}|{r.payload.hex()}\n".encode())
    return h.hexdigest()


def test_rho_zero_draws_what_simulate_drew_before(simulate):
    field = (
        "--devices 3000 --seed 7 --design-keys keys.csv --group-share north=0.6,south=0.4 "
        "--truth rr=0.4,0.3,0.2,0.1 --truth noise=0.5,0.3,0.2 "
        "--truth pair=0.3,0.2,0.1,0.1,0.2,0.1"
    )
    before = "96abe492c4ee56ce778b30ac3b870520874c294b378e112959cbefd749dcbc3c"
    assert digest(simulate(FIELD, "field", field, TRANSCRIPT_FRAME)) == before
    assert digest(simulate(FIELD, "field", field + " --icc 0", TRANSCRIPT_FRAME)) == before
    clinics = (
        "--devices 2000 --group-share north=0.32,south=0.32,east=0.35,west=0.01 "
        "--truth smoker=0.6,0.25,0.15 --truth mood=0.1,0.2,0.3,0.25,0.15 "
        "--truth pain=0.4,0.3,0.2,0.1 --truth sleep=0.1,0.3,0.5,0.1 "
        "--truth-for east:smoker=0.4,0.3,0.3 --truth-for east:mood=0.05,0.15,0.3,0.3,0.2 "
        "--truth-for east:pain=0.25,0.3,0.25,0.2 --seed 8"
    )
    before = "ff63fd7e9218870c1c7d600220cc7d9d1abdf3501b3805abdd7aabc8058125ff"
    assert digest(simulate(FIELD, "clinics", clinics)) == before
    clustered = simulate(FIELD, "field", field + " --icc 0.3", TRANSCRIPT_FRAME)
    assert digest(clustered) != before


def anova_icc(answers: np.ndarray, clusters: np.ndarray, category: int) -> float:
    """The one-way ANOVA estimator of the intra-cluster correlation of the indicator of
    ``category`` (unequal cluster sizes: Donner's m0)."""
    y = (answers == category).astype(float)
    labels, index, sizes = np.unique(clusters, return_inverse=True, return_counts=True)
    n, c = y.size, labels.size
    means = np.bincount(index, weights=y) / sizes
    between = np.sum(sizes * (means - y.mean()) ** 2) / (c - 1)
    within = np.sum((y - means[index]) ** 2) / (n - c)
    m0 = (n - np.sum(sizes**2) / n) / (c - 1)
    return float((between - within) / (between + (m0 - 1) * within))


#: 2 strata x 150 PSUs x 2 weight classes: the cluster is the PSU, not the key.
CLUSTER_FRAME = "key,stratum,psu,weight\n" + "".join(
    f"k{h}-{c}-{w},s{h},p{h}-{c},{1 + w}\n" for h in range(2) for c in range(150) for w in range(2)
)
TRUTH = "--truth q=0.5,0.3,0.2"
DESIGN_Q = """
[[survey]]
id = "clustered"
min_batch_size = 10
design = { table = "frame.csv" }

[[survey.question]]
id = "q"
categories = ["a", "b", "c"]
mechanism = "randomized_response"
epsilon = 2.0
"""


@pytest.mark.parametrize("rho", [0.0, 0.05, 0.2, 0.5])
def test_realized_icc_is_rho(simulate, rho):
    """300 PSUs of about 15 devices (each PSU two keys), 8 seeds: the mean ANOVA ICC of every
    category is within 4 standard errors (over the seeds) of rho, and those errors are small
    enough to tell the rho values apart (measured: 0.001-0.004 at rho <= 0.05, 0.006-0.012 at
    0.2 and 0.5)."""
    estimates = []
    for seed in range(8):
        flags = f"--devices 4500 --seed {seed} --design-keys keys.csv --icc {rho} {TRUTH}"
        reports = simulate(DESIGN_Q, "clustered", flags, CLUSTER_FRAME)
        answers = np.array([int.from_bytes(r.payload, "big") for r in reports])
        psus = np.array([r.design_key.rsplit("-", 1)[0] for r in reports])
        estimates.append([anova_icc(answers, psus, j) for j in range(3)])
    estimates = np.array(estimates)
    mean = estimates.mean(axis=0)
    error = estimates.std(axis=0, ddof=1) / np.sqrt(len(estimates))
    assert np.all(error < 0.005 + 0.03 * rho), error
    assert np.all(np.abs(mean - rho) < 4 * error), (mean, error)


REGIONS = """
[[survey]]
id = "regions"
min_batch_size = 10
group_label = "region"
group_values = ["north", "south", "east"]
design = { table = "frame.csv" }

[[survey.question]]
id = "q"
categories = ["a", "b", "c"]
mechanism = "randomized_response"
epsilon = 2.0
"""


def frame_text(columns: str, rows: list[tuple]) -> str:
    return columns + "\n" + "".join(",".join(map(str, row)) + "\n" for row in rows)


def test_strata_named_by_groups_put_every_device_in_its_stratum(simulate):
    """Strata north and south of a label north/south/east: each device's key lies in the
    stratum of its group, at the --group-share shares; a group with a share but no key is
    refused."""
    rows = [(f"{h[0]}{c}", h, f"{h}-{c}", 1) for h in ("north", "south") for c in range(5)]
    frame = frame_text("key,stratum,psu,weight", rows)
    stratum = {key: h for key, h, _, _ in rows}
    flags = "--devices 2000 --seed 3 --design-keys keys.csv --group-share north=0.8,south=0.2"
    reports = simulate(REGIONS, "regions", flags, frame)
    assert all(stratum[r.design_key] == r.group for r in reports)
    north = sum(r.group == "north" for r in reports)
    assert abs(north - 1600) < 4 * np.sqrt(2000 * 0.8 * 0.2)
    assert len({r.design_key for r in reports}) == 10
    with pytest.raises(SimulationError, match="no key of the --design-keys frame lies in group"):
        simulate(REGIONS, "regions", "--devices 100 --seed 3 --design-keys keys.csv", frame)


def test_a_column_named_after_the_group_label_gives_each_key_its_group(simulate):
    """A frame with a region column (varying within PSUs): each device's group is its key's
    region; a region that is not a group value is refused."""
    rows = [
        (f"k{c}{w}", "s", f"p{c}", 1, ("north", "south", "east")[(c + w) % 3])
        for c in range(6)
        for w in range(3)
    ]
    frame = frame_text("key,stratum,psu,weight,region", rows)
    region = {row[0]: row[4] for row in rows}
    reports = simulate(REGIONS, "regions", "--devices 600 --seed 4 --design-keys keys.csv", frame)
    assert all(region[r.design_key] == r.group for r in reports)
    assert {r.group for r in reports} == {"north", "south", "east"}
    bad = frame_text("key,stratum,psu,weight,region", [("k", "s", "p", 1, "west")])
    with pytest.raises(SimulationError, match="region 'west' is not one of the survey's"):
        simulate(REGIONS, "regions", "--devices 10 --design-keys keys.csv", bad)


def test_groups_with_one_truth_share_their_psu_draw(simulate):
    """Regions alternate within every PSU: with the same truth in every region, the devices of
    a PSU share one draw, so the ICC over PSUs (not over PSU x region) is rho = 0.3; a region
    with its own truth (--truth-for) keeps rho within its own devices."""
    rows = [
        (f"k{c}-{w}", "s", f"p{c}", 1, ("north", "south", "east")[w])
        for c in range(200)
        for w in range(3)
    ]
    frame = frame_text("key,stratum,psu,weight,region", rows)
    shared, own = [], []
    for seed in range(6):
        flags = f"--devices 3000 --seed {seed} --design-keys keys.csv --icc 0.3 {TRUTH}"
        flags += " --truth-for east:q=0.2,0.3,0.5"
        reports = simulate(REGIONS, "regions", flags, frame)
        answers = np.array([int.from_bytes(r.payload, "big") for r in reports])
        psus = np.array([r.design_key.split("-")[0] for r in reports])
        east = np.array([r.group == "east" for r in reports])
        shared.append(anova_icc(answers[~east], psus[~east], 0))
        own.append(anova_icc(answers[east], psus[east], 0))
    for estimates in (shared, own):
        error = np.std(estimates, ddof=1) / np.sqrt(len(estimates))
        assert error < 0.02 and abs(np.mean(estimates) - 0.3) < 4 * error, estimates


@pytest.mark.parametrize(
    ("survey", "flags", "frame", "message"),
    [
        ("clustered", "--icc 1", CLUSTER_FRAME, r"--icc 1: the intra-cluster correlation"),
        ("clustered", "--icc -0.1", CLUSTER_FRAME, r"must be in \[0, 1\)"),
        ("clustered", "--icc nan", CLUSTER_FRAME, r"must be in \[0, 1\)"),
        ("plain", "--icc 0.1", None, "survey plain has no sampling design"),
        ("clustered", "--icc 0.1", "key\nk1\nk2\n", "has no psu column"),
        ("clustered", "--icc 0.1", "k1\nk2\n", "has no psu column"),
    ],
)
def test_icc_flags_that_cannot_cluster_are_refused(simulate, survey, flags, frame, message):
    toml = FIELD if survey == "plain" else DESIGN_Q
    keys = "" if frame is None else " --design-keys keys.csv"
    with pytest.raises(SimulationError, match=message):
        simulate(toml, survey, f"--devices 10{keys} {flags}", frame)


def test_icc_out_of_range_ends_in_one_line_before_connecting():
    base = ["simulate", "--server", "127.0.0.1:9", "--insecure", "--survey", "s", "--devices", "5"]
    done = run_cli("client", *base, "--icc", "1")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "--icc 1: the intra-cluster correlation must be in [0, 1)" in lines[0]
