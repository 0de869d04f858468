"""Upload limits as pure bookkeeping: token buckets on a fake clock, cap reservations and
settlements, load shedding, the limit key, and their configuration."""

from __future__ import annotations

import asyncio
import math
import os
import sqlite3
from concurrent.futures import Future

import numpy as np
import pytest

from aggregator.service.collector.cap_file import CapFile
from aggregator.service.collector.limits import (
    CapCounter,
    LimitExceededError,
    RateLimiter,
    TokenBucket,
    UploadGuard,
    limit_key,
    peer_host,
)
from aggregator.store.model import StoredReport, batches_of
from aggregator.survey_file.config import ConfigError, SurveyLimits, load_limits, load_surveys


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def reports(n: int, survey: str = "s", question: str = "q", start: int = 0) -> list[StoredReport]:
    return [
        StoredReport(i.to_bytes(16, "big"), survey, question, b"", np.zeros(1, np.int64))
        for i in range(start, start + n)
    ]


async def nothing_stored(ids: list[bytes]) -> set[bytes]:
    return set()


def admit(guard: UploadGuard, batch, key: str = "dev", stored=nothing_stored):
    return asyncio.run(guard.admit(key, batches_of(batch), stored))


def committed(flags: list[bool]) -> Future:
    future: Future = Future()
    future.set_result(flags)
    return future


# -- token bucket and rate limiter ------------------------------------------------------------


def test_bucket_starts_full_refills_at_rate_and_caps_at_burst():
    bucket = TokenBucket(rate=2.0, burst=4, now=0.0)
    assert bucket.wait(4, 0.0) == 0
    bucket.take(4, 0.0)
    assert bucket.wait(1, 0.0) == pytest.approx(0.5)
    assert bucket.wait(3, 1.0) == pytest.approx(0.5)  # 2 tokens back after 1 s
    assert bucket.tokens(100.0) == 4  # never more than the burst
    assert bucket.wait(5, 100.0) == math.inf


def test_rate_limit_refuses_with_the_exact_wait_and_takes_nothing():
    clock = Clock()
    limiter = RateLimiter({"s": SurveyLimits(rate_per_minute=60, burst=3)}, clock)
    limiter.take("dev", {"s": 3})
    with pytest.raises(LimitExceededError, match="retry after 2000 ms") as refused:
        limiter.take("dev", {"s": 2})
    assert refused.value.retry_after == pytest.approx(2.0)
    clock.now += 1.0
    limiter.take("dev", {"s": 1})  # the refusal took nothing: one token came back and is used
    limiter.take("other", {"s": 3})  # another device has its own bucket
    limiter.take("dev", {"unlimited": 10_000})


def test_batch_larger_than_burst_is_refused_without_a_hint():
    limiter = RateLimiter({"s": SurveyLimits(rate_per_minute=6, burst=2)}, Clock())
    with pytest.raises(LimitExceededError, match="send at most 2 per request") as refused:
        limiter.take("dev", {"s": 3})
    assert refused.value.retry_after is None


def test_rate_limit_over_several_surveys_is_all_or_nothing():
    limits = {"a": SurveyLimits(60, 5), "b": SurveyLimits(60, 1)}
    limiter = RateLimiter(limits, Clock())
    with pytest.raises(LimitExceededError, match="'b'"):
        limiter.take("dev", {"a": 5, "b": 2})
    limiter.take("dev", {"a": 5, "b": 1})  # survey a's tokens were not spent by the refusal


def test_full_buckets_are_swept_so_memory_follows_active_devices():
    clock = Clock()
    limiter = RateLimiter({"s": SurveyLimits(rate_per_minute=600, burst=1)}, clock)
    for device in range(1024):
        limiter.take(f"d{device}", {"s": 1})
    assert len(limiter) == 1024
    clock.now += 1.0  # every bucket is full again
    limiter.take("newcomer", {"s": 1})
    assert len(limiter) == 1


# -- caps -------------------------------------------------------------------------------------


def test_cap_counts_only_newly_stored_reports():
    guard = UploadGuard({"s": SurveyLimits(max_reports_per_device={"q": 3})}, CapCounter())
    first = admit(guard, reports(2))
    first.finish(committed([True, False]))  # one of the two was a duplicate
    admit(guard, reports(2, start=10)).finish(committed([True, True]))
    with pytest.raises(LimitExceededError, match="cap reached") as refused:
        admit(guard, reports(1, start=20))
    assert refused.value.retry_after is None
    assert admit(guard, reports(3), key="another device")


