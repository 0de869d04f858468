"""The operator's view of a real aggregator process: Prometheus metrics scraped during real
uploads (one process, and --workers 2 summed over processes), the JSON access log (no device
identity in it), and deployment files whose serve flags exist."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from aggregator_process import analyst_port, free_port, spawn_serve

from client.device.transport import Transport, TransportError
from client.survey import SurveySpec
from protos.ldp.v1 import ldp_pb2

REPO = Path(__file__).resolve().parents[3]

SURVEY = """
[[survey]]
id = "ops"
min_batch_size = 1

[[survey.question]]
id = "q"
categories = ["a", "b", "c"]
mechanism = "randomized_response"
epsilon = 1.0
"""


def reports(survey: SurveySpec, count: int, start: int = 0) -> list[ldp_pb2.Report]:
    question = survey.question("q")
    return [
        ldp_pb2.Report(
            report_id=(start + i).to_bytes(16, "big"),
            survey_id="ops",
            question_id="q",
            payload=question.mechanism.encode(question.mechanism.randomize(i % 3)),
            definition_digest=question.digest,
        )
        for i in range(count)
    ]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def scrape_once_recorded(port: int, needle: str, seconds: float = 30) -> str:
    """The first scrape that shows ``needle``: a refused call's status can reach the client
    before the server has recorded the call (a race, not a failure); a generous deadline."""
    deadline = time.monotonic() + seconds
    while needle not in (page := scrape(port)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return page


def metric(page: str, name: str, labels: str = "") -> float:
    pattern = re.escape(name) + (r"\{" + labels + r"\}" if labels else "") + r" ([0-9.e+]+)"
    found = re.search(pattern, page)
    assert found, f"{name}{{{labels}}} not in the scrape"
    return float(found.group(1))


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "ops.toml"
    path.write_text(SURVEY)
    return path


@pytest.mark.parametrize("workers", [1, 2])
def test_metrics_and_access_log_during_real_uploads(tmp_path, config, workers):
    metrics_port = free_port()
    log = tmp_path / "server.log"
    with log.open("w") as output:
        process, port = spawn_serve(
            tmp_path / "port", "--config", str(config), "--db", str(tmp_path / "r.sqlite"),
            "--insecure", "--workers", str(workers), "--metrics-port", str(metrics_port),
            "--access-log", output=output,
        )  # fmt: skip
    try:
        with Transport(f"127.0.0.1:{port}", timeout=10) as transport:
            survey = transport.get_survey("ops")
            batch = reports(survey, 40)
            for _ in range(workers * 3):  # several connections' worth for the workers
                transport.upload(batch)  # 40 new, then 40 duplicates each time
            transport.upload(reports(survey, 25, start=1000))
        page = scrape(metrics_port)
        uploads = workers * 3 + 1
        assert metric(page, "ldp_uploads_total", 'code="OK",rpc="Upload"') == uploads
        assert metric(page, "ldp_reports_total", 'outcome="accepted"') == 65
        assert metric(page, "ldp_reports_total", 'outcome="duplicate"') == 40 * (uploads - 2)
        assert "ldp_reports_stored_total{" not in page  # published every 60 s, in steps of 100
        assert metric(page, "ldp_commit_group_reports_sum") == 40 * (uploads - 1) + 25
        assert metric(page, "ldp_upload_duration_seconds_count", 'rpc="Upload"') == uploads
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert len(lines) == uploads
    assert lines[0] == {**lines[0], "event": "upload", "rpc": "Upload", "code": "OK"}
    assert sum(line.get("accepted", 0) for line in lines) == 65
    text = log.read_text()
    listening = (port, metrics_port, analyst_port(tmp_path / "port"))
    for bound in listening:
        text = text.replace(f"127.0.0.1:{bound}", "")
    assert "127.0.0.1:" not in text  # no peer address in the access log
    assert (0).to_bytes(16, "big").hex() not in text  # no report id


def test_refused_uploads_are_counted_by_code(tmp_path, config):
    metrics_port = free_port()
    process, port = spawn_serve(
        tmp_path / "port", "--config", str(config), "--db", str(tmp_path / "r.sqlite"),
        "--insecure", "--metrics-port", str(metrics_port),
    )  # fmt: skip
    try:
        with Transport(f"127.0.0.1:{port}", timeout=10) as transport:
            survey = transport.get_survey("ops")
            bad = reports(survey, 3)
            bad[1].payload = b"\xff\xff\xff\xff"  # category out of range: the whole call refused
            with pytest.raises(TransportError) as refused:
                transport.upload(bad)
            assert refused.value.code.name == "OUT_OF_RANGE"
        page = scrape_once_recorded(metrics_port, 'ldp_reports_total{outcome="rejected"}')
        assert metric(page, "ldp_uploads_total", 'code="OUT_OF_RANGE",rpc="Upload"') == 1
        assert metric(page, "ldp_reports_total", 'outcome="rejected"') == 3
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def test_metrics_port_mistakes_are_one_line(tmp_path, config):
    taken = free_port()
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        done = subprocess.run(
            [sys.executable, "-m", "aggregator.cli", "serve", "--config", str(config), "--db",
             str(tmp_path / "r.sqlite"), "--insecure", "--port", "0", "--metrics-port",
             str(taken)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().startswith("ldp-aggregator: error: cannot serve metrics on")


def deployment_serve_flags() -> list[tuple[str, list[str]]]:
    """The serve command lines of the Dockerfile and the systemd unit, as argument lists."""
    docker = (REPO / "scripts/deploy/Dockerfile").read_text()
    cmd = json.loads(
        re.search(r"^CMD (\[.*?\])$", docker, re.S | re.M).group(1).replace("\\\n", "")
    )
    unit = (REPO / "scripts/deploy/ldp-aggregator.service").read_text()
    exec_start = re.search(r"^ExecStart=(.*?)(?=\n\S)", unit, re.S | re.M).group(1)
    unit_args = shlex.split(exec_start.replace("\\\n", " "))[1:]
    return [("Dockerfile", cmd), ("systemd unit", unit_args)]


@pytest.mark.parametrize(("where", "args"), deployment_serve_flags())
def test_deployment_files_use_existing_serve_flags(where, args):
    from aggregator.cli import build_parser

    assert args[0] == "serve", where
    parsed = build_parser().parse_args(args)
    assert parsed.metrics_port == 9464 and parsed.workers == 2, where
    assert parsed.tls_cert is not None and parsed.host == "0.0.0.0", where
    assert parsed.metrics_host == "127.0.0.1", where  # operators only


@pytest.mark.parametrize(("where", "args"), deployment_serve_flags())
def test_deployment_files_keep_the_analyst_to_analysts(where, args):
    """The Analyst listens on loopback, or elsewhere only with an analyst CA that is not the
    device CA (docs/threat-model.md "Roles")."""
    from aggregator.cli import build_parser
    from aggregator.service.analyst.auth import is_loopback

    parsed = build_parser().parse_args(args)
    assert parsed.analyst_port == 50052 and parsed.analyst_port != parsed.port, where
    if not is_loopback(parsed.analyst_host):
        assert parsed.analyst_client_ca is not None, where
        assert parsed.analyst_client_ca != parsed.client_ca, where


def test_compose_and_prometheus_files_parse():
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((REPO / "scripts/deploy/compose.yaml").read_text())
    assert set(compose["services"]) == {"aggregator", "prometheus"}
    published = compose["services"]["aggregator"]["ports"]
    assert published == ["50051:50051", "127.0.0.1:50052:50052", "127.0.0.1:9090:9090"]
    assert compose["services"]["prometheus"]["network_mode"] == "service:aggregator"
    scrape_config = yaml.safe_load((REPO / "scripts/deploy/prometheus.yml").read_text())
    (job,) = scrape_config["scrape_configs"]
    assert job["static_configs"][0]["targets"] == ["127.0.0.1:9464"]  # the exporter's loopback
    healthcheck = (REPO / "scripts/deploy/Dockerfile").read_text()
    assert "aggregator.service.server.healthcheck" in healthcheck
