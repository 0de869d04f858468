"""Shared fixtures: a real aggregator (grpc.aio on an ephemeral loopback port, SQLite file), and a
PKI built at run time (never committed)."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography.x509.oid import ExtendedKeyUsageOID

from aggregator.service.server import pki as pki_builder
from aggregator.service.server.app import RunningServer, start_server
from aggregator.survey_file.config import load_limits, load_surveys

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

    def __init__(self, config: Path, db: Path, **options: Any) -> None:
        """``options`` go to start_server (e.g. credentials, max_inflight_reports); the survey
        file's per-device limits always apply."""
        self.config, self.db = config, db
        self.surveys = load_surveys(config)
        self.options = {"limits": load_limits(config), **options}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: RunningServer | None = None
        self.port = 0
        self.analyst_port = 0  # the Analyst's own listener (loopback)

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
        self.analyst_port = self._running.analyst_port
        return self

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def analyst_target(self) -> str:
        return f"127.0.0.1:{self.analyst_port}"

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


class PkiFiles:
    """Certificates and keys written by the ``pki`` fixture: ``cert(name)``, ``key(name)``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def cert(self, name: str) -> Path:
        return self.root / f"{name}.pem"

    def key(self, name: str) -> Path:
        return self.root / f"{name}.key"


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> PkiFiles:
    """A CA with a server and a good device, plus everything a server must refuse: a device of a
    foreign CA, an expired device certificate, and certificates with the wrong key usage."""
    files = PkiFiles(tmp_path_factory.mktemp("pki"))
    ca = pki_builder.new_ca(days=1)
    foreign = pki_builder.new_ca("foreign CA", days=1)
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=3)
    issued = {
        "ca": ca,
        "foreign-ca": foreign,
        "server": pki_builder.issue_server(ca, days=1),
        "foreign-server": pki_builder.issue_server(foreign, days=1),
        "device": pki_builder.issue_device(ca, "device-0001", days=1),
        "foreign-device": pki_builder.issue_device(foreign, "device-0001", days=1),
        "expired-device": pki_builder.issue_device(ca, "device-0002", days=1, not_before=long_ago),
        "server-eku-device": pki_builder.issue_device(
            ca, "device-0003", days=1, usages=[ExtendedKeyUsageOID.SERVER_AUTH]
        ),
        "codesign-eku-device": pki_builder.issue_device(
            ca, "device-0004", days=1, usages=[ExtendedKeyUsageOID.CODE_SIGNING]
        ),
    }
    for name, item in issued.items():
        item.write(files.cert(name), files.key(name))
    return files


@pytest.fixture(scope="session")
def postgres():
    """A throwaway PostgreSQL server for the session (tests/postgres_server.py): skipped where
    PostgreSQL is missing, a failure instead when LDP_REQUIRE_POSTGRES=1 (CI)."""
    from postgres_server import start_postgres

    server = start_postgres()
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres) -> str:
    """The URL of a fresh, empty database on the session's PostgreSQL server."""
    return postgres.new_database()
