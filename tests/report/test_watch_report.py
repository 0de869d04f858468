"""The report's "as of n" section: the survey file's sequential analyses drawn over their looks
(the releases), from a running server (--server) and from the store (--db) alike, with the
sentence saying which guarantee each number carries; rendered by a real headless chromium."""

from __future__ import annotations

import dataclasses
import re

import grpc
import pytest
from cli.test_watch import CONFIG, STRONG, upload
from cli_runner import run_cli
from conftest import ServerThread
from report.test_report import chromium, run_chromium  # noqa: F401  (the chromium fixture)

from aggregator.report import build_report, render_html, render_markdown
from aggregator.report.sequential import SequentialSection
from aggregator.survey_file.config import load_surveys
from protos.ldp.v1 import ldp_pb2, ldp_pb2_grpc

TIMES = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\+00:00)?")
CLIP_IDS = re.compile(r"\b[mp][0-9a-f]{10}\b")


@pytest.fixture
def released(tmp_path):
    """A server whose mood question has four releases under a strong alternative and whose
    calm question has none; the survey file, the store and the server."""
    config = tmp_path / "surveys.toml"
    config.write_text(CONFIG)
    db = tmp_path / "reports.sqlite"
    server = ServerThread(config, db).start()
    surveys = load_surveys(config)
    with grpc.insecure_channel(server.analyst_target) as channel:
        analyst = ldp_pb2_grpc.AnalystStub(channel)
        for seed in range(4):
            upload(server, surveys, "mood", STRONG, 80, seed)
            analyst.Monitor(ldp_pb2.MonitorRequest(survey_id="s", question_id="mood"), timeout=30)
    upload(server, surveys, "calm", [0.5, 0.5], 10, 9)
    yield config, db, server
    server.stop()


def same(text: str) -> str:
    return CLIP_IDS.sub("p", TIMES.sub("T", text))


def test_the_section_over_the_server_and_the_store(released, tmp_path):
    config, db, server = released
    remote, local = tmp_path / "remote.html", tmp_path / "local.html"
    done = run_cli(
        "agg",
        "report",
        "--server",
        server.analyst_target,
        "--config",
        config,
        "--survey",
        "s",
        "--out",
        remote,
    )
    assert done.returncode == 0, done
    page = remote.read_text()
    section = page[page.index('<section id="as-of-n">') :]
    assert "<h3>mood uniform?</h3>" in section
    assert "As of n = 320 (4 look(s), one per release)" in section
    assert "time-uniform" in section and "valid at any stopping time" in section
    assert "Stopping rule: fired, reject the null" in section
    assert section.count("<svg") == 1
    assert section.count("<tr><td>") == 4  # one row per look
    assert "<h3>calm capped</h3>" in section and "Not shown yet: s/calm has fewer" in section
    done = run_cli("agg", "report", "--config", config, "--db", db, "--survey", "s", "--out", local)
    assert done.returncode == 0, done
    mood = re.compile(r'<section id="as-of-n">.*<h3>calm capped</h3>', re.S)
    here, there = mood.search(same(local.read_text())), mood.search(same(page))
    assert here is not None and there is not None and here[0] == there[0]
    assert "calm: no release recorded yet" in local.read_text()  # the store: no release yet
    markdown = tmp_path / "r.md"
    run_cli(
        "agg",
        "report",
        "--config",
        config,
        "--db",
        db,
        "--survey",
        "s",
        "--out",
        markdown,
        "--format",
        "md",
        check=True,
    )
    text = markdown.read_text()
    assert "## As of n: anytime-valid monitoring" in text and "| 320 |" in text


def test_a_section_without_a_test_says_there_is_no_stopping_rule(released):
    config, _, _ = released
    survey = load_surveys(config)["s"]
    section = SequentialSection("t", "frequencies", ("a", "b"), 0.05, 0, 10, (10,))
    report = dataclasses.replace(build_report(survey, {}), sequential=(section,))
    page = render_html(report)
    assert "Stopping rule: none (confidence sequences only)." in page
    assert render_markdown(build_report(survey, {})).count("As of n") == 0


@pytest.mark.slow
def test_the_section_renders_in_a_real_browser(released, tmp_path, chromium):  # noqa: F811
    config, _, server = released
    page = tmp_path / "report.html"
    run_cli(
        "agg",
        "report",
        "--server",
        server.analyst_target,
        "--config",
        config,
        "--survey",
        "s",
        "--out",
        page,
        check=True,
    )
    dom = run_chromium(chromium, "--dump-dom", page.as_uri()).stdout
    section = dom[dom.index('id="as-of-n"') :]
    assert section.count("<svg") == 1 and "e-value" in section
    assert "mood uniform?" in section and "calm capped" in section
