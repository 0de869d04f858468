"""The household a device belongs to: its shared secret, its ledger for household_shared
questions, and the one-respondent-per-household rule (privacy-accounting spec D.2, D.3).

Devices of one household share a 32-byte secret and a household cap, both fixed when the first
device creates the household (``ldp-client household create``) and copied to the others with an
enrolment code (``ldp-client household join``). A household_shared question is answered at most
once per device (a tablet serving several respondents refuses a second answer), is charged to
the household ledger, and its report id is derived from the secret, so the report of a second
device of the household collides with the first one at the aggregator (CONFLICT, final).

The household cap bounds the loss about any member from every shared report of the household
(the local-model group bound: the sum of the members' epsilons, or of their rhos). The devices
do not talk to each other, so each one charges the *group cost*, ``devices x cost``, for each
shared question it answers: ``devices`` devices can then spend at most the cap between them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import os
import sqlite3
import struct
import time
from dataclasses import dataclass

from client.device.database import connect, immediate
from client.device.filekind import DEVICE_STATE, open_read_only
from client.device.ledger import TOLERANCE, LedgerError
from client.mechanisms.base import PrivacyCost

SECRET_BYTES = 32
CODE_PREFIX = "ldph1-"
_CODE_BODY = struct.Struct(">32sddH")  # secret, epsilon cap, rho cap, devices
_CHECK_BYTES = 4
_REPORT_ID_CONTEXT = b"ldp-household-report-id/1"
REPORT_ID_BYTES = 16

_SCHEMA = """
CREATE TABLE IF NOT EXISTS household (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    secret BLOB NOT NULL CHECK (length(secret) = 32),
    epsilon_cap REAL NOT NULL CHECK (epsilon_cap >= 0),
    rho_cap REAL NOT NULL CHECK (rho_cap >= 0),
    devices INTEGER NOT NULL CHECK (devices >= 1),
    source TEXT NOT NULL CHECK (source IN ('created', 'joined')),
    enrolled_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS household_charges (
    survey_id TEXT NOT NULL,
    question_id TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('pure', 'zcdp')),
    cost REAL NOT NULL CHECK (cost > 0),
    charged REAL NOT NULL CHECK (charged > 0),
    timestamp REAL NOT NULL,
    PRIMARY KEY (survey_id, question_id)
);
CREATE TRIGGER IF NOT EXISTS household_fixed BEFORE UPDATE ON household
BEGIN SELECT RAISE(ABORT, 'the household is fixed at enrolment'); END;
CREATE TRIGGER IF NOT EXISTS household_kept BEFORE DELETE ON household
BEGIN SELECT RAISE(ABORT, 'the household is fixed at enrolment'); END;
CREATE TRIGGER IF NOT EXISTS household_charges_no_update BEFORE UPDATE ON household_charges
BEGIN SELECT RAISE(ABORT, 'the household charge log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS household_charges_no_delete BEFORE DELETE ON household_charges
BEGIN SELECT RAISE(ABORT, 'the household charge log is append-only'); END;
"""


class HouseholdError(LedgerError):
    """No household, a bad enrolment code, or a second household for one device."""


class AlreadyAnswered(HouseholdError):  # noqa: N818 (says what happened, like BudgetExceeded)
    """A household_shared question this household has already answered on this device."""


class HouseholdBudgetExceeded(HouseholdError):  # noqa: N818
    """The group cost would overspend the household cap; nothing was charged."""


@dataclass(frozen=True)
class HouseholdTerms:
    """What every device of one household shares: the secret, the caps and the device count."""

    secret: bytes
    epsilon_cap: float
    rho_cap: float = 0.0
    devices: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.secret, bytes) or len(self.secret) != SECRET_BYTES:
            raise HouseholdError(f"a household secret is {SECRET_BYTES} bytes")
        for name in ("epsilon_cap", "rho_cap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise HouseholdError(f"household {name} must be a number, got {value!r}")
            if not (math.isfinite(value) and value >= 0):
                raise HouseholdError(f"household {name} must be finite and >= 0, got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.epsilon_cap == 0 and self.rho_cap == 0:
            raise HouseholdError("a household needs a positive epsilon cap or rho cap")
        devices = self.devices
        if isinstance(devices, bool) or not isinstance(devices, int) or not 1 <= devices <= 1000:
            raise HouseholdError(f"household devices must be an integer 1..1000, got {devices!r}")

    def code(self) -> str:
        """The enrolment code another device joins with: the terms and a checksum, base32."""
        body = _CODE_BODY.pack(self.secret, self.epsilon_cap, self.rho_cap, self.devices)
        check = hashlib.sha256(body).digest()[:_CHECK_BYTES]
        return CODE_PREFIX + base64.b32encode(body + check).decode().rstrip("=").lower()

    @classmethod
    def from_code(cls, code: str) -> HouseholdTerms:
        """Parse an enrolment code (whitespace ignored); HouseholdError if it is not one."""
        text = "".join(code.split()).lower()
        if not text.startswith(CODE_PREFIX):
            raise HouseholdError(f"not a household code (it starts with {CODE_PREFIX!r})")
        data = text[len(CODE_PREFIX) :].upper()
        try:
            raw = base64.b32decode(data + "=" * (-len(data) % 8))
        except ValueError:
            raise HouseholdError("not a household code (invalid characters)") from None
        body, check = raw[:-_CHECK_BYTES], raw[-_CHECK_BYTES:]
        if len(body) != _CODE_BODY.size or hashlib.sha256(body).digest()[:_CHECK_BYTES] != check:
            raise HouseholdError("the household code is damaged (checksum mismatch)")
        secret, epsilon_cap, rho_cap, devices = _CODE_BODY.unpack(body)
        return cls(secret, epsilon_cap, rho_cap, devices)

    def report_id(self, survey_id: str, question_id: str) -> bytes:
        """The report id of a household_shared question: HMAC-SHA256 of the survey and
        question ids under the secret, truncated to 16 bytes. Every device of the household
        derives the same id, so the aggregator counts one report per household."""
        message = b"\0".join((_REPORT_ID_CONTEXT, survey_id.encode(), question_id.encode()))
        return hmac.new(self.secret, message, hashlib.sha256).digest()[:REPORT_ID_BYTES]


def household_secret(path: str | os.PathLike[str]) -> bytes | None:
    """The household secret enrolled in the device state at ``path``, or None (no household,
    or no state file). Read only; for callers that key something on the household."""
    if not os.path.exists(path):
        return None
    with Household.read_only(path) as household:
        return None if household is None else household.terms.secret


class Household:
    """The household enrolled in one device state file, and its ledger of shared questions."""

    def __init__(self, conn: sqlite3.Connection, terms: HouseholdTerms, source: str) -> None:
        self._conn = conn
        self.terms = terms
        self.source = source

    @classmethod
    def enrol(cls, path: str | os.PathLike[str], terms: HouseholdTerms, source: str) -> Household:
        """Enrol ``terms`` in the device state (created 0600 if new). Enrolling the same terms
        again is a no-op; a device already in another household raises HouseholdError."""
        conn = connect(path)
        try:
            conn.executescript(_SCHEMA)
            with immediate(conn):
                stored = _stored(conn)
                if stored is None:
                    conn.execute(
                        "INSERT INTO household VALUES (1, ?, ?, ?, ?, ?, ?)",
                        (
                            terms.secret,
                            terms.epsilon_cap,
                            terms.rho_cap,
                            terms.devices,
                            source,
                            time.time(),
                        ),
                    )
                    return cls(conn, terms, source)
            if stored[0] != terms:
                raise HouseholdError(f"{path} already belongs to another household")
            return cls(conn, *stored)
        except BaseException:
            conn.close()
            raise

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Household | None:
        """The household of a device state opened for charging, or None if none is enrolled."""
        conn = connect(path)
        conn.executescript(_SCHEMA)
        stored = _stored(conn)
        if stored is None:
            conn.close()
            return None
        return cls(conn, *stored)

    @classmethod
    def read_only(cls, path: str | os.PathLike[str]) -> _ReadOnly:
        """A context manager giving the household of an existing state file, or None; nothing
        is created or changed."""
        return _ReadOnly(path)

    def spent(self) -> tuple[float, float]:
        """The group cost charged so far: (epsilon, rho)."""
        sums: dict[str, list[float]] = {"pure": [], "zcdp": []}
        for kind, charged in self._conn.execute("SELECT kind, charged FROM household_charges"):
            sums[kind].append(charged)
        return math.fsum(sums["pure"]), math.fsum(sums["zcdp"])

    def answered(self, survey_id: str, question_id: str) -> bool:
        """Whether this device has answered the shared question for its household."""
        row = self._conn.execute(
            "SELECT 1 FROM household_charges WHERE survey_id = ? AND question_id = ?",
            (survey_id, question_id),
        ).fetchone()
        return row is not None

    def check(self, survey_id: str, question_id: str, cost: PrivacyCost) -> None:
        """Raise AlreadyAnswered or HouseholdBudgetExceeded unless ``charge`` would pass now."""
        self._admit(survey_id, question_id, cost)

    def charge(self, survey_id: str, question_id: str, cost: PrivacyCost) -> float:
        """Record the group cost of answering a shared question; returns it. Raises (and
        records nothing) for a second answer or a cost over the household cap."""
        with immediate(self._conn):
            charged = self._admit(survey_id, question_id, cost)
            self._conn.execute(
                "INSERT INTO household_charges VALUES (?, ?, ?, ?, ?, ?)",
                (survey_id, question_id, cost.kind, float(cost.value), charged, time.time()),
            )
        return charged

    def _admit(self, survey_id: str, question_id: str, cost: PrivacyCost) -> float:
        if self.answered(survey_id, question_id):
            raise AlreadyAnswered(
                f"survey {survey_id}, question {question_id} is household_shared and this "
                "household has already answered it on this device (one respondent per household)"
            )
        charged = self.terms.devices * float(cost.value)
        spent_pure, spent_rho = self.spent()
        spent, cap, name = (
            (spent_pure, self.terms.epsilon_cap, "epsilon")
            if cost.kind == "pure"
            else (spent_rho, self.terms.rho_cap, "rho")
        )
        if spent + charged > cap + TOLERANCE * cap:
            raise HouseholdBudgetExceeded(
                f"household cap refuses {name} {charged:.6g} ({self.terms.devices} device(s) x "
                f"{float(cost.value):.6g}) for shared question {question_id}: "
                f"{max(0.0, cap - spent):.6g} of {cap:.6g} left"
            )
        return charged

    def status(self) -> dict[str, object]:
        """What ``ldp-client budget`` shows (never the secret)."""
        spent_pure, spent_rho = self.spent()
        count = self._conn.execute("SELECT count(*) FROM household_charges").fetchone()[0]
        return {
            "source": self.source,
            "devices": self.terms.devices,
            "epsilon_cap": self.terms.epsilon_cap,
            "rho_cap": self.terms.rho_cap,
            "spent_epsilon": spent_pure,
            "spent_rho": spent_rho,
            "shared_answers": count,
        }

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Household:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _ReadOnly:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = path
        self._household: Household | None = None

    def __enter__(self) -> Household | None:
        conn = open_read_only(self._path, DEVICE_STATE)
        try:
            stored = _stored(conn)
        except sqlite3.OperationalError:  # no household table: never enrolled
            stored = None
        if stored is None:
            conn.close()
            return None
        self._household = Household(conn, *stored)
        return self._household

    def __exit__(self, *exc_info: object) -> None:
        if self._household is not None:
            self._household.close()


def _stored(conn: sqlite3.Connection) -> tuple[HouseholdTerms, str] | None:
    row = conn.execute(
        "SELECT secret, epsilon_cap, rho_cap, devices, source FROM household WHERE id = 1"
    ).fetchone()
    if row is None:
        return None
    return HouseholdTerms(bytes(row[0]), row[1], row[2], row[3]), row[4]


def create_terms(epsilon_cap: float, rho_cap: float = 0.0, devices: int = 1) -> HouseholdTerms:
    """New household terms with a fresh secret from the OS's secure source."""
    return HouseholdTerms(os.urandom(SECRET_BYTES), epsilon_cap, rho_cap, devices)
