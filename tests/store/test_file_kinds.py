"""Files that know what they are: every SQLite file carries its kind and schema version, a wrong
file is refused in one line, read-only commands change nothing, new files are private; and
every CLI mistake of the newcomer study ends in one line on stderr with a non-zero exit."""

from __future__ import annotations

import hashlib
import signal
import socket
import sqlite3
import stat
import subprocess
from pathlib import Path

import pytest
from aggregator_process import spawn_serve
from cli_runner import run_cli, run_process

from aggregator.store.sqlite.schema import SCHEMA_VERSION
from client.device.filekind import DEVICE_REGISTRY, DEVICE_STATE, REPORT_STORE
from client.device.ledger import Budget, Ledger


def run(tool: str, *args: str) -> subprocess.CompletedProcess:
    return run_cli(tool, *args)  # in this process (tests/cli_runner.py)


def one_line(done: subprocess.CompletedProcess, fragment: str = "") -> str:
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # no gRPC C-core log lines either
    assert fragment in lines[0], lines[0]
    return lines[0]


def header(path: Path) -> tuple[int, int]:
    with sqlite3.connect(path) as conn:
        return (
            conn.execute("PRAGMA application_id").fetchone()[0],
            conn.execute("PRAGMA user_version").fetchone()[0],
        )


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    return {
        p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(folder.iterdir())
    }


@pytest.fixture
def files(tmp_path: Path, survey_file: Path):
    """A served store with one report, a device state and a registry, all closed."""
    db, state = tmp_path / "store" / "reports.sqlite", tmp_path / "device" / "device.sqlite"
    registry = tmp_path / "registry" / "devices.sqlite"
    for folder in (db.parent, state.parent, registry.parent):
        folder.mkdir()
    process, port = spawn_serve(
        tmp_path / "port", "--config", str(survey_file), "--db", str(db), "--insecure"
    )
    try:
        common = ["--server", f"127.0.0.1:{port}", "--insecure", "--state", str(state)]
        done = run("client", "submit", *common, "--budget", "100", "--survey", "big")
        assert done.returncode == 2  # --question and --answer are required: argparse, one line
        answer = ["--survey", "big", "--question", "rr64", "--answer", "c1"]
        done = run("client", "submit", *common, "--budget", "100", *answer)
        assert done.returncode == 0, done.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)
    key = registry.parent / "device.pub"
    assert run("client", "device-key", "--state", str(state), "--out", str(key)).returncode == 0
    enrolled = run("agg", "enroll", "--devices", str(registry), "--public-key", str(key))
    assert enrolled.returncode == 0, enrolled.stderr
    return db, state, registry


def test_every_file_carries_its_kind_and_is_private(files):
    db, state, registry = files
    assert header(db) == (REPORT_STORE.application_id, SCHEMA_VERSION)
    assert header(state) == (DEVICE_STATE.application_id, DEVICE_STATE.version)
    assert header(registry) == (DEVICE_REGISTRY.application_id, DEVICE_REGISTRY.version)
    for folder in (db.parent, state.parent, registry.parent):
        for path in folder.iterdir():
            if (
                path.suffix in (".sqlite", ".pem", ".sqlite-wal", ".sqlite-shm")
                or "secret" in path.name
            ):
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_wrong_kinds_are_refused_in_one_line(files, survey_file, tmp_path):
    db, state, registry = files
    question = ["--config", str(survey_file), "--survey", "big", "--question", "rr64"]
    one_line(
        run("agg", "estimate", *question, "--db", str(state)),
        "is a device state file, not a report store",
    )
    one_line(
        run("agg", "estimate", *question, "--db", str(registry)),
        "device registry file, not a report store",
    )
    one_line(
        run("client", "budget", "--state", str(db)), "is a report store file, not a device state"
    )
    submit = ["submit", "--server", "127.0.0.1:1", "--insecure", "--state", str(db)]
    one_line(
        run("client", *submit, "--survey", "big", "--question", "rr64", "--answer", "c1"),
        "report store file, not a device state",
    )
    one_line(run("agg", "devices", "--devices", str(state)), "not a device registry")
    serve = ["serve", "--config", str(survey_file), "--insecure", "--port", "0"]
    one_line(run("agg", *serve, "--db", str(state)), "not a report store")
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (x)")
    one_line(run("agg", "estimate", *question, "--db", str(other)), "another application")
    newer = tmp_path / "newer.sqlite"
    newer.write_bytes(db.read_bytes())
    with sqlite3.connect(newer) as conn:
        conn.execute("PRAGMA user_version = 7")
    one_line(run("agg", "estimate", *question, "--db", str(newer)), "schema version 7")


