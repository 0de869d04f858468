"""The device's privacy budget ledger: the two-bucket filter of privacy-accounting spec §A.2.

A budget ``(eps_g, delta)`` is split once, at enrollment, into a pointwise cap ``Xi_g`` for pure
reports and a concentrated (zCDP) cap ``rho_g = rho_cap(eps_g - Xi_g, delta)``. Every request is
admitted or refused *before* anything is randomized, from the ledger state and the requested cost
only (the ledger never sees an answer), so the whole transcript of the device is
``(eps_g, delta)``-DP however adaptively the server chooses its questions; with ``Xi_g = eps_g`` it
is pure ``eps_g``-LDP. A pure-only device may instead be enrolled under the best-of rule of §A.3
(``Budget(..., best_of=True)``): a pure request is admitted if the basic sum still fits ``eps_g``
*or* the sum of ``eps^2 / 2`` still fits ``rho_cap(eps_g, delta)``; the device stays pure
``eps_g``-LDP while the basic sum fits, and is ``(eps_g, delta)``-DP afterwards.

The ledger is an append-only charge log in SQLite (WAL, ``synchronous=FULL``); the spent totals are
derived from the log, charges are never refunded (§A.4), and each admission runs inside
``BEGIN IMMEDIATE`` so that processes sharing the file cannot both pass the test and overspend.
"""

from __future__ import annotations

import math
import numbers
import os
import sqlite3
import time
from dataclasses import dataclass

from client.device.accounting import OdometerReading, rho_cap
from client.device.accounting import odometer as zcdp_odometer
from client.device.database import connect, immediate
from client.device.filekind import DEVICE_STATE, open_read_only
from client.mechanisms.base import PrivacyCost

#: Relative slack in admission tests, so that e.g. ten charges of 0.1 fit a budget of 1.0.
TOLERANCE = 1e-12

