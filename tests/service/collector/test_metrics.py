"""The operators' metrics: recorded values reach a real /metrics scrape, from one process and
summed over several (prometheus-client's multiprocess mode, as with serve --workers N)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

SCRAPE = """
import urllib.request
from aggregator.service.collector.metrics import PrometheusMetrics, start_exporter
metrics = PrometheusMetrics()
metrics.upload("Upload", "OK", 0.004)
metrics.upload("Upload", "RESOURCE_EXHAUSTED", 0.001)
metrics.reports("accepted", 7)
metrics.reports("duplicate", 2)
metrics.commit(0.003, 9)
metrics.stored("panel", "mood", 7)
metrics.stored("panel", "mood", 250)
metrics.stored("panel", "age", 99)
metrics.publish()
port = start_exporter("127.0.0.1", 0)
print(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
"""

MULTIPROCESS = """
import multiprocessing, urllib.request

def worker():
    from aggregator.service.collector.metrics import PrometheusMetrics
    PrometheusMetrics().reports("accepted", 5)

if __name__ == "__main__":
    from aggregator.service.collector.metrics import prepare_multiprocess
    prepare_multiprocess()  # in the parent, before any worker starts
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=worker) for _ in range(3)]
    for p in procs: p.start()
    for p in procs: p.join()
    from aggregator.service.collector.metrics import start_exporter
    port = start_exporter("127.0.0.1", 0)
    print(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
"""


def scrape(program: str, tmp_path) -> str:
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(program))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout


def test_recorded_values_reach_a_scrape(tmp_path):
    page = scrape(SCRAPE, tmp_path)
    assert 'ldp_uploads_total{code="OK",rpc="Upload"} 1.0' in page
    assert 'ldp_uploads_total{code="RESOURCE_EXHAUSTED",rpc="Upload"} 1.0' in page
    assert 'ldp_reports_total{outcome="accepted"} 7.0' in page
    assert 'ldp_reports_total{outcome="duplicate"} 2.0' in page
    assert 'ldp_upload_duration_seconds_bucket{le="0.005",rpc="Upload"} 2.0' in page
    assert "ldp_commit_group_reports_sum 9.0" in page
    # reports stored per question: published in whole steps of 100 (257 -> 200; 99 -> nothing)
    assert 'ldp_reports_stored_total{question="mood",survey="panel"} 200.0' in page
    assert 'question="age"' not in page


def test_worker_processes_are_summed(tmp_path):
    page = scrape(MULTIPROCESS, tmp_path)
    assert 'ldp_reports_total{outcome="accepted"} 15.0' in page


ONE_UPLOAD = """
import json, os, sys, time, urllib.request
sys.path.insert(0, {tests!r})
import grpc
from conftest import ServerThread
from aggregator.service.collector.metrics import PrometheusMetrics, start_exporter
from aggregator.service.collector.observe import Observer
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

# the Analyst's worker processes are spawned: they import this file, so guard the server
if __name__ == "__main__":
    metrics = PrometheusMetrics(publish_every=0.2)
    server = ServerThread({config!r}, {db!r}, observer=Observer(metrics)).start()
    port = start_exporter("127.0.0.1", 0)
    question = server.surveys["panel"].question("mood")

    def upload(count):
        reports = [
            ldp_pb2.Report(
                report_id=os.urandom(16), survey_id="panel", question_id="mood",
                payload=question.mechanism.encode(question.mechanism.randomize(i % 3)),
                definition_digest=question.digest,
            )
            for i in range(count)
        ]
        with grpc.insecure_channel(server.target) as channel:
            ldp_pb2_grpc.CollectorStub(channel).Upload(ldp_pb2.UploadRequest(reports=reports))

    def scrape():
        url = f"http://127.0.0.1:{{port}}/metrics"
        page = urllib.request.urlopen(url, timeout=10).read().decode().splitlines()
        wanted = ("ldp_reports_stored_total{{", "ldp_reports_total{{")
        return [line for line in page if line.startswith(wanted)]

    upload(150)
    deadline = time.monotonic() + 30
    while not any("ldp_reports_stored_total" in line for line in scrape()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    before = scrape()
    upload(1)
    right_after = scrape()
    time.sleep(1.0)  # five publishing rounds
    later = scrape()
    server.stop()
    print(json.dumps({{"before": before, "right_after": right_after, "later": later}}))
"""


PANEL = """
[[survey]]
id = "panel"
min_batch_size = 1

[[survey.question]]
id = "mood"
categories = ["a", "b", "c"]
mechanism = "randomized_response"
epsilon = 1.0
"""


def test_one_upload_does_not_move_the_per_question_series(tmp_path):
    """A real server and a real scrape before and after one upload: the per-question series
    stays as it was (right after, and after several publishing rounds), while the upload itself
    is counted."""
    config = tmp_path / "panel.toml"
    config.write_text(PANEL)
    program = ONE_UPLOAD.format(
        tests=str(Path(__file__).parents[2]), config=str(config), db=str(tmp_path / "r.sqlite")
    )
    pages = json.loads(scrape(program, tmp_path).splitlines()[-1])
    stored = 'ldp_reports_stored_total{question="mood",survey="panel"} 100.0'
    for when in ("before", "right_after", "later"):
        assert [line for line in pages[when] if "stored" in line] == [stored], when
    accepted = [line for line in pages["later"] if 'outcome="accepted"' in line]
    assert accepted == ['ldp_reports_total{outcome="accepted"} 151.0']