def test_concurrent_uploads_reserve_and_cannot_overshoot():
    guard = UploadGuard({"s": SurveyLimits(max_reports_per_device={"q": 3})}, CapCounter())
    pending = admit(guard, reports(2))
    with pytest.raises(LimitExceededError, match="cap reached"):
        admit(guard, reports(2, start=10))  # 2 reserved + 2 > 3
    failed: Future = Future()
    failed.set_exception(RuntimeError("commit failed"))
    pending.finish(failed)  # a failed store releases the reservation
    admit(guard, reports(3, start=10))


def test_a_resend_of_stored_reports_is_never_refused_by_the_cap():
    guard = UploadGuard({"s": SurveyLimits(max_reports_per_device={"q": 2})}, CapCounter())
    sent = reports(2)
    admit(guard, sent).finish(committed([True, True]))
    asked: list[list[bytes]] = []

    async def store_holds_sent(ids: list[bytes]) -> set[bytes]:
        asked.append(ids)
        return set(ids) & {r.report_id for r in sent}

    resend = admit(guard, sent, stored=store_holds_sent)  # the ack was lost; the device resends
    resend.finish(committed([False, False]))
    assert asked == [[r.report_id for r in sent]]
    with pytest.raises(LimitExceededError, match="cap reached"):
        admit(guard, [*sent, *reports(1, start=5)], stored=store_holds_sent)  # a new one counts


def test_only_the_first_close_of_an_admission_counts():
    guard = UploadGuard({}, CapCounter(), max_inflight_reports=10)
    admission = admit(guard, reports(4))
    assert guard.inflight_reports == 4
    admission.finish(committed([True] * 4))
    admission.close(None)
    assert guard.inflight_reports == 0


def test_changed_cap_counts_are_handed_out_once_and_persist(tmp_path):
    caps = CapFile(tmp_path / "counts.caps")
    guard = UploadGuard(
        {"s": SurveyLimits(max_reports_per_device={"q": 5})}, CapCounter(caps.load())
    )
    admission = admit(guard, reports(3))
    admission.finish(committed([True, False, True]))
    changed = guard.changed_counts()
    assert changed == {("dev", "s", "q"): 2}
    assert guard.changed_counts() == {}
    caps.save(changed)
    assert CapCounter(caps.load()).accepted(("dev", "s", "q")) == 2
    guard.keep_changed(changed)  # a failed write: handed out again
    assert guard.changed_counts() == {("dev", "s", "q"): 2}
    with sqlite3.connect(caps.path) as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(cap_counts)")]
    assert columns == ["pseudonym", "survey_id", "question_id", "accepted"]  # no report, no time
    assert oct(os.stat(caps.path).st_mode & 0o777) == "0o600"


# -- load shedding ----------------------------------------------------------------------------


def test_shedding_bounds_reports_waiting_for_the_store():
    guard = UploadGuard({}, CapCounter(), max_inflight_reports=10)
    big = admit(guard, reports(25))  # an idle server admits even an oversized batch
    with pytest.raises(LimitExceededError, match="overloaded") as shed:
        admit(guard, reports(1, start=100))
    assert shed.value.retry_after > 0
    with pytest.raises(LimitExceededError, match="overloaded"):
        guard.check_load(1)  # the early check the server makes before validating
    big.finish(committed([True] * 25))
    guard.check_load(25)
    first = admit(guard, reports(6, start=100))
    with pytest.raises(LimitExceededError, match="overloaded"):
        admit(guard, reports(5, start=200))
    admit(guard, reports(4, start=200))
    first.finish(committed([True] * 6))


def test_shed_or_cap_refusals_take_no_tokens():
    limits = {"s": SurveyLimits(rate_per_minute=60, burst=2, max_reports_per_device={"q": 3})}
    guard = UploadGuard(limits, CapCounter(), max_inflight_reports=1, clock=Clock())
    pending = admit(guard, reports(1, survey="unlimited"), key="someone else")
    with pytest.raises(LimitExceededError, match="overloaded"):
        admit(guard, reports(1))
    pending.finish(committed([True]))
    with pytest.raises(LimitExceededError, match="cap reached"):
        admit(guard, reports(4))
    admit(guard, reports(2)).finish(committed([True, True]))  # the full burst is still there


