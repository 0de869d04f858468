"""The analyst's Python API over a real store: ``aggregator.open_survey(..., group=...)`` reads
one group and withholds what the command line withholds; histograms from it know their question,
so estimates name their categories and ``independence`` needs no ``shape``."""

from __future__ import annotations

import os
import sys

import grpc
import numpy as np
import pytest
from cli_runner import run_cli
from conftest import ServerThread

import aggregator
from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats import estimate, independence
from aggregator.survey_file.config import ConfigError
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

SURVEYS = """
[[survey]]
id = "clinics"
min_batch_size = 50
group_label = "clinic"
group_values = ["north", "south", "east"]

[[survey.question]]
id = "insured"
categories = ["yes", "no", "unsure"]
mechanism = "randomized_response"
epsilon = 2.0

[[survey.question]]
id = "smoke_age"
attributes = [
  { name = "smoker", categories = ["no", "yes"] },
  { name = "age", categories = ["18-39", "40-64", "65+"] },
]
mechanism = "randomized_response"
epsilon = 2.0
"""
DEVICES = {"north": 600, "south": 400, "east": 10}  # east stays below min_batch_size


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A server's store with both questions answered in every clinic; (config, db)."""
    root = tmp_path_factory.mktemp("api")
    config = root / "surveys.toml"
    config.write_text(SURVEYS)
    server = ServerThread(config, root / "reports.sqlite").start()
    rng = np.random.default_rng(5)
    survey = server.surveys["clinics"]
    try:
        with grpc.insecure_channel(server.target) as channel:
            collector = ldp_pb2_grpc.CollectorStub(channel)
            for clinic, n in DEVICES.items():
                for question in survey.questions:
                    mech = question.mechanism
                    batch = [
                        ldp_pb2.Report(
                            report_id=os.urandom(16),
                            survey_id=survey.id,
                            question_id=question.id,
                            payload=mech.encode(value),
                            definition_digest=question.digest,
                            group=clinic,
                        )
                        for value in mech.simulate(rng.integers(0, mech.k, size=n), rng)
                    ]
                    collector.Upload(ldp_pb2.UploadRequest(reports=batch), timeout=30)
    finally:
        server.stop()
    return config, root / "reports.sqlite"


def test_open_survey_reads_one_group(store):
    config, db = store
    north = aggregator.open_survey(config, db, group="north")
    assert north.group == "north" and north["insured"].n == DEVICES["north"]
    pooled = aggregator.open_survey(config, db)
    assert pooled["insured"].n == sum(DEVICES.values())


def test_an_unknown_group_is_a_config_error(store):
    config, db = store
    with pytest.raises(ConfigError, match="unknown clinic 'west'; expected one of north"):
        aggregator.open_survey(config, db, group="west")


def test_a_group_below_min_batch_size_is_refused_as_on_the_command_line(store):
    config, db = store
    east = aggregator.open_survey(config, db, group="east")["insured"]
    assert east.n == DEVICES["east"] and not east.released
    with pytest.raises(InsufficientDataError) as refused:
        east.histogram  # noqa: B018 (the property is the refusal)
    where = ("--config", config, "--db", db, "--survey", "clinics", "--question", "insured")
    cli = run_cli("agg", "estimate", *where, "--group", "east")
    assert cli.returncode == 3 and str(refused.value) in cli.stderr
    assert str(refused.value) == (
        "clinics/insured has 10 reports of clinic 'east'; results are released from 50 "
        "(min_batch_size)"
    )


def test_to_frame_is_indexed_by_the_labels(store):
    config, db = store
    frame = estimate(aggregator.open_survey(config, db)["insured"].histogram).to_frame()
    assert list(frame.index) == ["yes", "no", "unsure"] and frame.index.name == "category"
    joint = estimate(aggregator.open_survey(config, db)["smoke_age"].histogram).to_frame()
    assert list(joint.index)[:2] == ["no|18-39", "no|40-64"] and len(joint) == 6


def test_to_frame_without_pandas_names_the_extra(store, monkeypatch):
    config, db = store
    result = estimate(aggregator.open_survey(config, db)["insured"].histogram)
    monkeypatch.setitem(sys.modules, "pandas", None)  # what an install without [frame] sees
    with pytest.raises(ImportError, match=r"pip install 'ldp-survey\[frame\]'"):
        result.to_frame()


def test_independence_reads_the_shape_from_the_question(store):
    config, db = store
    hist = aggregator.open_survey(config, db)["smoke_age"].histogram
    assert hist.question is not None and hist.question.table_shape == (2, 3)
    by_question, by_hand = independence(hist), independence(hist, (2, 3))
    assert (by_question.statistic, by_question.pvalue) == (by_hand.statistic, by_hand.pvalue)
    assert independence(hist, alpha=0.01).dof == 2
    bare = Histogram(hist.mechanism, hist.n, hist.values)
    with pytest.raises(InvalidInputError, match=r"needs shape=\(r, c\)"):
        independence(bare)
    one_attribute = aggregator.open_survey(config, db)["insured"].histogram
    with pytest.raises(InvalidInputError, match="question insured has 1 attribute"):
        independence(one_attribute)


def test_merged_histograms_keep_their_question_only_if_shared(store):
    config, db = store
    north = aggregator.open_survey(config, db, group="north")
    south = aggregator.open_survey(config, db, group="south")
    both = north["insured"].histogram + south["insured"].histogram
    assert both.labels == ("yes", "no", "unsure") and both.n == 1000
    with pytest.raises(InvalidInputError, match="is randomized with"):
        Histogram(north["smoke_age"].histogram.mechanism, 0, [0] * 6, north["insured"].question)
