"""A throwaway PostgreSQL server for the tests: ``initdb`` into a temporary directory, then
``postgres`` listening only on a Unix socket in that directory (no TCP at all), stopped and
removed at the end of the session.

initdb and postgres refuse to run as root. Run as root (CI containers), the temporary directory
is handed to the ``postgres`` system user that Debian's ``postgresql`` package creates, and both
run as that user (``subprocess``'s ``user=``, so the server is this process's own child and is
stopped by its pid); root's tests connect through the socket. Run as anyone else, they run as
that user.

Where the binaries are missing the tests that need the server are skipped, unless
``LDP_REQUIRE_POSTGRES=1`` (set by ``.ci/run``): then the missing server fails them."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

REQUIRE_ENV = "LDP_REQUIRE_POSTGRES"
START_SECONDS = 30.0


def binaries() -> Path | None:
    """The newest PostgreSQL server bin directory (Debian's layout, or initdb on PATH)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def unavailable(reason: str) -> None:
    """Skip the test for want of PostgreSQL, or fail it when CI requires PostgreSQL."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"PostgreSQL is required ({REQUIRE_ENV}=1) but {reason}")
    pytest.skip(f"PostgreSQL is not available: {reason}")


class PostgresServer:
    """One server in its own temporary directory; :attr:`url` reaches its ``postgres``
    database over the Unix socket. ``fsync`` off (the tests) keeps commits durable against a
    killed process, not against a power loss, and makes creating databases cheap; the
    benchmark turns it on."""

    def __init__(self, bindir: Path, *, fsync: bool = False) -> None:
        self.bindir = bindir
        self.fsync = fsync
        self.root = Path(tempfile.mkdtemp(prefix="ldp-pg-"))
        self.data = self.root / "data"
        self.process: subprocess.Popen | None = None
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self._as: dict = {"cwd": self.root}
        if os.getuid() == 0:
            self.user = "postgres"
            self._as |= {"user": "postgres", "group": "postgres", "extra_groups": []}
            shutil.chown(self.root, "postgres", "postgres")

    @property
    def url(self) -> str:
        return self.database_url("postgres")

    def database_url(self, name: str) -> str:
        return f"postgresql:///{name}?host={self.root}&user={self.user}"

    def start(self) -> None:
        initdb = [str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U"]
        subprocess.run(
            [*initdb, self.user, "-E", "UTF8", "--no-sync"],
            check=True,
            capture_output=True,
            **self._as,
        )
        options = [
            "-D", str(self.data), "-k", str(self.root), "-c", "listen_addresses=",
            "-c", "max_connections=200", "-c", f"fsync={'on' if self.fsync else 'off'}",
        ]  # fmt: skip
        self.process = subprocess.Popen(
            [str(self.bindir / "postgres"), *options],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "server.log", "wb"),  # noqa: SIM115 (the child keeps it)
            **self._as,
        )
        deadline = time.monotonic() + START_SECONDS
        while not (self.root / ".s.PGSQL.5432").exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = (self.root / "server.log").read_text(errors="replace")
                self.stop()
                raise RuntimeError(f"PostgreSQL did not start: {log[-2000:]}")
            time.sleep(0.05)
        self._wait_ready(deadline)

    def _wait_ready(self, deadline: float) -> None:
        import psycopg

        while True:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def new_database(self) -> str:
        """A fresh empty database; its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.database_url(name)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)  # immediate: the directory is thrown away
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def start_postgres() -> PostgresServer:
    """A started server, or skip/fail (see :func:`unavailable`)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        unavailable("psycopg is not installed (pip install -e '.[postgres]')")
    bindir = binaries()
    if bindir is None:
        unavailable("no initdb (apt-get install postgresql)")
    assert bindir is not None
    server = PostgresServer(bindir)
    try:
        server.start()
    except (OSError, subprocess.CalledProcessError, RuntimeError) as exc:
        unavailable(f"the server did not start: {exc}")
    return server
