"""The README's Python works as written: every ```python block runs, in a folder holding the
files its "Run a survey" section creates (surveys.toml and a report store with reports)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from aggregator_process import free_port
from conftest import ServerThread

from aggregator.survey_file.config import load_surveys
from client.budgeting import survey_cost
from client.device.transport import Transport
from protos.ldp.v1 import ldp_pb2

REPO = Path(__file__).resolve().parents[2]
BLOCKS = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 2


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """surveys.toml (the demo's) and reports.sqlite with 1,200 uploads over real gRPC."""
    folder = tmp_path_factory.mktemp("readme")
    config = folder / "surveys.toml"
    shutil.copy(REPO / "scripts" / "demo_survey.toml", config)
    server = ServerThread(config, folder / "reports.sqlite").start()
    try:
        with Transport(server.target) as transport:
            survey = transport.get_survey("wellbeing-2026")
            rng = np.random.default_rng(3)
            reports = []
            for question in survey.questions:
                mech = question.mechanism
                for answer in rng.integers(0, question.k, size=1200):
                    reports.append(
                        ldp_pb2.Report(
                            report_id=os.urandom(16),
                            survey_id=survey.id,
                            question_id=question.id,
                            payload=mech.encode(mech.randomize(int(answer))),
                            definition_digest=question.digest,
                        )
                    )
            for start in range(0, len(reports), 2000):
                transport.upload(reports[start : start + 2000])
    finally:
        server.stop()
    return folder


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs(index, study, monkeypatch, capsys):
    monkeypatch.chdir(study)
    exec(compile(BLOCKS[index], f"README.md python block {index + 1}", "exec"), {})
    assert capsys.readouterr().out  # every block shows its result


@pytest.mark.slow
def test_readme_run_a_survey_commands_work_as_written(tmp_path):
    """The bash block of "Run a survey", line by line (on a free port instead of 50051)."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Run a survey") :]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1)
    lines = [line for line in block.replace("\\\n", " ").splitlines() if "|" not in line]
    port = str(free_port())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, module in (("ldp-aggregator", "aggregator.cli"), ("ldp-client", "client.cli")):
        wrapper = bin_dir / name
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
        wrapper.chmod(0o755)
    venv = tmp_path / ".venv" / "bin"  # the block activates the venv: here it adds the wrappers
    venv.mkdir(parents=True)
    (venv / "activate").write_text(f'PATH="{bin_dir}:$PATH"\n')
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "demo_survey.toml", tmp_path / "scripts")
    script = "\n".join(["set -e", *(line.replace("50051", port) for line in lines)])
    script += "\nkill %1\nwait\n"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "accepted 1" in done.stdout and "p-value" in done.stdout
    assert "Traceback" not in done.stderr


def test_config_reference_example_is_valid_and_its_cost_is_as_stated(tmp_path):
    """docs/config.md's worked example loads, and costs what the page says."""
    text = (REPO / "docs" / "config.md").read_text()
    example = re.search(r"```toml\n(.*?)```", text, re.DOTALL).group(1)
    path = tmp_path / "example.toml"
    path.write_text(example)
    survey = load_surveys(path)["wellbeing-2026"]
    assert [q.mechanism.name for q in survey.questions] == [
        "randomized_response",
        "flip_components",
        "gaussian",
        "laplace",
        "randomized_response",
    ]
    cost = survey_cost(survey.questions)
    assert cost.flags == "--budget 12.7566 --pointwise 7 --delta 1e-06"
    assert "--budget 12.7566 --pointwise 7" in text
