"""Abuse limits on uploads: who is asking, how fast, how much in total, and whether the server can
take more right now.

* **Limit key** (:func:`limit_key`): the mTLS peer identity (certificate SAN, else CN) when the
  channel is authenticated, else the peer host, so unauthenticated traffic is limited per host.
  The key is used for limits only and never stored with a report.
* **Token bucket** per (key, survey): ``rate_per_minute`` reports refill, up to ``burst``. A
  batch costs one token per report, all or nothing. A refusal says when enough tokens will be
  there (``retry_after``).
* **Cap** per (key, survey, question): ``max_reports_per_device`` newly accepted reports, the
  server-side mirror of a device's privacy budget. Reports are reserved before they are stored
  (so concurrent requests of one device cannot overshoot) and settled after the commit, counting
  only the reports the store accepted as new: a resend that comes back DUPLICATE never counts
  twice, and one whose reports are all stored already is never refused.
* **Load shedding**: a bound on reports admitted but not yet resolved by the store. Past it an
  upload is refused at once with a retry hint instead of queueing until its deadline expires.

Cap counts survive restarts: they live in their own file, apart from the report log, written in
batches on a timer (:mod:`aggregator.service.collector.cap_file`, which says what a crash may
cost), so
nothing at rest ties a stored report to the device that sent it. The file holds keyed hashes of
limit keys (:class:`KeyPseudonyms`, secret kept in a file beside the store), never a device id,
certificate name or address. Token buckets and the in-flight count are in memory: a restart
refills the buckets, which costs at most one burst per device.

Everything here is plain bookkeeping with an injectable clock and no gRPC; one lock makes it safe
to settle from the store's writer thread while the event loop admits.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Protocol

from aggregator.errors import LdpError
from aggregator.service.private_files import privacy_problem
from aggregator.store.checks import Rejection, ReportRejectedError
from aggregator.store.device_counts import CountKey, Rate, Refusal
from aggregator.store.model import STORED, ReportBatch
from aggregator.survey_file.config import SurveyLimits

log = logging.getLogger(__name__)

#: Default bound on reports waiting for the store. The store commits about 40k reports/s on a
#: 2-core machine (docs/performance.md), so 20,000 queued reports wait about half a second:
#: well inside a device's 10 s deadline, and above the 10,000-report maximum request.
DEFAULT_MAX_INFLIGHT_REPORTS = 20_000
#: Retry hint of a shed upload: long enough for a full queue to drain a few times over.
SHED_RETRY_AFTER = 1.0


class SecretFileError(LdpError):
    """A secret file others may read or write, or one that is not a secret of the right size."""


class LimitExceededError(LdpError):
    """An upload is refused by a limit. ``retry_after`` (seconds) is set when waiting helps
    (rate limit, overload) and None when it does not (cap reached, batch larger than the burst)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def limit_key(context, device: str | None = None) -> str:
    """Who an upload is limited as: ``device:<id>`` of a verified Ed25519 signature, else
    ``x509:<SAN or CN>`` of an mTLS peer, else ``host:<ip>``."""
    if device is not None:
        return "device:" + device
    auth = context.auth_context()
    for name in ("x509_subject_alternative_name", "x509_common_name"):
        values = auth.get(name)
        if values:
            return "x509:" + values[0].decode("utf-8", "replace")
    return "host:" + peer_host(context.peer())


class KeyPseudonyms:
    """Keyed hashes (HMAC-SHA-256) of limit keys: persisted cap counts then hold no device id,
    certificate name or address, and without the secret the hashes cannot be matched against a
    list of candidate identities."""

    SECRET_BYTES = 32

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @classmethod
    def beside(cls, db_path: str) -> KeyPseudonyms:
        """Use the secret in ``<db_path>.limits-secret``, creating it (mode 0600) on first use.
        An existing secret that others may read or write, or that another user owns, is refused
        (SecretFileError)."""
        path = Path(f"{db_path}.limits-secret")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            problem = privacy_problem(path, path.stat(), "a secret")
            if problem is not None:
                raise SecretFileError(problem) from None
            secret = path.read_bytes()
            if len(secret) != cls.SECRET_BYTES:
                raise SecretFileError(f"{path} is not a {cls.SECRET_BYTES}-byte secret") from None
            return cls(secret)
        secret = os.urandom(cls.SECRET_BYTES)
        with os.fdopen(fd, "wb") as out:
            out.write(secret)
            out.flush()
            os.fsync(out.fileno())
        return cls(secret)

    def __call__(self, key: str) -> str:
        return hmac.new(self._secret, key.encode(), hashlib.sha256).hexdigest()


