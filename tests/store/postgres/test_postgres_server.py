"""The PostgreSQL test server's rule (tests/postgres_server.py): without PostgreSQL the tests
that need it are skipped locally, and fail where LDP_REQUIRE_POSTGRES=1 (what .ci/run sets)."""

from __future__ import annotations

from pathlib import Path

import pytest
from postgres_server import REQUIRE_ENV, unavailable

REPO = Path(__file__).resolve().parents[3]


def test_missing_postgres_skips_locally(monkeypatch) -> None:
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no initdb"):
        unavailable("no initdb")


def test_missing_postgres_fails_where_it_is_required(monkeypatch) -> None:
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="required"):
        unavailable("no initdb")


def test_ci_installs_postgres_and_requires_it() -> None:
    ci = (REPO / ".ci/run").read_text()
    assert "postgresql" in ci.split("apt-get install", 1)[1].splitlines()[0]
    assert f"export {REQUIRE_ENV}=1" in ci
    assert "postgres]" in ci and "postgres]" in (REPO / "scripts/test.sh").read_text()
