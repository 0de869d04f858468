"""Prometheus metrics for operators (the optional ``[metrics]`` extra, off unless ``serve
--metrics-port``): uploads and reports by outcome, RPC latency, commit latency and group size, and
reports stored per question. Counts and durations only: no device identity, no report content.

Reports stored per question are tallied on each upload but published only on a timer
(every PUBLISH_SECONDS) and in whole steps of STORED_STEP reports, so a scrape right after one
upload does not show which questions it answered (docs/operations.md).

With ``--workers N`` every process records into prometheus-client's multiprocess directory
(``PROMETHEUS_MULTIPROC_DIR``, set by the parent before any worker starts) and the parent's
exporter sums them.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Protocol

EXTRA_HINT = "metrics need prometheus-client: pip install 'ldp-survey[metrics]'"
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
GROUP_BUCKETS = (1, 10, 100, 1_000, 5_000, 10_000, 50_000, 100_000)
#: ldp_reports_stored moves in whole steps of this many reports of a question (the default
#: min_batch_size), per process ...
STORED_STEP = 100
#: ... and only this often (seconds), never on the upload path.
PUBLISH_SECONDS = 60.0


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
    collector of the exporter sees them). Reports stored per question are published by a
    daemon thread every ``publish_every`` seconds, in whole steps of ``step`` reports."""

    def __init__(self, publish_every: float = PUBLISH_SECONDS, step: int = STORED_STEP) -> None:
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
            "ldp_reports_stored",
            f"New reports stored per question, in steps of {step}, published every "
            f"{publish_every:g} s",
            ["survey", "question"],
        )
        self._step = step
        self._tally: dict[tuple[str, str], int] = {}  # since start, exact
        self._published: dict[tuple[str, str], int] = {}  # what the counter shows
        self._lock = threading.Lock()  # uploads tally while the publisher reads
        threading.Thread(
            target=self._publish_every, args=(publish_every,), name="metrics-stored", daemon=True
        ).start()

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
        """Tally only: :meth:`publish` moves the exported counter."""
        if count:
            with self._lock:
                key = (survey_id, question_id)
                self._tally[key] = self._tally.get(key, 0) + count

    def publish(self) -> None:
        """Move each question's ``ldp_reports_stored`` to its tally rounded down to a whole
        step."""
        with self._lock:
            tally = dict(self._tally)
        for key, count in tally.items():
            coarse, shown = count // self._step * self._step, self._published.get(key, 0)
            if coarse > shown:
                self._stored.labels(*key).inc(coarse - shown)
                self._published[key] = coarse

    def _publish_every(self, seconds: float) -> None:
        while True:
            time.sleep(seconds)
            self.publish()


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
