"""Progress on long work: a bar on a terminal (a real pseudo-terminal), and not one byte of it on
a pipe or with --json. The commands run as real processes against a real server and store."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from conftest import ServerThread

from client.cli.progress import bar, shown

REPO = Path(__file__).resolve().parents[2]
BAR = "%|"  # the bar: "simulate:  40%|████      | 4.00k/10.0k reports [...]"


def on_terminal(argv: list[str], timeout: float = 180) -> tuple[int, str, str]:
    """Run ``argv`` with stderr on a pseudo-terminal (120 columns) and stdout on a pipe; its exit
    status, stdout, and everything it drew on the terminal."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, cwd=REPO
    )
    os.close(slave)
    drawn = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer of the terminal has gone
            break
        if not chunk:
            break
        drawn += chunk
    os.close(master)
    out = process.stdout.read().decode()
    process.stdout.close()
    return process.wait(timeout=timeout), out, drawn.decode(errors="replace")


def on_pipe(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=REPO)


def agg(*args: str) -> list[str]:
    return [sys.executable, "-m", "aggregator.cli", *args]


def client(*args: str) -> list[str]:
    return [sys.executable, "-m", "client.cli", *args]


@pytest.fixture(scope="module")
def filled_store(tmp_path_factory):
    """A store filled by three simulate runs of 2,000 devices of survey s1 (10,000 reports each:
    on a terminal, on a pipe, with --json), the server stopped; and what each run showed."""
    from conftest import SURVEYS_TOML

    root = tmp_path_factory.mktemp("progress")
    config = root / "surveys.toml"
    config.write_text(SURVEYS_TOML)
    server = ServerThread(config, root / "reports.sqlite").start()
    try:
        simulate = client(
            "simulate", "--server", server.target, "--insecure", "--survey", "s1",
            "--devices", "2000", "--batch", "500", "--seed", "1",
        )  # fmt: skip
        terminal = on_terminal(simulate)
        piped = on_pipe(simulate)
        quiet = on_terminal([*simulate, "--json"])
    finally:
        server.stop()
    return config, server.db, {"terminal": terminal, "piped": piped, "json": quiet}


@pytest.mark.slow
def test_simulate_shows_progress_on_a_terminal_only(filled_store):
    _, _, runs = filled_store
    status, out, drawn = runs["terminal"]
    assert status == 0, drawn
    assert "simulate:" in drawn and BAR in drawn and "10.0k" in drawn, drawn
    assert "10000 reports" in out and BAR not in out  # the summary stays on stdout, bar-free
    piped = runs["piped"]
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    assert "10000 reports" in piped.stdout
    status, out, drawn = runs["json"]
    assert status == 0 and drawn == "", drawn
    assert json.loads(out)["accepted"] == 10000


@pytest.mark.slow
def test_rebuild_shows_progress_on_a_terminal_only(filled_store):
    config, db, _ = filled_store
    command = agg("rebuild", "--config", str(config), "--db", str(db))
    status, out, drawn = on_terminal(command)
    assert status == 0 and "rebuild:" in drawn and BAR in drawn, drawn
    assert "s1/rr: n = 6000, statistics matches" in out
    status, out, drawn = on_terminal([*command, "--json"])
    assert status == 0 and drawn == "" and len(json.loads(out)) == 6
    piped = on_pipe(command)
    assert piped.returncode == 0 and piped.stderr == ""


@pytest.mark.slow
def test_export_and_job_show_progress_on_a_terminal_only(filled_store, tmp_path):
    config, db, _ = filled_store
    export = agg("export", "--config", str(config), "--db", str(db), "--survey", "s1")
    status, out, drawn = on_terminal([*export, "--out", str(tmp_path / "a")])
    assert status == 0 and "export:" in drawn and BAR in drawn, drawn
    assert "exported 30000 reports" in out
    piped = on_pipe([*export, "--out", str(tmp_path / "b")])
    assert piped.returncode == 0 and piped.stderr == "" and "exported 30000" in piped.stdout

    pytest.importorskip("apache_beam")
    job = agg("job", "--config", str(config), "--shards", str(tmp_path / "a"))
    status, out, drawn = on_terminal([*job, "--out", str(tmp_path / "a.json")])
    assert status == 0 and "job:" in drawn and "4/4 shards read" in drawn and BAR in drawn, drawn
    assert "s1/rr: n = 6000, released" in out
    piped = on_pipe([*job, "--out", str(tmp_path / "b.json")])
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr


@pytest.mark.slow
def test_a_script_shows_progress_on_a_terminal_only():
    command = [
        sys.executable, "scripts/privacy_audit.py", "--trials", "300", "--additive-trials", "300",
    ]  # fmt: skip
    status, out, drawn = on_terminal(command)
    assert status == 0 and "audit:" in drawn and BAR in drawn, drawn
    assert sum(line.startswith("| ") for line in out.splitlines()) == 10  # header, 9 mechanisms
    piped = on_pipe(command)
    assert piped.returncode == 0 and piped.stderr == "" and piped.stdout == out


def test_the_helper_draws_nothing_off_a_terminal(capsys):
    """In-process: stderr captured (not a terminal) or quiet -> a silent bar; write() still
    prints its line on stdout."""
    assert not shown() and not shown(quiet=True)
    with bar(10, "x") as progress:
        progress.update(5)
        progress.write("a line")
    captured = capsys.readouterr()
    assert captured.out == "a line\n" and captured.err == ""


def test_client_commands_do_not_load_tqdm_until_a_bar_is_shown():
    """The device's commands stay light: tqdm is imported only to draw a bar."""
    code = (
        "import sys, client.cli.main, client.cli.progress\n"
        "client.cli.progress.bar(3, 'x').close()\n"
        "print('tqdm' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.stdout.strip() == "False", done.stderr


def test_a_device_without_tqdm_runs_without_a_bar(monkeypatch, capsys):
    """tqdm comes with the aggregator extra only: on a terminal with tqdm not importable, the
    helper returns the silent bar instead of failing (a device install has no tqdm)."""
    import client.cli.progress as progress_module

    monkeypatch.setitem(sys.modules, "tqdm", None)  # makes `from tqdm import tqdm` raise
    monkeypatch.setattr(progress_module, "shown", lambda quiet=False, stream=None: True)
    with progress_module.bar(10, "x") as progress:
        progress.update(5)
        progress.write("a line")
    assert capsys.readouterr().out == "a line\n"
