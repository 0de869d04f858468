"""What the service tells its operators about each upload: Prometheus metrics (``metrics``) and
an access log of one JSON line per upload call. Counts, codes and durations only: never a device
identity, a peer address, a report id or report content.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

import grpc

from aggregator.service.collector.metrics import NoMetrics, Recorder
from aggregator.store.model import STORED, ReportBatch

#: Codes of a refused call whose reports were invalid (the rest were refused by a limit, by
#: authentication, or could not be stored).
INVALID_CODES = frozenset(
    {"INVALID_ARGUMENT", "OUT_OF_RANGE", "NOT_FOUND", "FAILED_PRECONDITION", "ALREADY_EXISTS"}
)


@dataclass
class CallOutcome:
    """What one upload call did with its reports, filled in as the call goes."""

    received: int = 0  # reports counted on the wire
    counts: Counter[str] = field(default_factory=Counter)  # accepted, duplicate, rejected, ...
    started: float = field(default_factory=time.perf_counter)

    def add(self, outcome: str, count: int = 1) -> None:
        if count:
            self.counts[outcome] += count


class Observer:
    """Records finished upload calls and committed reports (see the module docstring)."""

    def __init__(self, recorder: Recorder | None = None, access_log: TextIO | None = None):
        self.recorder: Recorder = recorder or NoMetrics()
        self._access_log = access_log

    def finished(self, rpc: str, context: grpc.aio.ServicerContext, outcome: CallOutcome) -> None:
        """A call ended: its final status code, its duration and what became of its reports.
        A refused call's reports count as ``shed``, ``rejected`` (invalid) or ``refused``."""
        seconds = time.perf_counter() - outcome.started
        code = context.code()
        name = "OK" if code is None else code.name
        if name != "OK" and not outcome.counts:
            unaccounted = outcome.received
            outcome.add("rejected" if name in INVALID_CODES else "refused", unaccounted)
        self.recorder.upload(rpc, name, seconds)
        for kind, count in outcome.counts.items():
            self.recorder.reports(kind, count)
        if self._access_log is not None:
            line = {
                "event": "upload",
                "rpc": rpc,
                "code": name,
                "ms": round(seconds * 1000, 3),
                "reports": outcome.received,
                **dict(sorted(outcome.counts.items())),
            }
            print(json.dumps(line), file=self._access_log, flush=True)

    def stored(self, batches: Sequence[ReportBatch], flags: Sequence[int]) -> None:
        """New reports per question, from a committed call's batches and the store's flags
        (STORED, DUPLICATE, CONFLICT; in the batches' order): tallied by the recorder, which
        publishes them on a timer in coarse steps, never per upload (metrics.py)."""
        start = 0
        for batch in batches:
            end = start + len(batch)
            new = sum(flag == STORED for flag in flags[start:end])
            self.recorder.stored(batch.survey_id, batch.question_id, new)
            start = end


def access_log_stream(enabled: bool) -> TextIO | None:
    """Where the access log goes: standard error when enabled."""
    return sys.stderr if enabled else None
