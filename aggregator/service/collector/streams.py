"""Limits of one client-streaming upload (``UploadStream``): messages, reports, bytes, duration and
rejected reports per stream, and gRPC's connection-level limits.

Why: a stream that never closes could otherwise keep a handler, its results and (for signed
streams) its reports for as long as the client likes. Every limit is checked as a message arrives,
on its raw bytes, before it is parsed; passing one ends the call with RESOURCE_EXHAUSTED (size
limits, no retry hint: split the stream) or DEADLINE_EXCEEDED (duration). Reports of earlier
messages may be stored by then; resending them is safe (they come back DUPLICATE).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from aggregator.errors import LdpError


class StreamLimitError(LdpError):
    """A stream passed one of its limits; ``deadline`` says it was the duration."""

    def __init__(self, message: str, *, deadline: bool = False) -> None:
        super().__init__(message)
        self.deadline = deadline


@dataclass(frozen=True)
class StreamLimits:
    """Per-stream bounds (defaults in docs/limits.md). ``max_rejected`` bounds the REJECTED
    results a response lists; a stream with more invalid reports is refused."""

    max_messages: int = 1_000
    max_reports: int = 100_000
    max_bytes: int = 64 * 1024 * 1024
    max_seconds: float = 60.0
    max_rejected: int = 10_000

    def __post_init__(self) -> None:
        for name in ("max_messages", "max_reports", "max_bytes", "max_seconds", "max_rejected"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")


@dataclass
class StreamBudget:
    """What one stream has used so far, against its limits."""

    limits: StreamLimits
    clock: Callable[[], float] = time.monotonic
    messages: int = 0
    reports: int = 0
    size: int = 0
    rejected: int = 0

    def __post_init__(self) -> None:
        self.deadline = self.clock() + self.limits.max_seconds

    def remaining(self) -> float:
        """Seconds left before the stream's duration limit (at least 0)."""
        return max(0.0, self.deadline - self.clock())

    def expired(self) -> StreamLimitError:
        return StreamLimitError(
            f"the stream stayed open longer than {self.limits.max_seconds:g} s", deadline=True
        )

    def take(self, size: int, reports: int) -> None:
        """Charge one message of ``size`` bytes and ``reports`` reports, or raise."""
        self.messages += 1
        self.reports += reports
        self.size += size
        limits = self.limits
        if self.messages > limits.max_messages:
            raise StreamLimitError(f"at most {limits.max_messages} messages per stream")
        if self.reports > limits.max_reports:
            raise StreamLimitError(f"at most {limits.max_reports} reports per stream")
        if self.size > limits.max_bytes:
            raise StreamLimitError(f"at most {limits.max_bytes} bytes per stream")
        if self.remaining() <= 0:
            raise self.expired()

    def reject(self, count: int) -> None:
        """Count ``count`` more REJECTED reports, or raise past ``max_rejected``."""
        self.rejected += count
        if self.rejected > self.limits.max_rejected:
            raise StreamLimitError(
                f"more than {self.limits.max_rejected} invalid reports in one stream"
            )


@dataclass(frozen=True)
class ConnectionLimits:
    """gRPC server options that bound connections: concurrent streams per connection, idle
    and total age of a connection, and keepalive pings a client may send."""

    max_concurrent_streams: int = 100
    max_connection_idle_seconds: float = 60.0
    max_connection_age_seconds: float = 600.0
    max_connection_age_grace_seconds: float = 30.0
    min_ping_interval_seconds: float = 60.0

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")

    def options(self) -> list[tuple[str, int]]:
        """The grpc channel arguments that enforce these limits."""
        ms = 1000
        return [
            ("grpc.max_concurrent_streams", self.max_concurrent_streams),
            ("grpc.max_connection_idle_ms", int(self.max_connection_idle_seconds * ms)),
            ("grpc.max_connection_age_ms", int(self.max_connection_age_seconds * ms)),
            ("grpc.max_connection_age_grace_ms", int(self.max_connection_age_grace_seconds * ms)),
            # Keepalive enforcement: a client pinging more often than this is sent GOAWAY.
            (
                "grpc.http2.min_ping_interval_without_data_ms",
                int(self.min_ping_interval_seconds * ms),
            ),
            ("grpc.http2.max_ping_strikes", 2),
            # The server checks its peers too: a dead connection is closed after a ping timeout.
            ("grpc.keepalive_time_ms", 120 * ms),
            ("grpc.keepalive_timeout_ms", 20 * ms),
        ]