def peer_host(peer: str) -> str:
    """The host part of a gRPC peer string (``ipv4:10.0.0.1:5000``, ``ipv6:[::1]:5000``)."""
    scheme, _, address = peer.partition(":")
    if scheme == "ipv6" and address.startswith("["):
        return address[1 : address.find("]")]
    if scheme == "ipv4":
        return address.rpartition(":")[0]
    return peer


class TokenBucket:
    """``rate`` tokens per second up to ``burst``; starts full."""

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate, self.burst = rate, burst
        self._tokens, self._stamp = float(burst), now

    def tokens(self, now: float) -> float:
        return min(self.burst, self._tokens + (now - self._stamp) * self.rate)

    def wait(self, cost: int, now: float) -> float:
        """Seconds until ``cost`` tokens are there: 0 if they are, inf if ``cost`` > burst."""
        if cost > self.burst:
            return math.inf
        return max(0.0, (cost - self.tokens(now)) / self.rate)

    def take(self, cost: int, now: float) -> None:
        """Take ``cost`` tokens; call only when :meth:`wait` is 0."""
        self._tokens, self._stamp = self.tokens(now) - cost, now


class RateLimiter:
    """Token buckets per (limit key, survey). Full buckets are dropped now and then, which is
    the same as keeping them, so memory follows the number of recently active devices."""

    def __init__(self, limits: Mapping[str, SurveyLimits], clock: Callable[[], float]) -> None:
        self._limits = limits
        self._clock = clock
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self._sweep_at = 1024

    def take(self, key: str, costs: Mapping[str, int]) -> None:
        """Charge reports per survey to the device's buckets, all or nothing, or raise
        LimitExceededError naming the survey that needs the longest wait."""
        now = self._clock()
        charges = []
        for survey_id, cost in costs.items():
            limits = self._limits.get(survey_id)
            if limits is None or limits.rate_per_minute is None or limits.burst is None:
                continue
            rate = limits.rate_per_minute / 60.0
            bucket = self._bucket(key, survey_id, rate, limits.burst, now)
            charges.append((bucket, cost, bucket.wait(cost, now), survey_id, limits))
        if not charges:
            return
        bucket, cost, wait, survey_id, limits = max(charges, key=lambda c: c[2])
        if wait > 0:
            raise rate_refusal(survey_id, limits, cost, wait)
        for bucket, cost, *_ in charges:
            bucket.take(cost, now)

    def _bucket(self, key: str, survey_id: str, rate: float, burst: int, now: float) -> TokenBucket:
        bucket = self._buckets.get((key, survey_id))
        if bucket is None:
            self._sweep(now)
            bucket = TokenBucket(rate, burst, now)
            self._buckets[(key, survey_id)] = bucket
        return bucket

    def __len__(self) -> int:
        return len(self._buckets)

    def _sweep(self, now: float) -> None:
        if len(self._buckets) < self._sweep_at:
            return
        full = [k for k, b in self._buckets.items() if b.tokens(now) >= b.burst]
        for key in full:
            del self._buckets[key]
        self._sweep_at = max(1024, 2 * len(self._buckets))


def rate_refusal(
    survey_id: str, limits: SurveyLimits, cost: int, wait: float
) -> LimitExceededError:
    """The refusal of ``cost`` reports that would have to wait ``wait`` seconds for tokens
    (inf: more than the burst, waiting does not help)."""
    if wait == math.inf:
        return LimitExceededError(
            f"a batch of {cost} reports exceeds the burst of {limits.burst} for survey "
            f"{survey_id!r}; send at most {limits.burst} per request"
        )
    return LimitExceededError(
        f"rate limit of {limits.rate_per_minute:g} reports per minute for survey "
        f"{survey_id!r}; retry after {math.ceil(wait * 1000)} ms",
        retry_after=wait,
    )


