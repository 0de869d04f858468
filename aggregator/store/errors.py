"""The report store's errors, the same on every engine: what the service maps to status codes
and the CLI to messages, whichever engine refused."""

from __future__ import annotations

from aggregator.errors import LdpError


class StoreError(LdpError):
    """The store refused an operation: closed, unknown question, malformed report, failed commit."""


class StoreUnavailableError(StoreError):
    """The store's writer is gone (a crashed writer process): nothing was acknowledged, and a
    retry against a restarted server is safe."""


class ConfirmationClosedError(StoreError):
    """A confirmation-side report of a survey whose confirmatory results are sealed."""


class StoreFailedError(StoreUnavailableError):
    """The store can no longer make reports durable (disk full, read-only, I/O error, its files
    deleted or replaced; for SQLite see sqlite/integrity.py). It acknowledges nothing more until
    restarted; everything acknowledged before is durable."""
