"""One store, one server: a second server or worker group on the same database refuses to start,
and so does a worker group on a port another group already serves (real processes)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from aggregator_process import spawn_serve

from aggregator.store.sqlite.lock import StoreInUseError, StoreLock


def serve(config: Path, db: Path, *options: str) -> subprocess.CompletedProcess:
    """``serve`` that is expected to fail at start (bounded by a timeout)."""
    command = [sys.executable, "-m", "aggregator.cli", "serve", "--insecure"]
    command += ["--config", str(config), "--db", str(db), *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def one_line_failure(result: subprocess.CompletedProcess, needle: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr


@pytest.fixture
def running(survey_file, tmp_path):
    started: list[subprocess.Popen] = []

    def start(db: Path, *options: str) -> int:
        process, port = spawn_serve(
            tmp_path / f"port{len(started)}",
            *("--insecure", "--config", str(survey_file), "--db", str(db), *options),
            timeout=90,
        )
        started.append(process)
        return port

    yield start
    for process in started:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def test_the_lock_is_exclusive_and_released(tmp_path):
    db = tmp_path / "reports.sqlite"
    lock = StoreLock(db)
    with pytest.raises(StoreInUseError, match="another aggregator is serving"):
        StoreLock(db)
    lock.release()
    StoreLock(db).release()
    assert oct(Path(lock.path).stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("second", [(), ("--workers", "2")])
def test_a_second_server_on_one_store_refuses_to_start(running, survey_file, tmp_path, second):
    db = tmp_path / "reports.sqlite"
    running(db)
    result = serve(survey_file, db, "--port", "0", *second)
    one_line_failure(result, "another aggregator is serving")


def test_a_second_worker_group_on_one_port_refuses_to_start(running, survey_file, tmp_path):
    port = running(tmp_path / "first.sqlite", "--workers", "2")
    result = serve(survey_file, tmp_path / "second.sqlite", "--port", str(port), "--workers", "2")
    one_line_failure(result, "is in use: another program serves it")
    result = serve(survey_file, tmp_path / "third.sqlite", "--port", str(port))
    one_line_failure(result, "is in use: another program serves it")
