"""What a store that keeps per-device limit counts for several nodes is asked and answers
(aggregator/store/postgres/device_limits.py), without its driver: the service's UploadGuard
(aggregator/service/collector/limits.py) imports this on every node."""

from __future__ import annotations

from dataclasses import dataclass

#: (pseudonym, survey id, question id).
CountKey = tuple[str, str, str]


@dataclass(frozen=True)
class Rate:
    """One survey's token bucket charge: ``cost`` reports at ``rate`` per second up to ``burst``."""

    survey_id: str
    rate: float
    burst: int
    cost: int


@dataclass(frozen=True)
class Refusal:
    """Why an upload was not admitted: the cap it would pass (``cap``), or the survey whose
    tokens are short (``survey``) and the seconds until they are there (``wait``)."""

    cap: CountKey | None = None
    survey: str = ""
    wait: float = 0.0
