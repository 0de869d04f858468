"""Connections to the shared PostgreSQL store: a connection in autocommit mode (transactions
are explicit), the database's URL without its password for messages, and what the modules
that keep the Analyst's state (analysis.py, confirm.py) need of a store: a reader's transaction
(PostgresStore.transaction, engine.py)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import psycopg

from aggregator.store.errors import StoreUnavailableError


class Transactions(Protocol):
    """A store that lends its readers a connection inside one transaction (PostgresStore)."""

    def transaction(self) -> AbstractContextManager[psycopg.Connection]: ...


def redacted(url: str) -> str:
    """``url`` without its password, for messages and ``path``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def connect(url: str) -> psycopg.Connection:
    """A connection in autocommit mode (transactions are explicit), or StoreUnavailableError."""
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise StoreUnavailableError(
            f"cannot reach the PostgreSQL store {redacted(url)}: {exc}"
        ) from None
