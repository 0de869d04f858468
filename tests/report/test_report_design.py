"""The report of a survey with a sampling design (issue 36): design-based by default, over
--db and --server alike. Each released question's headline is its design-based estimate (with
the design effects beside), the simple-random-sample estimate below it says it ignores the
design, and the declared tests are Rao-Scott tests unless one opts out (design = false), which
then says it ignores the design; --ignore-design reports the whole survey as a simple random
sample and says so."""

from __future__ import annotations

import re

import grpc
import numpy as np
import pytest
from cli_runner import run_cli
from conftest import ServerThread
from service.collector.test_design_service import SURVEYS, messages, write_survey

from aggregator.analysis.design_answers import design_test
from aggregator.analysis.survey_data import open_survey
from aggregator.stats.design.options import (
    DEFAULT_CORRECTION,
    DEFAULT_REPLICATES,
    DEFAULT_VARIANCE,
)
from aggregator.survey_file.design import IGNORES_DESIGN
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

ANALYSES = """
[[survey.analysis]]
title = "rr is uniform"
question = "rr"
test = "goodness_of_fit"
p0 = "uniform"

[[survey.analysis]]
title = "rr is uniform, as if a simple random sample"
question = "rr"
test = "goodness_of_fit"
p0 = "uniform"
design = false

[[survey.analysis]]
title = "north and south alike"
question = "rr"
test = "two_sample"
groups = ["north", "south"]

"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("report-design")
    config = write_survey(root)
    plain = SURVEYS.index('[[survey]]\nid = "plain"')
    config.write_text(SURVEYS[:plain] + ANALYSES + SURVEYS[plain:])
    server = ServerThread(config, root / "store.sqlite").start()
    channel = grpc.insecure_channel(server.target)
    collector = ldp_pb2_grpc.CollectorStub(channel)
    rng = np.random.default_rng(3636)
    for question_id in ("rr", "pair"):
        batch, _ = messages(server.surveys["field"], question_id, 600, rng)
        collector.Upload(ldp_pb2.UploadRequest(reports=batch), timeout=30)
    yield server, config, root
    channel.close()
    server.stop()


def _report(root, *source: str, name: str, extra: tuple[str, ...] = ()) -> str:
    out = root / name
    run_cli("agg", "report", *source, "--survey", "field", "--out", out, "--format", "md", *extra,
            check=True)  # fmt: skip
    return re.sub(r"\d{4}-\d\d-\d\dT[\d:]+\+00:00", "TIME", out.read_text())  # when made


def test_the_report_is_design_based_by_default_and_the_same_over_the_server(served):
    server, config, root = served
    remote = _report(root, "--server", server.analyst_target, "--config", str(config), name="s.md")
    local = _report(root, "--config", str(config), "--db", str(server.db), name="d.md")
    # up to the question below its release (whose words differ: a server says no count)
    assert remote[: remote.index("## noise")] == local[: local.index("## noise")]
    assert "design-based: every estimate and test uses the survey's sampling design" in local
    rr = local[local.index("## rr") : local.index("## noise")]
    headline = rr.index("Design-based estimate (stratified cluster design: 3 strata, 18 PSUs")
    assert headline < rr.index("Simple-random-sample estimate") < rr.index(IGNORES_DESIGN)
    assert "clustering" in rr
    by_design, ignoring, two = (rr.index(f"### {t}") for t in (
        "rr is uniform\n", "rr is uniform, as if", "north and south alike"))  # fmt: skip
    assert "Design-based: stratified cluster design" in rr[by_design:ignoring]
    assert IGNORES_DESIGN in rr[ignoring:two]
    assert "Design-based: stratified cluster design" in rr[two:]
    data = open_survey(config, server.db, "field", design=True)["rr"].design
    options = (DEFAULT_CORRECTION, DEFAULT_VARIANCE, DEFAULT_REPLICATES, 0)
    expected = design_test(data, "gof", np.full(4, 0.25), 0.05, *options)
    assert f"(p = {expected.pvalue:.3f}; design-based goodness of fit" in rr[by_design:ignoring]


def test_ignore_design_reports_a_simple_random_sample_and_says_so(served):
    server, config, root = served
    text = _report(root, "--config", str(config), "--db", str(server.db), name="i.md",
                   extra=("--ignore-design",))  # fmt: skip
    assert f"**{IGNORES_DESIGN}**" in text
    assert "Design-based estimate" not in text and "Design-based:" not in text
    assert text.count(IGNORES_DESIGN) >= 4  # the report's note and every declared test