class SharedLimits(Protocol):
    """Per-device counts kept where every node sees them (a PostgreSQL store's,
    aggregator/store/postgres/device_limits.py). Both calls block."""

    def take(
        self,
        key: str,
        wanted: Mapping[CountKey, int],
        caps: Mapping[CountKey, int],
        rates: Sequence[Rate],
    ) -> Refusal | None: ...

    def release(self, counts: Mapping[CountKey, int]) -> None: ...


class CapCounter:
    """Accepted and reserved report counts per (limit key, survey, question), for capped
    questions only. ``accepted`` starts from the persisted counts; the keys changed since the
    last :meth:`take_changed` are remembered for the next write."""

    def __init__(self, accepted: Mapping[CountKey, int] | None = None) -> None:
        self._accepted: dict[CountKey, int] = dict(accepted or {})
        self._reserved: Counter[CountKey] = Counter()
        self._changed: set[CountKey] = set()

    def take_changed(self) -> dict[CountKey, int]:
        """The counts changed since the last call (and forget that they changed)."""
        changed = {key: self._accepted[key] for key in self._changed}
        self._changed = set()
        return changed

    def mark_changed(self, keys: Iterable[CountKey]) -> None:
        """Remember ``keys`` as changed again (their write failed)."""
        self._changed.update(keys)

    def accepted(self, key: CountKey) -> int:
        return self._accepted.get(key, 0)

    def try_reserve(
        self, wanted: Mapping[CountKey, int], caps: Mapping[CountKey, int]
    ) -> CountKey | None:
        """Reserve all of ``wanted`` and return None, or reserve nothing and return the first
        key whose cap it would pass."""
        for key, n in wanted.items():
            if self.accepted(key) + self._reserved[key] + n > caps[key]:
                return key
        self._reserved.update(wanted)
        return None

    def settle(self, reserved: Mapping[CountKey, int], accepted: Mapping[CountKey, int]) -> None:
        """Turn a reservation into the counts the store actually accepted."""
        self._reserved.subtract(reserved)
        for key, n in accepted.items():
            if n:
                self._accepted[key] = self.accepted(key) + n
                self._changed.add(key)
        self._reserved = +self._reserved  # drop zero entries


class Admission:
    """One admitted upload: its reservations until the store resolves it.

    Pass :meth:`finish` as the store future's done-callback (or call :meth:`close` if submitting
    failed); only the first close has an effect. The store's flags follow the order of
    ``batches``."""

    def __init__(
        self,
        guard: UploadGuard,
        key: str,
        batches: Sequence[ReportBatch],
        reserved: Mapping[CountKey, int],
    ) -> None:
        self._guard = guard
        self._key = key
        self._batches = batches
        self._size = sum(len(b) for b in batches)
        self._reserved = reserved
        self._once = threading.Lock()  # acquired by the first close; later closes do nothing

    def accepted_counts(self, fresh: Sequence[int]) -> Counter[CountKey]:
        """Newly stored reports per capped (key, survey, question)."""
        if len(fresh) != self._size:
            raise ValueError(f"{len(fresh)} flags for {self._size} reports")
        counts: Counter[CountKey] = Counter()
        start = 0
        for batch in self._batches:
            flags = fresh[start : start + len(batch)]
            start += len(batch)
            if self._guard.cap(batch.survey_id, batch.question_id) is not None:
                counts[(self._key, batch.survey_id, batch.question_id)] += flags.count(STORED)
        return +counts

    def finish(self, future: Future[list[int]]) -> None:
        """Settle (committed) or release (failed, cancelled) the reservations."""
        fresh: list[int] | None = None
        if not future.cancelled() and future.exception() is None:
            fresh = future.result()
        self.close(fresh)

    def close(self, fresh: Sequence[int] | None) -> None:
        """Settle with the store's flags, or release everything when ``fresh`` is None."""
        if not self._once.acquire(blocking=False):
            return
        accepted = self.accepted_counts(fresh) if fresh is not None else {}
        self._guard.settle(self._size, self._reserved, accepted)