def test_read_only_commands_change_nothing(files, survey_file, tmp_path):
    db, state, registry = files
    before = {f: snapshot(f) for f in (db.parent, state.parent, registry.parent)}
    question = [
        "--config",
        str(survey_file),
        "--db",
        str(db),
        "--survey",
        "big",
        "--question",
        "rr64",
    ]
    assert run("agg", "estimate", *question).returncode == 0
    assert run("agg", "test", *question, "gof", "--p0", ",".join(["0.125"] * 8)).returncode == 0
    assert (
        run(
            "agg",
            "export",
            "--config",
            str(survey_file),
            "--db",
            str(db),
            "--survey",
            "big",
            "--out",
            str(tmp_path / "out"),
        ).returncode
        == 0
    )
    assert run("agg", "check-config", str(survey_file), "--db", str(db)).returncode == 0
    assert run("client", "budget", "--state", str(state)).returncode == 0
    assert run("agg", "devices", "--devices", str(registry)).returncode == 0
    assert {f: snapshot(f) for f in before} == before  # no byte, no mtime, no -wal/-shm
    missing = tmp_path / "missing.sqlite"
    one_line(
        run("agg", "estimate", *question[:2], "--db", str(missing), *question[4:]), "not found"
    )
    assert not missing.exists()


def test_legacy_device_state_is_recognized_and_upgraded(tmp_path):
    """A device state file from before the kinds (application_id 0, no digest column)."""
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(
            "CREATE TABLE ledger_budget (id INTEGER PRIMARY KEY, epsilon REAL, delta REAL,"
            " pointwise REAL, enrolled_at REAL);"
            "INSERT INTO ledger_budget VALUES (1, 3.0, 1e-6, 3.0, 0);"
            "CREATE TABLE outbox (sequence INTEGER PRIMARY KEY AUTOINCREMENT, report_id BLOB"
            " NOT NULL UNIQUE, survey_id TEXT NOT NULL, question_id TEXT NOT NULL, payload BLOB"
            " NOT NULL, created_at REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0);"
        )
    with Ledger(path) as ledger:
        assert ledger.budget == Budget(3.0)
    from client.device.outbox import Outbox

    with Outbox(path) as outbox:
        outbox.add(b"r" * 16, "s", "q", b"p", definition_digest=b"d" * 32)
        assert outbox.pending()[0].definition_digest == b"d" * 32
    assert header(path) == (DEVICE_STATE.application_id, DEVICE_STATE.version)


def test_cli_mistakes_of_the_study_end_in_one_line(tmp_path, survey_file):
    config = ["--config", str(survey_file)]
    question = ["--survey", "big", "--question", "rr64"]
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"not a database at all " * 400)
    folder = tmp_path / "a-folder"
    folder.mkdir()
    nowhere = tmp_path / "no-such-folder" / "reports.sqlite"
    serve = ["serve", *config, "--insecure"]
    one_line(
        run("agg", "estimate", *config, "--db", str(corrupt), *question),
        "not a usable report store",
    )
    one_line(run("agg", "estimate", *config, "--db", str(folder), *question), "is not a file")
    one_line(run("agg", *serve, "--db", str(corrupt), "--port", "0"), "report store")
    one_line(run("agg", *serve, "--db", str(folder), "--port", "0"), "directory")
    one_line(run("agg", *serve, "--db", str(nowhere), "--port", "0"), "does not exist")
    one_line(run("agg", *serve, "--db", str(tmp_path / "r.sqlite"), "--port", "70000"), "65535")
    one_line(run("agg", *serve, "--db", str(tmp_path / "r.sqlite"), "--port", "-1"), "65535")
    one_line(
        run_process(
            "agg",
            *serve,
            "--db",
            str(tmp_path / "r.sqlite"),
            "--port",
            "0",
            "--host",
            "203.0.113.7",
        ),
        "cannot listen",
    )
    with socket.socket() as busy:  # real processes: no gRPC C-core line on stderr either
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        db = str(tmp_path / "r.sqlite")
        one_line(run_process("agg", *serve, "--db", db, "--port", port), "in use")
        one_line(run_process("agg", *serve, "--db", db, "--port", port, "--workers", "2"), "in use")
    state = ["--state", str(corrupt)]
    one_line(run("client", "budget", *state), "not a usable device state")
    submit = ["submit", "--server", "127.0.0.1:1", "--insecure", "--timeout", "1", *question]
    one_line(
        run("client", *submit, "--state", str(folder), "--answer", "c1", "--budget", "5"),
        "directory",
    )
    one_line(
        run("client", *submit, "--state", str(nowhere), "--answer", "c1", "--budget", "5"),
        "does not exist",
    )
    one_line(
        run(
            "client",
            *submit[:2],
            "127.0.0.1:70000",
            *submit[3:],
            "--state",
            str(tmp_path / "d.sqlite"),
            "--answer",
            "c1",
        ),
        "65535",
    )
    # --json errors are JSON
    done = run("agg", "estimate", *config, "--db", str(corrupt), *question, "--json")
    import json

    assert json.loads(one_line(done))["status"] == 2
