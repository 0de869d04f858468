"""The device-side flow of one answer: charge the budget, randomize securely, store in the
durable outbox, and upload later in batches.

Order matters for privacy and durability: the ledger is charged before the report exists, the
report is committed to the outbox before it is ever sent, and a retry resends the same bytes with
the same report id, so no answer is ever randomized twice and none is counted twice.

A device answers each question once (client/device/repeats.py): a second answer is refused,
or, under the question's ``repeat = "memoize"`` (or ``memoize=True`` on this device), answered by
resending the first report whatever the new answer is, so the resend reveals nothing about it
and the aggregator counts the device once.

Uploads that include a survey with ``require_device_auth`` are signed with the device key beside
the state file (created on first need). A refused signature (UNAUTHENTICATED: not enrolled yet,
clock off) is a problem of the device, not of its reports: they stay pending.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from client.device.design_key import DeviceDesignKeys
from client.device.group import DeviceGroups
from client.device.household import Household, HouseholdError
from client.device.ledger import Budget, Ledger
from client.device.outbox import Outbox
from client.device.repeats import FirstReport, Repeats, refusal
from client.device.split import split_secret, split_side
from client.device.survey_cache import SurveyCache
from client.device.transport import Transport, TransportError
from client.survey import MEMOIZE, QuestionSpec, SurveySpec
from protos.ldp.v1 import ldp_pb2

if TYPE_CHECKING:  # cryptography loads with the key, only for surveys that require signatures
    from client.device.keys import DeviceKey

REPORT_ID_BYTES = 16
# Failures that say nothing about the reports themselves: stop the flush, keep them pending
# (status code names: grpc itself loads with the first call, docs/performance.md).
_DEVICE_PROBLEMS = frozenset({"UNKNOWN", "UNAUTHENTICATED"})
_DELIVERED = frozenset({ldp_pb2.ACCEPTED, ldp_pb2.DUPLICATE})


def _handshake_failed(exc: TransportError) -> bool:
    """An UNAVAILABLE that is a TLS refusal (a certificate problem to fix, not a missing
    signal): gRPC reports both with the same code, only the details tell them apart."""
    details = exc.details.lower()
    return any(word in details for word in ("ssl", "handshake", "certificate", "tls"))


@dataclass(frozen=True)
class FlushResult:
    """What one flush achieved."""

    accepted: int
    duplicate: int
    rejected: int
    pending: int
    error: str = ""
    retry_after: float | None = None  # seconds the server asked to wait before the next flush
    refusals: tuple[str, ...] = ()  # why reports were rejected for good ("CODE: reason"), once each

    @property
    def ok(self) -> bool:
        """Whether every report sent counts: no upload error and none refused for good."""
        return not self.error and not self.rejected


class Reporter:
    """One device: its survey cache, budget ledger, outbox and first answers (all in one SQLite
    file). ``memoize=True``: this device resends its first report of any question asked again,
    instead of refusing (what a question's ``repeat = "memoize"`` asks for)."""

    def __init__(
        self,
        transport: Transport,
        state_path: str | os.PathLike,
        budget: Budget | None = None,
        *,
        memoize: bool = False,
    ) -> None:
        self._transport = transport
        self._path = Path(state_path)
        self.ledger = Ledger(self._path, budget)
        self.outbox = Outbox(self._path)
        self.cache = SurveyCache(self._path)
        self.groups = DeviceGroups(self._path)
        self.design_keys = DeviceDesignKeys(self._path)
        self.repeats = Repeats(self._path)
        self._split_secret = split_secret(self._path)
        self._memoize = memoize
        self._surveys: dict[str, SurveySpec] = {}
        self._unknown_surveys: set[str] = set()
        self._device_key: DeviceKey | None = None
        self._household_ledger: Household | None = None
        self.offline = ""  # why a definition came from the cache (the server was unreachable)

    def survey(self, survey_id: str) -> SurveySpec:
        """The survey definition: fetched once from the aggregator (and cached on the device),
        or, with the aggregator unreachable, the cached one (fetched earlier or installed)."""
        if survey_id not in self._surveys:
            try:
                survey = self._transport.get_survey(survey_id)
            except TransportError as exc:
                if not exc.retryable or _handshake_failed(exc):
                    raise
                cached = self.cache.get(survey_id)
                if cached is None:
                    raise TransportError(
                        exc.code,
                        f"{exc.reason or 'server unreachable'}; survey {survey_id!r} is not "
                        "cached on this device (ldp-client install-survey FILE installs it)",
                    ) from None
                survey, self.offline = cached.survey, exc.reason or exc.code.name
            else:
                self.cache.put(survey, "server")
            self._surveys[survey_id] = survey
        return self._surveys[survey_id]

    def device_key(self) -> DeviceKey:
        """The device's signing key (``<state>.device-key.pem``), created on first use."""
        if self._device_key is None:
            from client.device.keys import DeviceKey, device_key_path

            self._device_key = DeviceKey.load_or_create(device_key_path(self._path))
        return self._device_key

    def side(self, survey_id: str) -> ldp_pb2.Side:
        """The side of a split survey all of this device's reports of it go to (ldp.v1.Side;
        SIDE_UNSPECIFIED for a survey that is not split, or unknown to the aggregator)."""
        if survey_id in self._unknown_surveys:
            return ldp_pb2.SIDE_UNSPECIFIED
        try:
            fraction = self.survey(survey_id).exploration_fraction
        except TransportError as exc:
            if exc.code.name != "NOT_FOUND":
                raise
            self._unknown_surveys.add(survey_id)
            return ldp_pb2.SIDE_UNSPECIFIED
        return split_side(self._split_secret, survey_id, fraction)

    def _requires_auth(self, survey_ids: set[str]) -> bool:
        for survey_id in survey_ids - self._unknown_surveys:
            try:
                if self.survey(survey_id).require_device_auth:
                    return True
            except TransportError as exc:
                if exc.code.name != "NOT_FOUND":
                    raise
                # An unknown survey: the upload is refused as NOT_FOUND and dead-lettered;
                # remembered so that splitting the batch does not ask again for every half.
                self._unknown_surveys.add(survey_id)
        return False

    def answer(
        self,
        survey_id: str,
        question_id: str,
        answer: str | list[str],
        group: str | None = None,
        *,
        design_key: str | None = None,
    ) -> bytes:
        """Randomize one answer, given by its category label ('a|b' or one label per attribute
        for a joint question), and queue it; returns the report id. ``group``: the device's
        public group in a survey with a group label (None: the one it reported before);
        ``design_key`` likewise its row of a survey's sampling frame.

        Raises ``SurveyError`` for an unknown label (the message lists the valid ones) and
        ``BudgetExceeded`` (before anything is randomized) if the device cannot afford the
        question's privacy cost; for a household_shared question, ``HouseholdError`` without a
        household, ``AlreadyAnswered`` for a second answer racing the first and
        ``HouseholdBudgetExceeded`` over the household cap. A group that does not fit the
        survey is a ``SurveyError``, another group than the device reported before a
        ``GroupChangedError``: both before anything is charged or randomized; so is a design
        key the survey's published frame lacks (``SurveyError``) or another key than the
        device reported under (``DesignKeyChangedError``). A question
        answered before raises ``AnsweredBefore`` (nothing charged or queued), or with
        memoization re-queues the first report and returns its id, at no new cost: the first
        answer stands.
        """
        question = self._question(survey_id, question_id)
        return self._queue(survey_id, question, question.index(answer), group, design_key)

    def answer_index(
        self,
        survey_id: str,
        question_id: str,
        index: int,
        group: str | None = None,
        *,
        design_key: str | None = None,
    ) -> bytes:
        """:meth:`answer` for an answer given by its joint category index (0 .. k-1)."""
        question = self._question(survey_id, question_id)
        return self._queue(survey_id, question, question.check_index(index), group, design_key)

    def _question(self, survey_id: str, question_id: str) -> QuestionSpec:
        try:
            return self.survey(survey_id).question(question_id)
        except KeyError:
            raise KeyError(f"survey {survey_id!r} has no question {question_id!r}") from None

    def _queue(
        self,
        survey_id: str,
        question: QuestionSpec,
        index: int,
        group: str | None,
        design_key: str | None = None,
    ) -> bytes:
        group = self.groups.resolve(self.survey(survey_id), group)
        design_key = self.design_keys.resolve(self.survey(survey_id), design_key)
        question_id, digest = question.id, question.digest
        first = self.repeats.first(survey_id, question_id)
        stale = first is not None and self._never_counted(first, digest)
        if first is not None and not stale:
            if not (self._memoize or question.repeat == MEMOIZE):
                raise refusal(survey_id, question_id)
            self.outbox.add(  # a no-op while it is pending or dead-lettered
                first.report_id,
                survey_id,
                question_id,
                first.payload,
                definition_digest=first.definition_digest,
            )
            return first.report_id
        mech = question.mechanism
        described = mech.describe()
        household = self._household(survey_id, question) if question.household_shared else None
        if household is not None:
            household.check(survey_id, question_id, mech.cost)
            report_id = household.terms.report_id(survey_id, question_id)
        else:
            report_id = os.urandom(REPORT_ID_BYTES)
        self.ledger.charge(
            mech.cost,
            request_id=report_id.hex(),
            survey_id=survey_id,
            question_id=question_id,
            mechanism=described,
        )
        if household is not None:  # authoritative (unique per question): a racing answer stops here
            household.charge(survey_id, question_id, mech.cost)
        if group:
            self.groups.fix(survey_id, group)
        if design_key:
            self.design_keys.fix(survey_id, design_key)
        payload = mech.randomize_payload(index)  # pure Python: no numpy on a device
        report = FirstReport(report_id, payload, digest)
        self.repeats.claim(survey_id, question_id, report, replacing=first if stale else None)
        self.outbox.add(report_id, survey_id, question_id, payload, definition_digest=digest)
        return report_id

    def _never_counted(self, first: FirstReport, digest: bytes) -> bool:
        """Whether a first report was randomized under another definition than the current one
        and refused for good: the aggregator never counted it, so a new answer counts once."""
        return first.definition_digest != digest and self.outbox.dead(first.report_id)

    def _household(self, survey_id: str, question: QuestionSpec) -> Household:
        """The device's household, needed for a household_shared question (privacy-accounting
        spec §D.2, §D.3)."""
        if self._household_ledger is None:
            self._household_ledger = Household.open(self._path)
        if self._household_ledger is None:
            raise HouseholdError(
                f"survey {survey_id}, question {question.id} is household_shared: enrol this "
                "device in a household first (ldp-client household create, or household join)"
            )
        return self._household_ledger

    def flush(self, batch_size: int = 500) -> FlushResult:
        """Upload everything pending, oldest first, in batches.

        Accepted and duplicate reports leave the outbox. A batch the server refuses for good is
        split until the offending report is isolated and moved to the dead-letter table (a cap
        reached is such a refusal); a report answered CONFLICT (its id is stored with other
        content) is dead-lettered too, with code "CONFLICT". An unreachable server, or one that
        refuses with a retry hint (rate limit, overload), stops the flush; the rest stays
        pending, and ``retry_after`` says when to flush again if the server said so.
        """
        totals = {"accepted": 0, "duplicate": 0, "rejected": 0}
        refusals: dict[str, None] = {}
        error, wait = "", None
        while True:
            batch = self.outbox.pending(batch_size)
            if not batch:
                break
            try:
                self._send(batch, totals, refusals)
            except TransportError as exc:
                error, wait = str(exc), exc.retry_after
                break
        return FlushResult(
            pending=len(self.outbox),
            error=error,
            retry_after=wait,
            refusals=tuple(refusals),
            **totals,
        )

    def _send(self, batch, totals: dict[str, int], refusals: dict[str, None]) -> None:
        surveys = {item.survey_id for item in batch}
        groups = {survey_id: self.groups.get(survey_id) or "" for survey_id in surveys}
        keys = {survey_id: self.design_keys.get(survey_id) or "" for survey_id in surveys}
        reports = [
            ldp_pb2.Report(
                report_id=item.report_id,
                survey_id=item.survey_id,
                question_id=item.question_id,
                payload=item.payload,
                definition_digest=item.definition_digest,
                side=self.side(item.survey_id),
                group=groups[item.survey_id],
                design_key=keys[item.survey_id],
            )
            for item in batch
        ]
        signed = self._requires_auth(surveys)
        self.outbox.mark_attempt([item.report_id for item in batch])
        try:
            results = self._transport.upload(reports, self.device_key() if signed else None)
        except TransportError as exc:
            if exc.retryable or exc.code.name in _DEVICE_PROBLEMS:
                raise
            if len(batch) == 1:
                self.outbox.reject(batch[0].report_id, exc.code.name, exc.details)
                totals["rejected"] += 1
                refusals[
                    f"{exc.code.name}: {exc.details.partition('report[0]: ')[2] or exc.details}"
                ] = None
                return
            middle = len(batch) // 2
            self._send(batch[:middle], totals, refusals)
            self._send(batch[middle:], totals, refusals)
            return
        delivered, settled = [], 0
        for result in results:
            if result.status == ldp_pb2.CONFLICT:  # final: the id is stored with other content
                self.outbox.reject(result.report_id, "CONFLICT", result.reason)
                totals["rejected"] += 1
                settled += 1
            elif result.status in _DELIVERED:
                totals["accepted" if result.status == ldp_pb2.ACCEPTED else "duplicate"] += 1
                delivered.append(result.report_id)
        self.outbox.acknowledge(delivered)
        settled += len(delivered)
        if settled < len(batch):  # an unknown status (a newer server) keeps reports pending
            import grpc  # already loaded: the upload went through it

            raise TransportError(
                grpc.StatusCode.UNKNOWN,
                f"the server settled {settled} of {len(batch)} reports; the rest stay pending",
            )

    def close(self) -> None:
        self.ledger.close()
        self.outbox.close()
        self.cache.close()
        self.groups.close()
        self.design_keys.close()
        self.repeats.close()
        if self._household_ledger is not None:
            self._household_ledger.close()