def _answered(key: CountKey) -> str:
    _, survey_id, question_id = key
    return (
        f"answered before: this device sent a report of {survey_id}/{question_id} already "
        "(stored, or earlier in this upload), and a survey with device authentication counts "
        "one answer per device; resending that report's id is answered DUPLICATE"
    )


class UploadGuard:
    """Admits an upload against load, rate and cap, in that order of cost to the device: an
    upload shed for load or refused for its cap consumes no tokens. With ``shared`` counts (the
    nodes of a shared store) rate and cap are decided there, in one transaction per upload, and
    ``caps`` and the in-memory buckets are not used; the load stays this node's."""

    def __init__(
        self,
        limits: Mapping[str, SurveyLimits],
        caps: CapCounter,
        *,
        max_inflight_reports: int = DEFAULT_MAX_INFLIGHT_REPORTS,
        clock: Callable[[], float] = time.monotonic,
        shared: SharedLimits | None = None,
    ) -> None:
        if max_inflight_reports < 1:
            raise ValueError("max_inflight_reports must be >= 1")
        self._limits = limits
        self._caps = caps
        self._shared = shared
        self._rates = RateLimiter(limits, clock)
        self.max_inflight_reports = max_inflight_reports
        self._inflight = 0
        self._lock = threading.Lock()

    @property
    def inflight_reports(self) -> int:
        return self._inflight

    @property
    def per_device(self) -> bool:
        """Whether any survey has a per-device limit (rate or cap)."""
        return bool(self._limits)

    def cap(self, survey_id: str, question_id: str) -> int | None:
        limits = self._limits.get(survey_id)
        return None if limits is None else limits.cap(question_id)

    async def admit(
        self,
        key: str,
        batches: Sequence[ReportBatch],
        stored_ids: Callable[[list[bytes]], Awaitable[set[bytes]]],
    ) -> Admission:
        """Admit the reports of ``batches`` from ``key`` or raise LimitExceededError
        (ReportRejectedError ANSWERED_BEFORE past the one-answer cap of a signed survey).

        ``stored_ids(ids)`` answers which report ids the store holds already; it is asked only
        when a cap would be passed, because reports stored before do not count again."""
        size = sum(len(b) for b in batches)
        capped = [b for b in batches if self.cap(b.survey_id, b.question_id) is not None]
        if self._shared is not None:
            return await self._admit_shared(self._shared, key, batches, capped, stored_ids)
        wanted = _per_question(key, capped)
        with self._lock:
            self._check_load(size)
            if self._caps.try_reserve(wanted, self._cap_table(wanted)) is None:
                return self._admit_rest(key, batches, size, wanted)
        known = await stored_ids([i for b in capped for i in b.report_ids])
        wanted = _per_question(key, capped, known)
        with self._lock:
            self._check_load(size)
            full = self._caps.try_reserve(wanted, self._cap_table(wanted))
            if full is not None:
                raise self._cap_refusal(full)
            return self._admit_rest(key, batches, size, wanted)

    async def _admit_shared(
        self,
        shared: SharedLimits,
        key: str,
        batches: Sequence[ReportBatch],
        capped: Sequence[ReportBatch],
        stored_ids: Callable[[list[bytes]], Awaitable[set[bytes]]],
    ) -> Admission:
        """:meth:`admit` on shared counts: reserve and charge in the store (off the event
        loop), asking which reports are stored already only when a cap would be passed."""
        size = sum(len(b) for b in batches)
        self.check_load(size)
        per_survey: Counter[str] = Counter()
        for batch in batches:
            per_survey[batch.survey_id] += len(batch)
        rates = [
            Rate(survey_id, limits.rate_per_minute / 60.0, limits.burst, cost)
            for survey_id, cost in sorted(per_survey.items())
            if (limits := self._limits.get(survey_id)) is not None
            and limits.rate_per_minute is not None
            and limits.burst is not None
        ]
        wanted = _per_question(key, capped)
        if not wanted and not rates:
            refusal = None
        else:
            refusal = await asyncio.to_thread(
                shared.take, key, wanted, self._cap_table(wanted), rates
            )
        if refusal is not None and refusal.cap is not None:
            known = await stored_ids([i for b in capped for i in b.report_ids])
            wanted = _per_question(key, capped, known)
            refusal = await asyncio.to_thread(
                shared.take, key, wanted, self._cap_table(wanted), rates
            )
        if refusal is not None:
            if refusal.cap is not None:
                raise self._cap_refusal(refusal.cap)
            limits = self._limits[refusal.survey]
            raise rate_refusal(refusal.survey, limits, per_survey[refusal.survey], refusal.wait)
        with self._lock:
            self._inflight += size
        return Admission(self, key, batches, wanted)

    def _cap_refusal(self, full: CountKey) -> Exception:
        """The refusal of an upload that would pass ``full``'s cap."""
        _, survey_id, question_id = full
        if self._limits[survey_id].one_answer:
            return ReportRejectedError(Rejection.ANSWERED_BEFORE, _answered(full))
        return LimitExceededError(
            f"cap reached: a device may send at most {self._cap_table([full])[full]} "
            f"reports for {survey_id}/{question_id}"
        )

    def changed_counts(self) -> dict[CountKey, int]:
        """Cap counts changed since the last call, to persist (:mod:`.cap_file`)."""
        with self._lock:
            return self._caps.take_changed()

    def keep_changed(self, counts: Mapping[CountKey, int]) -> None:
        """Counts whose write failed: hand them out again next time."""
        with self._lock:
            self._caps.mark_changed(counts)

    def settle(
        self, size: int, reserved: Mapping[CountKey, int], accepted: Mapping[CountKey, int]
    ) -> None:
        """An admitted upload of ``size`` reports left the store: free its load, settle its caps
        (shared counts: hand back the reserved reports not stored as new, in a thread of its
        own, since this runs on the store's writer thread)."""
        with self._lock:
            self._inflight -= size
            if self._shared is None:
                self._caps.settle(reserved, accepted)
                return
        unused = {k: n - accepted.get(k, 0) for k, n in reserved.items() if n > accepted.get(k, 0)}
        if unused:
            threading.Thread(
                target=_release, args=(self._shared, unused), name="cap-release", daemon=True
            ).start()

    def _admit_rest(
        self, key: str, batches: Sequence[ReportBatch], size: int, wanted: Mapping[CountKey, int]
    ) -> Admission:
        """Under the lock, with caps reserved: charge the rate and count the load."""
        per_survey: Counter[str] = Counter()
        for batch in batches:
            per_survey[batch.survey_id] += len(batch)
        try:
            self._rates.take(key, per_survey)
        except LimitExceededError:
            self._caps.settle(wanted, {})
            raise
        self._inflight += size
        return Admission(self, key, batches, wanted)

    def check_load(self, size: int) -> None:
        """Shed an upload of ``size`` reports if the store is too far behind; the cheapest
        refusal, worth making before any validation work."""
        with self._lock:
            self._check_load(size)

    def _check_load(self, size: int) -> None:
        if self._inflight and self._inflight + size > self.max_inflight_reports:
            raise LimitExceededError(
                f"server overloaded ({self._inflight} reports waiting to be stored); retry after "
                f"{SHED_RETRY_AFTER * 1000:.0f} ms",
                retry_after=SHED_RETRY_AFTER,
            )

    def _cap_table(self, wanted: Iterable[CountKey]) -> dict[CountKey, int]:
        return {k: cap for k in wanted if (cap := self.cap(k[1], k[2])) is not None}


def _per_question(
    key: str, batches: Iterable[ReportBatch], known: set[bytes] | frozenset[bytes] = frozenset()
) -> Counter[CountKey]:
    """Reports per (key, survey, question), leaving out the ids in ``known``."""
    counts: Counter[CountKey] = Counter()
    for batch in batches:
        n = len(batch) if not known else sum(i not in known for i in batch.report_ids)
        counts[(key, batch.survey_id, batch.question_id)] += n
    return +counts


def _release(shared: SharedLimits, unused: Mapping[CountKey, int]) -> None:
    """Hand back reserved cap counts; a failure leaves them counted (a device may be refused a
    few reports below its cap, never allowed above it)."""
    try:
        shared.release(unused)
    except Exception as exc:  # the store is unreachable or closed: keep serving
        log.warning("could not hand back %d reserved cap counts: %s", sum(unused.values()), exc)