POINTWISE = "pointwise"
CONCENTRATED = "concentrated"
TWO_BUCKET = "two-bucket"
BEST_OF = "best-of"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger_budget (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epsilon REAL NOT NULL,
    delta REAL NOT NULL,
    pointwise REAL NOT NULL,
    enrolled_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ledger_charges (
    sequence INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL,
    survey_id TEXT NOT NULL,
    question_id TEXT NOT NULL,
    mechanism TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('pure', 'zcdp')),
    cost REAL NOT NULL CHECK (cost > 0),
    bucket TEXT NOT NULL CHECK (bucket IN ('pointwise', 'concentrated')),
    charged REAL NOT NULL CHECK (charged > 0),
    timestamp REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ledger_policy (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    policy TEXT NOT NULL CHECK (policy IN ('two-bucket', 'best-of'))
);
CREATE TRIGGER IF NOT EXISTS ledger_policy_fixed BEFORE UPDATE ON ledger_policy
BEGIN SELECT RAISE(ABORT, 'the budget is fixed at enrollment'); END;
CREATE TRIGGER IF NOT EXISTS ledger_policy_kept BEFORE DELETE ON ledger_policy
BEGIN SELECT RAISE(ABORT, 'the budget is fixed at enrollment'); END;
CREATE TRIGGER IF NOT EXISTS ledger_budget_fixed BEFORE UPDATE ON ledger_budget
BEGIN SELECT RAISE(ABORT, 'the budget is fixed at enrollment'); END;
CREATE TRIGGER IF NOT EXISTS ledger_budget_kept BEFORE DELETE ON ledger_budget
BEGIN SELECT RAISE(ABORT, 'the budget is fixed at enrollment'); END;
CREATE TRIGGER IF NOT EXISTS ledger_charges_no_update BEFORE UPDATE ON ledger_charges
BEGIN SELECT RAISE(ABORT, 'the charge log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS ledger_charges_no_delete BEFORE DELETE ON ledger_charges
BEGIN SELECT RAISE(ABORT, 'the charge log is append-only'); END;
"""


class LedgerError(Exception):
    """Base class of ledger errors."""


class BudgetExceeded(LedgerError):  # noqa: N818 (public name fixed by the design)
    """The charge would overspend the budget; nothing was charged."""


class LedgerConfigError(LedgerError):
    """An invalid budget, or a budget that differs from the one stored at enrollment."""


def _positive_finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise LedgerConfigError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise LedgerConfigError(f"{name} must be positive and finite, got {value!r}")
    return value


@dataclass(frozen=True, init=False)
class Budget:
    """A device's lifetime budget and its split, fixed at enrollment (§A.2).

    ``pointwise`` is the cap ``Xi_g`` of the pure bucket; ``None`` means ``epsilon`` (a pure-LDP
    deployment with ``rho_g = 0``) and is normalized to that value, so ``Budget(3)`` equals
    ``Budget(3, pointwise=3)``. ``delta`` only matters for the concentrated bucket, and for the
    zCDP side of the best-of rule (``best_of``, pure budgets only, privacy-accounting spec §A.3).
    """

    epsilon: float
    delta: float
    pointwise: float  # never None once built: None at construction means epsilon
    best_of: bool

    def __init__(
        self,
        epsilon: float,
        delta: float = 1e-6,
        pointwise: float | None = None,
        best_of: bool = False,
    ) -> None:
        epsilon = _positive_finite("epsilon", epsilon)
        delta = _positive_finite("delta", delta)
        if delta >= 1:
            raise LedgerConfigError(f"delta must lie in (0, 1), got {delta!r}")
        share: object = epsilon if pointwise is None else pointwise
        if isinstance(share, bool) or not isinstance(share, numbers.Real):
            raise LedgerConfigError(f"pointwise must be a real number, got {share!r}")
        cap = float(share)
        if not 0 <= cap <= epsilon:
            raise LedgerConfigError(f"pointwise must lie in [0, {epsilon!r}], got {cap!r}")
        if not isinstance(best_of, bool):
            raise LedgerConfigError(f"best_of must be true or false, got {best_of!r}")
        if best_of and cap != epsilon:
            raise LedgerConfigError(
                "the best-of rule is for pure-only devices: it cannot be combined with a "
                "pointwise share below the budget (spec A.3)"
            )
        object.__setattr__(self, "epsilon", epsilon)
        object.__setattr__(self, "delta", delta)
        object.__setattr__(self, "pointwise", cap)
        object.__setattr__(self, "best_of", best_of)

    @property
    def rho_cap(self) -> float:
        """``rho_g``: the largest rho with ``Xi_g + rho + 2 sqrt(rho ln(1/delta)) <= eps_g``.

        Computed as ``E^2 / (sqrt(L + E) + sqrt(L))^2``, the cancellation-free form of
        ``(sqrt(L + E) - sqrt(L))^2`` with ``E = eps_g - Xi_g`` and ``L = ln(1/delta)``.
        """
        return rho_cap(self.epsilon - self.pointwise, self.delta)

    @property
    def best_of_rho_cap(self) -> float:
        """The zCDP side of the best-of rule: ``rho_cap(eps_g, delta)`` (0 without best-of)."""
        return rho_cap(self.epsilon, self.delta) if self.best_of else 0.0

    @property
    def policy(self) -> str:
        """The admission rule: "best-of" (§A.3) or "two-bucket" (§A.2)."""
        return BEST_OF if self.best_of else TWO_BUCKET

    def guarantee(self) -> str:
        """The guarantee the filter gives for the device's whole transcript."""
        if self.best_of:
            return (
                f"pure {self.epsilon:.6g}-LDP while the basic sum fits, "
                f"({self.epsilon:.6g}, {self.delta:.6g})-DP after (best-of rule)"
            )
        if self.rho_cap == 0:
            return f"pure {self.epsilon:.6g}-LDP"
        return f"({self.epsilon:.6g}, {self.delta:.6g})-DP"


@dataclass(frozen=True)
class Charge:
    """One entry of the append-only charge log.

    ``cost`` is the request's epsilon or rho; ``charged`` is what was added to ``bucket``: epsilon
    (pointwise), rho, or epsilon^2 / 2 for a pure report in the concentrated bucket. Under the
    best-of rule every charge is pure and recorded as pointwise epsilon; its zCDP side is
    derived from the costs.
    """

    sequence: int
    request_id: str
    survey_id: str
    question_id: str
    mechanism: str
    kind: str
    cost: float
    bucket: str
    charged: float
    timestamp: float


def _check_cost(cost: object) -> PrivacyCost:
    """Re-validate a cost: a negative or non-finite charge would silently grow the budget."""
    if not isinstance(cost, PrivacyCost):
        raise ValueError(f"cost must be a PrivacyCost, got {cost!r}")
    value = cost.value
    valid_value = (
        not isinstance(value, bool)
        and isinstance(value, numbers.Real)
        and math.isfinite(value)
        and value > 0
    )
    if cost.kind not in ("pure", "zcdp") or not valid_value:
        raise ValueError(f"invalid privacy cost {cost!r}")
    return cost


def _fits(total: float, cap: float) -> bool:
    return total <= cap + TOLERANCE * cap


def _stored_budget(conn: sqlite3.Connection) -> Budget | None:
    """The enrolled budget (a ledger from before policies were stored is two-bucket)."""
    query = "SELECT epsilon, delta, pointwise FROM ledger_budget WHERE id = 1"
    row = conn.execute(query).fetchone()
    if row is None:
        return None
    has_policy = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'ledger_policy'"
    ).fetchone()
    policy = has_policy and conn.execute("SELECT policy FROM ledger_policy WHERE id = 1").fetchone()
    epsilon, delta, pointwise = row
    return Budget(epsilon, delta, pointwise, best_of=bool(policy) and policy[0] == BEST_OF)


class Ledger:
    """The privacy filter of one device (two-bucket, or best-of), persisted in SQLite at ``path``.

    The first open of a database enrolls ``budget``; later opens may pass ``None`` (use the stored
    budget) or the same budget, anything else raises ``LedgerConfigError``.
    """

    def __init__(self, path: str | os.PathLike[str], budget: Budget | None = None) -> None:
        self._conn = connect(path)
        try:
            self._budget = self._enroll(budget)
        except BaseException:
            self._conn.close()
            raise

    @classmethod
    def read_only(cls, path: str | os.PathLike[str]) -> Ledger:
        """Open an enrolled device state file for reading only (``ldp-client budget``): nothing
        is created or changed; FileKindError for a file that is not a device state."""
        ledger = cls.__new__(cls)
        ledger._conn = open_read_only(path, DEVICE_STATE)
        try:
            budget = _stored_budget(ledger._conn)
        except sqlite3.DatabaseError:
            budget = None
        if budget is None:
            ledger._conn.close()
            raise LedgerConfigError(f"no budget is enrolled in {path}")
        ledger._budget = budget
        return ledger

    def _enroll(self, budget: Budget | None) -> Budget:
        self._conn.executescript(_SCHEMA)
        with immediate(self._conn):
            stored = _stored_budget(self._conn)
            if stored is None:
                if budget is None:
                    raise LedgerConfigError("no budget is enrolled in this ledger; pass one")
                self._conn.execute(
                    "INSERT INTO ledger_budget VALUES (1, ?, ?, ?, ?)",
                    (budget.epsilon, budget.delta, budget.pointwise, time.time()),
                )
                self._conn.execute("INSERT INTO ledger_policy VALUES (1, ?)", (budget.policy,))
                return budget
        if budget is not None and budget != stored:
            raise LedgerConfigError(f"this ledger was enrolled with {stored}, not {budget}")
        return stored

    @property
    def budget(self) -> Budget:
        """The budget fixed at enrollment."""
        return self._budget

    def spent(self) -> tuple[float, float]:
        """``(S, R)``: the pointwise and concentrated totals, summed exactly from the log."""
        sums: dict[str, list[float]] = {POINTWISE: [], CONCENTRATED: []}
        for bucket, charged in self._conn.execute("SELECT bucket, charged FROM ledger_charges"):
            sums[bucket].append(charged)
        return math.fsum(sums[POINTWISE]), math.fsum(sums[CONCENTRATED])

    def best_of_spent(self) -> float:
        """The best-of rule's zCDP side: the sum of ``eps^2 / 2`` over all charges (§A.3)."""
        rows = self._conn.execute("SELECT cost FROM ledger_charges WHERE kind = 'pure'")
        return math.fsum(cost * cost / 2 for (cost,) in rows)

    def _admit(self, cost: PrivacyCost, spent: tuple[float, float]) -> tuple[str, float] | None:
        """The admission test of §A.2 (or §A.3 under best-of): ``(bucket, amount)`` to charge,
        or ``None`` to refuse."""
        pointwise, concentrated = spent
        value = float(cost.value)
        if self._budget.best_of:  # every charge is pure and recorded in the pointwise bucket
            if cost.kind != "pure":
                return None
            fits = _fits(pointwise + value, self._budget.epsilon) or _fits(
                self.best_of_spent() + value * value / 2, self._budget.best_of_rho_cap
            )
            return (POINTWISE, value) if fits else None
        if cost.kind == "zcdp":
            rho = value
        elif _fits(pointwise + value, self._budget.pointwise):
            return POINTWISE, value
        else:
            rho = value * value / 2  # a pure report is (eps^2 / 2)-zCDP; inf if it overflows
        return (CONCENTRATED, rho) if _fits(concentrated + rho, self._budget.rho_cap) else None

    def can_afford(self, cost: PrivacyCost) -> bool:
        """Whether ``charge`` would accept ``cost`` now (without charging it)."""
        return self._admit(_check_cost(cost), self.spent()) is not None

    def charge(
        self,
        cost: PrivacyCost,
        *,
        request_id: str,
        survey_id: str,
        question_id: str,
        mechanism: str,
    ) -> Charge:
        """Admit and record one report's cost, or raise ``BudgetExceeded`` and record nothing.

        Call it before randomizing: once it returns, the cost is spent for good, whether or not
        the report is ever produced or delivered. Every call is a separate charge (each licenses
        one fresh randomization); ``request_id`` is recorded for audit, not deduplicated.
        """
        cost = _check_cost(cost)
        with immediate(self._conn):
            admitted = self._admit(cost, self.spent())
            if admitted is None:
                raise BudgetExceeded(self._refusal(cost))
            bucket, charged = admitted
            row = (
                request_id,
                survey_id,
                question_id,
                mechanism,
                cost.kind,
                float(cost.value),
                bucket,
                charged,
                time.time(),
            )
            cursor = self._conn.execute(
                "INSERT INTO ledger_charges (request_id, survey_id, question_id, mechanism, kind,"
                " cost, bucket, charged, timestamp) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
            if cursor.lastrowid is None:  # sqlite3 sets it after every INSERT
                raise LedgerError("the charge log gave no sequence number")
        return Charge(cursor.lastrowid, *row)

    def _refusal(self, cost: PrivacyCost) -> str:
        """Why a charge is refused: the bucket that would pay, and how much it lacks."""
        left_pure, left_rho = self.remaining()
        value = float(cost.value)
        if self._budget.best_of:
            left_best = max(0.0, self._budget.best_of_rho_cap - self.best_of_spent())
            need = (
                "a pure cost (this device was enrolled pure under the best-of rule)"
                if cost.kind != "pure"
                else f"epsilon {value:.6g} within the basic sum, which has {left_pure:.6g} left, "
                f"or eps^2/2 = {value * value / 2:.6g} within the best-of zCDP side, which has "
                f"{left_best:.6g} left"
            )
            return f"{cost.kind} cost refused: needs {need}; {self.guarantee()}"
        if cost.kind == "zcdp":
            need = f"rho {value:.6g} from the zCDP bucket, which has {left_rho:.6g} left"
            if self._budget.rho_cap == 0:
                need += " (none at all: this device was enrolled pure, --pointwise = --budget)"
            else:
                need += f" (missing {value - left_rho:.6g})"
        else:
            need = (
                f"epsilon {value:.6g} from the pointwise bucket, which has {left_pure:.6g} left "
                f"(missing {value - left_pure:.6g}), or rho {value * value / 2:.6g} from the "
                f"zCDP bucket, which has {left_rho:.6g} left"
            )
        return f"{cost.kind} cost refused: needs {need}; {self.guarantee()}"

    def charges(self) -> list[Charge]:
        """The whole charge log, oldest first."""
        rows = self._conn.execute("SELECT * FROM ledger_charges ORDER BY sequence")
        return [Charge(*row) for row in rows]

    def remaining(self) -> tuple[float, float]:
        """``(Xi_g - S, rho_g - R)``, floored at zero."""
        pointwise, concentrated = self.spent()
        return (
            max(0.0, self._budget.pointwise - pointwise),
            max(0.0, self._budget.rho_cap - concentrated),
        )

    def guarantee(self) -> str:
        """The preset guarantee and how much of each bucket is used (privacy-accounting spec
        §B.4 UI rule)."""
        pointwise, concentrated = self.spent()
        budget = self._budget
        if budget.best_of:
            state = "pure" if _fits(pointwise, budget.epsilon) else "on its zCDP side"
            return (
                f"{budget.guarantee()}: used {pointwise:.6g} of {budget.epsilon:.6g} (basic sum) "
                f"and {self.best_of_spent():.6g} of {budget.best_of_rho_cap:.6g} (zCDP side); "
                f"now {state}"
            )
        text = f"{budget.guarantee()}: used {pointwise:.6g} of {budget.pointwise:.6g} (pointwise)"
        if budget.rho_cap == 0:
            return text
        return f"{text} and {concentrated:.6g} of {budget.rho_cap:.6g} (zCDP)"

    def odometer(self) -> OdometerReading:
        """The loss so far as (epsilon, delta) at the budget's delta (privacy-accounting spec §B.4):
        ``S + odo(R)`` for the two-bucket filter; under best-of the smaller of the certain basic sum
        and ``odo(sum of eps^2 / 2)``. For display beside the filter, which is what enforces."""
        pointwise, concentrated = self.spent()
        delta = self._budget.delta
        if not self._budget.best_of:
            return zcdp_odometer(concentrated, delta, pointwise)
        reading = zcdp_odometer(self.best_of_spent(), delta)
        return reading if reading.epsilon < pointwise else OdometerReading(pointwise, 0.0, "exact")

    def close(self) -> None:
        """Close the database connection."""
        self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