def test_rate_refusal_releases_the_cap_reservation():
    limits = {"s": SurveyLimits(rate_per_minute=60, burst=1, max_reports_per_device={"q": 2})}
    clock = Clock()
    guard = UploadGuard(limits, CapCounter(), clock=clock)
    admit(guard, reports(1)).finish(committed([True]))
    with pytest.raises(LimitExceededError, match="rate limit"):
        admit(guard, reports(1, start=1))
    clock.now += 1.0
    admit(guard, reports(1, start=1))  # a leaked reservation would make this pass the cap


# -- limit key --------------------------------------------------------------------------------


class Context:
    """The two calls of grpc.aio.ServicerContext that limit_key uses."""

    def __init__(self, auth: dict[str, list[bytes]], peer: str) -> None:
        self._auth, self._peer = auth, peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    def peer(self) -> str:
        return self._peer


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:10.1.2.3:50000", "10.1.2.3"),
        ("ipv6:[2001:db8::1]:443", "2001:db8::1"),
        ("unix:/tmp/sock", "unix:/tmp/sock"),
    ],
)
def test_peer_host_drops_the_port(peer, host):
    assert peer_host(peer) == host


def test_limit_key_prefers_the_certificate_identity():
    insecure = {"transport_security_type": [b"insecure"]}
    assert limit_key(Context(insecure, "ipv4:10.0.0.7:4000")) == "host:10.0.0.7"
    named = {"x509_common_name": [b"device-9"], "transport_security_type": [b"ssl"]}
    assert limit_key(Context(named, "ipv4:10.0.0.7:4000")) == "x509:device-9"
    both = {**named, "x509_subject_alternative_name": [b"device-9.example"]}
    assert limit_key(Context(both, "ipv4:10.0.0.7:4000")) == "x509:device-9.example"


# -- configuration ----------------------------------------------------------------------------

QUESTION = """
[[survey.question]]
id = "{qid}"
categories = ["a", "b"]
mechanism = "randomized_response"
epsilon = 1.0
"""


def survey_toml(survey_keys: str, question_keys: str = "") -> str:
    head = f'[[survey]]\nid = "s"\n{survey_keys}\n'
    return head + QUESTION.format(qid="q1") + question_keys + QUESTION.format(qid="q2")


def test_limits_from_toml(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(
        survey_toml(
            "rate_per_minute = 30\nmax_reports_per_device = 4", "max_reports_per_device = 9"
        )
    )
    assert load_limits(path) == {
        "s": SurveyLimits(30, 30, {"q1": 9, "q2": 4})  # burst defaults to a minute's worth
    }
    assert set(load_surveys(path)["s"].question("q1").labels) == {"a", "b"}
    path.write_text(survey_toml(""))
    assert load_limits(path) == {}


@pytest.mark.parametrize(
    ("survey_keys", "question_keys", "message"),
    [
        ("rate_per_minute = 0", "", "rate_per_minute must be > 0"),
        ("rate_per_minute = -1.5", "", "rate_per_minute must be > 0"),
        ('rate_per_minute = "10"', "", "must be a number"),
        ("rate_per_minute = nan", "", "must be a number"),
        ("rate_per_minute = true", "", "must be a number"),
        ("rate_per_minute = 10\nburst = 0", "", "burst must be an integer >= 1"),
        ("rate_per_minute = 10\nburst = 2.5", "", "burst must be an integer >= 1"),
        ("burst = 5", "", "burst needs rate_per_minute"),
        ("max_reports_per_device = 0", "", "max_reports_per_device must be an integer >= 1"),
        ("", "max_reports_per_device = -3", "question q1: max_reports_per_device"),
    ],
)
def test_invalid_limits_are_config_errors(tmp_path, survey_keys, question_keys, message):
    path = tmp_path / "s.toml"
    path.write_text(survey_toml(survey_keys, question_keys))
    with pytest.raises(ConfigError, match=message):
        load_limits(path)


def test_a_misspelt_survey_key_is_refused_not_ignored(tmp_path):
    """A typo in a limit would otherwise leave the survey silently unlimited."""
    path = tmp_path / "s.toml"
    path.write_text(survey_toml("rate_per_minut = 10", ""))
    with pytest.raises(ConfigError, match=r"unknown keys \['rate_per_minut'\]"):
        load_surveys(path)
