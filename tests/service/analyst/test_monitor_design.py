"""A survey with a sampling design is not monitored anytime-valid: the confidence sequences and
e-processes treat reports as a simple random sample of independent devices, which weighted and
clustered reports are not. The Monitor RPC answers FAILED_PRECONDITION, ``watch`` refuses in
one line, and a survey file declaring a sequential analysis of such a survey is refused."""

from __future__ import annotations

import grpc
import pytest
from cli_runner import run_cli
from conftest import ServerThread

from aggregator.survey_file.analyses import load_analyses
from aggregator.survey_file.config import ConfigError, load_surveys
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

FRAME = "key,stratum,psu,weight\nn1,north,v1,2\nn2,north,v2,1\ns1,south,v3,1\ns2,south,v4,3\n"
CONFIG = """
[[survey]]
id = "field"
min_batch_size = 5
design = {{ table = "frame.csv" }}

[[survey.question]]
id = "water"
categories = ["tap", "well", "river"]
mechanism = "randomized_response"
epsilon = 2.0
{analysis}
"""
SEQUENTIAL = """
[[survey.analysis]]
question = "water"
test = "goodness_of_fit"
p0 = "uniform"
sequential = true
"""


@pytest.fixture
def config(tmp_path):
    (tmp_path / "frame.csv").write_text(FRAME)
    path = tmp_path / "surveys.toml"
    path.write_text(CONFIG.format(analysis=""))
    return path


def test_monitor_and_watch_refuse_a_design_survey(config, tmp_path):
    server = ServerThread(config, tmp_path / "reports.sqlite").start()
    try:
        request = ldp_pb2.MonitorRequest(survey_id="field", question_id="water")
        with (
            grpc.insecure_channel(server.analyst_target) as channel,
            pytest.raises(grpc.RpcError) as info,
        ):
            ldp_pb2_grpc.AnalystStub(channel).Monitor(request, timeout=30)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "sampling design" in info.value.details()
        ask = ["--survey", "field", "--question", "water", "--once"]
        for source in (["--server", server.analyst_target], ["--db", str(server.db)]):
            done = run_cli("agg", "watch", "--config", config, *source, *ask)
            lines = done.stderr.strip().splitlines()
            assert done.returncode == 2 and len(lines) == 1, done
            assert "sampling design" in lines[0] and "Traceback" not in done.stderr
    finally:
        server.stop()


def test_a_sequential_analysis_of_a_design_survey_is_refused(config):
    config.write_text(CONFIG.format(analysis=SEQUENTIAL))
    surveys = load_surveys(config)
    with pytest.raises(ConfigError, match="sampling design") as info:
        load_analyses(config, surveys)
    assert "\n" not in str(info.value)
