"""The operators' metrics: recorded values reach a real /metrics scrape, from one process and
summed over several (prometheus-client's multiprocess mode, as with serve --workers N)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRAPE = """
import urllib.request
from aggregator.service.metrics import PrometheusMetrics, start_exporter
metrics = PrometheusMetrics()
metrics.upload("Upload", "OK", 0.004)
metrics.upload("Upload", "RESOURCE_EXHAUSTED", 0.001)
metrics.reports("accepted", 7)
metrics.reports("duplicate", 2)
metrics.commit(0.003, 9)
metrics.stored("panel", "mood", 7)
port = start_exporter("127.0.0.1", 0)
print(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
"""

MULTIPROCESS = """
import multiprocessing, urllib.request

def worker():
    from aggregator.service.metrics import PrometheusMetrics
    PrometheusMetrics().reports("accepted", 5)

if __name__ == "__main__":
    from aggregator.service.metrics import prepare_multiprocess
    prepare_multiprocess()  # in the parent, before any worker starts
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=worker) for _ in range(3)]
    for p in procs: p.start()
    for p in procs: p.join()
    from aggregator.service.metrics import start_exporter
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
    assert 'ldp_reports_stored_total{question="mood",survey="panel"} 7.0' in page


def test_worker_processes_are_summed(tmp_path):
    page = scrape(MULTIPROCESS, tmp_path)
    assert 'ldp_reports_total{outcome="accepted"} 15.0' in page
