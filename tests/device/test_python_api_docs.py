"""docs/device-python.md, run as written: its survey file and frame are served by a real
aggregator on loopback with a real SQLite store (a second one with mTLS from
``scripts/gen_pki.py`` for the TLS example), and each of its ``python`` blocks runs in a fresh
namespace in the folder holding them. The examples assert what they promise; the store is then
checked to hold exactly the reports each one sent."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from aggregator_process import free_port
from cli_runner import run_cli
from conftest import ServerThread

from aggregator.service.server.tls import server_credentials
from aggregator.store.sqlite import design_statistics
from aggregator.store.sqlite.reader import StoreReader

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "device-python.md"
#: The addresses the examples use, and what the test serves in their place.
SERVER, NO_SIGNAL = "localhost:50051", "localhost:59999"
#: The shell commands the doc shows, which the fixture below does in their stead.
COMMANDS = (
    "ldp-aggregator serve --config surveys.toml --db reports.sqlite --insecure",
    "ldp-aggregator export-survey --config surveys.toml --survey wellbeing --out wellbeing.json",
    "python scripts/gen_pki.py --out pki",
    "--tls-cert pki/server.pem --tls-key pki/server.key --client-ca pki/ca.pem",
)


def blocks() -> dict[str, list[tuple[str, int, str]]]:
    """Per section title (## heading) its fenced blocks: (language, first line, text)."""
    out: dict[str, list[tuple[str, int, str]]] = {}
    title, fence, start, lines = "", None, 0, []
    for number, line in enumerate(DOC.read_text().splitlines(), start=1):
        if fence is None and line.startswith("## "):
            title = line[3:].strip()
        elif fence is None and line.startswith("```"):
            fence, start, lines = line[3:].strip(), number + 1, []
        elif fence is not None and line.startswith("```"):
            out.setdefault(title, []).append((fence, start, "\n".join(lines) + "\n"))
            fence = None
        elif fence is not None:
            lines.append(line)
    return out


def only(section: str, language: str) -> tuple[int, str]:
    found = [(start, text) for lang, start, text in blocks()[section] if lang == language]
    assert len(found) == 1, f"{section}: expected one {language} block"
    return found[0]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """The doc's surveys.toml and frame.csv, served plain and with mTLS; (folder, plain, tls)."""
    folder = tmp_path_factory.mktemp("device-python")
    (folder / "surveys.toml").write_text(only("The survey the examples answer", "toml")[1])
    (folder / "frame.csv").write_text(only("The survey the examples answer", "csv")[1])
    config = folder / "surveys.toml"
    run_cli(
        "agg",
        *("export-survey", "--config", config, "--survey", "wellbeing"),
        *("--out", folder / "wellbeing.json"),
        check=True,
    )
    pki = folder / "pki"
    script = REPO / "scripts" / "gen_pki.py"
    subprocess.run([sys.executable, script, "--out", pki], check=True, capture_output=True)
    credentials = server_credentials(pki / "server.pem", pki / "server.key", pki / "ca.pem")
    plain = ServerThread(config, folder / "reports.sqlite").start()
    tls = ServerThread(config, folder / "reports-tls.sqlite", credentials=credentials).start()
    yield folder, plain, tls
    plain.stop()
    tls.stop()


def run_example(section: str, target: ServerThread) -> None:
    """The section's python block, with the doc's addresses pointed at the test's servers."""
    start, code = only(section, "python")
    code = code.replace(SERVER, f"localhost:{target.port}")
    code = code.replace(NO_SIGNAL, f"localhost:{free_port()}")
    padded = "\n" * (start - 1) + code  # tracebacks name the doc's own line numbers
    exec(compile(padded, str(DOC), "exec"), {"__name__": "__device_python_doc__"})


def reports(server: ServerThread, survey: str, question: str) -> int:
    with StoreReader(server.db) as reader:
        return reader.statistics(survey, question, 3)[0]


def test_the_doc_shows_the_commands_the_test_runs():
    text = re.sub(r"\\\n\s*", "", DOC.read_text())
    for command in COMMANDS:
        assert command in text
    assert set(blocks()) >= {
        "One answer",
        "A household",
        "A design key",
        "Offline, then flush",
        "TLS",
    }


def test_one_answer(deployment, monkeypatch):
    folder, plain, _ = deployment
    monkeypatch.chdir(folder)
    run_example("One answer", plain)
    assert reports(plain, "wellbeing", "mood") == 1


def test_a_household(deployment, monkeypatch):
    folder, plain, _ = deployment
    monkeypatch.chdir(folder)
    run_example("A household", plain)
    assert reports(plain, "home", "dwelling") == 1


def test_a_design_key(deployment, monkeypatch):
    folder, plain, _ = deployment
    monkeypatch.chdir(folder)
    run_example("A design key", plain)
    with closing(sqlite3.connect(plain.db)) as conn:
        for question in ("water", "fuel"):
            stats = design_statistics.read(conn, "field", question)
            assert [(stat.group, stat.key, stat.n) for stat in stats] == [("north", "north-v02", 1)]


def test_offline_then_flush(deployment, monkeypatch):
    folder, plain, _ = deployment
    monkeypatch.chdir(folder)
    run_example("Offline, then flush", plain)
    assert reports(plain, "wellbeing", "sleep") == 1


def test_tls(deployment, monkeypatch):
    folder, _, tls = deployment
    monkeypatch.chdir(folder)
    run_example("TLS", tls)
    assert reports(tls, "wellbeing", "mood") == 1
