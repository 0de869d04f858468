"""Prometheus metrics for operators (the optional ``[metrics]`` extra, off unless ``serve
--metrics-port``): uploads and reports by outcome, RPC latency, commit latency and group size, and
reports stored per question. Counts and durations only: no device identity, no report content.

With ``--workers N`` every process records into prometheus-client's multiprocess directory
(``PROMETHEUS_MULTIPROC_DIR``, set by the parent before any worker starts) and the parent's
exporter sums them.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Protocol

EXTRA_HINT = "metrics need prometheus-client: pip install 'ldp-survey[metrics]'"
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
GROUP_BUCKETS = (1, 10, 100, 1_000, 5_000, 10_000, 50_000, 100_000)


class MetricsUnavailableError(RuntimeError):
    """``--metrics-port`` was given but prometheus-client is not installed."""


class Recorder(Protocol):
    """What the service records; :class:`NoMetrics` when metrics are off."""

    def upload(self, rpc: str, code: str, seconds: float) -> None: ...

    def reports(self, outcome: str, count: int) -> None: ...

    def commit(self, seconds: float, reports: int) -> None: ...

    def stored(self, survey_id: str, question_id: str, count: int) -> None: ...


class NoMetrics:
    """Metrics off: every record is a no-op."""

    def upload(self, rpc: str, code: str, seconds: float) -> None:
        pass

    def reports(self, outcome: str, count: int) -> None:
        pass

    def commit(self, seconds: float, reports: int) -> None:
        pass

    def stored(self, survey_id: str, question_id: str, count: int) -> None:
        pass


class PrometheusMetrics:
    """The service's metrics on prometheus-client (its default registry, so the multiprocess
    collector of the exporter sees them)."""

    def __init__(self) -> None:
        try:
            from prometheus_client import Counter, Histogram
        except ImportError:
            raise MetricsUnavailableError(EXTRA_HINT) from None
        self._uploads = Counter(
            "ldp_uploads", "Upload and UploadStream calls by final status code", ["rpc", "code"]
        )
        self._latency = Histogram(
            "ldp_upload_duration_seconds",
            "Time from receiving an upload to answering it",
            ["rpc"],
            buckets=LATENCY_BUCKETS,
        )
        self._reports = Counter(
            "ldp_reports",
            "Reports by outcome: accepted, duplicate, conflict, rejected (invalid), refused "
            "(limits, authentication) and shed (overload)",
            ["outcome"],
        )
        self._commit = Histogram(
            "ldp_commit_duration_seconds", "One store transaction", buckets=LATENCY_BUCKETS
        )
        self._group = Histogram(
            "ldp_commit_group_reports", "Reports written by one transaction", buckets=GROUP_BUCKETS
        )
        self._stored = Counter(
            "ldp_reports_stored", "New reports stored, per question", ["survey", "question"]
        )

    def upload(self, rpc: str, code: str, seconds: float) -> None:
        self._uploads.labels(rpc, code).inc()
        self._latency.labels(rpc).observe(seconds)

    def reports(self, outcome: str, count: int) -> None:
        if count:
            self._reports.labels(outcome).inc(count)

    def commit(self, seconds: float, reports: int) -> None:
        self._commit.observe(seconds)
        self._group.observe(reports)

    def stored(self, survey_id: str, question_id: str, count: int) -> None:
        if count:
            self._stored.labels(survey_id, question_id).inc(count)


def prepare_multiprocess() -> Path:
    """Before any worker is spawned (and before prometheus-client is imported here): a fresh
    directory where every process writes its samples."""
    directory = Path(tempfile.mkdtemp(prefix="ldp-metrics-"))
    os.environ[MULTIPROCESS_ENV] = str(directory)
    return directory


def start_exporter(host: str, port: int) -> int:
    """Serve ``/metrics`` over HTTP on (host, port) from a daemon thread; the bound port."""
    try:
        from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
        from prometheus_client.multiprocess import MultiProcessCollector
    except ImportError:
        raise MetricsUnavailableError(EXTRA_HINT) from None
    registry = REGISTRY
    if os.environ.get(MULTIPROCESS_ENV):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server.server_port
