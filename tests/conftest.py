"""Shared fixtures: a real aggregator (grpc.aio on an ephemeral loopback port, SQLite file)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from aggregator.config import load_limits, load_surveys
from aggregator.server import RunningServer, start_server

SURVEYS_TOML = """
[[survey]]
id = "s1"
title = "test survey"
min_batch_size = 5

[[survey.question]]
id = "rr"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.question]]
id = "fc"
categories = ["a", "b", "c", "d", "e"]
mechanism = "flip_components"
epsilon = 1.0

[[survey.question]]
id = "gauss"
categories = ["a", "b", "c", "d"]
mechanism = "gaussian"
rho = 0.5

[[survey.question]]
id = "lap"
categories = ["a", "b", "c", "d"]
mechanism = "laplace"
epsilon = 1.0

[[survey.question]]
id = "joint"
mechanism = "randomized_response"
epsilon = 2.0
attributes = [
    { name = "x", categories = ["x0", "x1"] },
    { name = "y", categories = ["y0", "y1", "y2"] },
]

[[survey]]
id = "big"
title = "no release threshold"
min_batch_size = 1

[[survey.question]]
id = "rr64"
categories = ["c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7"]
mechanism = "randomized_response"
epsilon = 50.0
"""


class ServerThread:
    """An aggregator running in its own thread and event loop, restartable on the same store."""

    def __init__(self, config: Path, db: Path, **options) -> None:
        """``options`` go to start_server (e.g. max_inflight_reports); the survey file's
        per-device limits always apply."""
        self.config, self.db = config, db
        self.surveys = load_surveys(config)
        self.options = {"limits": load_limits(config), **options}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: RunningServer | None = None
        self.port = 0

    def start(self, port: int = 0) -> ServerThread:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._running = self._loop.run_until_complete(
                start_server(self.surveys, str(self.db), f"127.0.0.1:{port}", **self.options)
            )
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        assert ready.wait(10), "server did not start"
        self.port = self._running.port
        return self

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self, grace: float = 2.0) -> None:
        if self._running is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._running.stop(grace), self._loop)
        future.result(timeout=grace + 10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
        self._running = None


@pytest.fixture
def survey_file(tmp_path: Path) -> Path:
    path = tmp_path / "surveys.toml"
    path.write_text(SURVEYS_TOML)
    return path


@pytest.fixture
def server(tmp_path: Path, survey_file: Path):
    running = ServerThread(survey_file, tmp_path / "reports.sqlite").start()
    yield running
    running.stop()
