"""The device ledger: the two-bucket filter of privacy-accounting §A.2 on a real SQLite file."""

from __future__ import annotations

import inspect
import math
import multiprocessing
import sqlite3
import time

import pytest

from client.device.ledger import Budget, BudgetExceeded, Charge, Ledger, LedgerConfigError
from client.mechanisms.base import PrivacyCost

LN_INV_DELTA = math.log(1e6)


def rr(epsilon: float) -> PrivacyCost:
    return PrivacyCost("pure", epsilon)


def gauss(rho: float) -> PrivacyCost:
    return PrivacyCost("zcdp", rho)


def charge(ledger: Ledger, cost: PrivacyCost, n: int = 0) -> Charge:
    return ledger.charge(
        cost, request_id=f"req-{n}", survey_id="s1", question_id=f"q{n}", mechanism="rr"
    )


def capacity(ledger: Ledger, cost: PrivacyCost) -> int:
    """Charge ``cost`` until refused; the number accepted."""
    n = 0
    while True:
        try:
            charge(ledger, cost, n)
        except BudgetExceeded:
            return n
        n += 1


def to_epsilon(xi: float, rho: float) -> float:
    return xi + rho + 2 * math.sqrt(rho * LN_INV_DELTA)


@pytest.fixture
def db(tmp_path):
    return tmp_path / "device.db"


# --- budget and the spec's numbers (§A.5) -----------------------------------------------------


@pytest.mark.parametrize(
    ("pointwise", "rho_cap"), [(0, 1.3530), (5, 0.3853), (7, 0.1473), (10, 0.0)]
)
def test_rho_cap_matches_spec_splits(pointwise, rho_cap):
    budget = Budget(10, 1e-6, pointwise=pointwise)
    assert round(budget.rho_cap, 4) == rho_cap
    assert to_epsilon(pointwise, budget.rho_cap) == pytest.approx(10, abs=1e-12)


def test_pure_budget_is_normalized_and_pure():
    assert Budget(3) == Budget(3.0, pointwise=3)
    assert Budget(3).pointwise == 3.0
    assert Budget(3).rho_cap == 0
    assert Budget(3).guarantee() == "pure 3-LDP"
    assert Budget(10, pointwise=0).guarantee() == "(10, 1e-06)-DP"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"epsilon": 0},
        {"epsilon": -1},
        {"epsilon": math.nan},
        {"epsilon": math.inf},
        {"epsilon": True},
        {"epsilon": "10"},
        {"epsilon": 10, "delta": 0},
        {"epsilon": 10, "delta": 1},
        {"epsilon": 10, "delta": math.nan},
        {"epsilon": 10, "pointwise": -0.5},
        {"epsilon": 10, "pointwise": 10.5},
        {"epsilon": 10, "pointwise": math.nan},
    ],
)
def test_invalid_budget_is_refused(kwargs):
    with pytest.raises(LedgerConfigError):
        Budget(**kwargs)


def test_capacity_pure_budget_ten_rr_answers(db):
    with Ledger(db, Budget(10)) as ledger:
        for n in range(10):
            assert charge(ledger, rr(1), n).bucket == "pointwise"
        with pytest.raises(BudgetExceeded):
            charge(ledger, rr(1), 10)
        assert ledger.spent() == (10.0, 0.0)
        assert len(ledger.charges()) == 10
        assert ledger.guarantee() == "pure 10-LDP: used 10 of 10 (pointwise)"


def test_capacity_all_zcdp_budget(db):
    with Ledger(db, Budget(10, pointwise=0)) as ledger:
        assert capacity(ledger, rr(1)) == 2
        assert {c.bucket for c in ledger.charges()} == {"concentrated"}
        assert ledger.spent() == (0.0, 1.0)


def test_capacity_small_epsilon_with_tolerance(tmp_path):
    with Ledger(tmp_path / "pure.db", Budget(10)) as ledger:
        assert capacity(ledger, rr(0.1)) == 100  # floating sums of 0.1 still fit exactly 100
        assert ledger.spent()[0] == pytest.approx(10, abs=1e-11)
    with Ledger(tmp_path / "zcdp.db", Budget(10, pointwise=0)) as ledger:
        assert capacity(ledger, rr(0.1)) == 270  # spec §A.5: zCDP capacity for eps = 0.1


def test_ten_tenths_fit_one(db):
    with Ledger(db, Budget(1.0)) as ledger:
        assert capacity(ledger, rr(0.1)) == 10
        spent, _ = ledger.spent()
        assert spent <= 1.0 * (1 + 1e-12)


def test_mixed_client_two_buckets(db):
    epsilon_g = to_epsilon(5, 0.5)
    assert round(epsilon_g, 3) == 10.757  # spec §A.5
    budget = Budget(epsilon_g, 1e-6, pointwise=5)
    assert budget.rho_cap == pytest.approx(0.5, rel=1e-12)
    with Ledger(db, budget) as ledger:
        for n in range(5):
            assert charge(ledger, rr(1), n).bucket == "pointwise"
            got = charge(ledger, gauss(0.1), 100 + n)
            assert (got.bucket, got.charged) == ("concentrated", 0.1)
        assert not ledger.can_afford(rr(1))
        assert not ledger.can_afford(gauss(0.1))
        pointwise, concentrated = ledger.spent()
        assert (pointwise, concentrated) == (5, pytest.approx(0.5))
        assert to_epsilon(pointwise, budget.rho_cap) == pytest.approx(epsilon_g)
        assert ledger.guarantee() == (
            "(10.7565, 1e-06)-DP: used 5 of 5 (pointwise) and 0.5 of 0.5 (zCDP)"
        )


def test_pure_request_spills_into_concentrated_bucket(db):
    with Ledger(db, Budget(10, pointwise=7)) as ledger:  # rho_g = 0.1473
        for n in range(7):
            charge(ledger, rr(1), n)
        spill = charge(ledger, rr(0.5), 7)
        assert (spill.bucket, spill.cost, spill.charged) == ("concentrated", 0.5, 0.125)
        assert ledger.spent() == (7.0, 0.125)
        assert ledger.remaining() == pytest.approx((0.0, 0.1473 - 0.125), abs=1e-4)


def test_refused_charge_changes_nothing_and_cheaper_one_is_accepted(db):
    with Ledger(db, Budget(10, pointwise=7)) as ledger:
        for n in range(7):
            charge(ledger, rr(1), n)
        before = (ledger.spent(), ledger.charges())
        assert not ledger.can_afford(rr(1))  # 0.5 > rho_g = 0.1473
        with pytest.raises(BudgetExceeded):
            charge(ledger, rr(1), 7)
        with pytest.raises(BudgetExceeded):
            charge(ledger, gauss(0.2), 8)
        assert (ledger.spent(), ledger.charges()) == before
        assert ledger.can_afford(gauss(0.1))
        assert charge(ledger, gauss(0.1), 9).sequence == 8


def test_charge_record(db):
    with Ledger(db, Budget(10, pointwise=0)) as ledger:
        got = ledger.charge(
            gauss(0.25), request_id="r1", survey_id="s", question_id="q", mechanism="gauss(k=4)"
        )
        assert got == ledger.charges()[0]
        assert (got.sequence, got.request_id, got.survey_id, got.question_id) == (1, "r1", "s", "q")
        assert (got.mechanism, got.kind, got.cost, got.bucket, got.charged) == (
            "gauss(k=4)",
            "zcdp",
            0.25,
            "concentrated",
            0.25,
        )
        assert got.timestamp > 0


def _smuggled(value: object) -> PrivacyCost:
    """A PrivacyCost whose value bypassed its own validation."""
    cost = PrivacyCost("pure", 1.0)
    object.__setattr__(cost, "value", value)
    return cost


@pytest.mark.parametrize(
    "cost",
    [
        _smuggled(-1.0),
        _smuggled(0.0),
        _smuggled(math.nan),
        _smuggled(math.inf),
        _smuggled(True),
        _smuggled("1"),
        1.0,
        ("pure", 1.0),
        None,
    ],
    ids=repr,
)
def test_invalid_cost_is_refused_without_charging(db, cost):
    with Ledger(db, Budget(10)) as ledger:
        charge(ledger, rr(1))
        with pytest.raises(ValueError):
            ledger.can_afford(cost)
        with pytest.raises(ValueError):
            charge(ledger, cost, 1)
        assert ledger.spent() == (1.0, 0.0)
        assert len(ledger.charges()) == 1


def test_huge_pure_cost_is_refused(db):
    with Ledger(db, Budget(10, pointwise=0)) as ledger:
        with pytest.raises(BudgetExceeded):
            charge(ledger, rr(1e200))  # eps^2 / 2 overflows to inf: refused, not an error
        assert ledger.charges() == []


# --- persistence ------------------------------------------------------------------------------


def test_state_and_budget_survive_reopen(db):
    budget = Budget(10, pointwise=5)
    with Ledger(db, budget) as ledger:
        charge(ledger, rr(1), 0)
        charge(ledger, gauss(0.1), 1)
        log = ledger.charges()
    with Ledger(db) as reopened:
        assert reopened.budget == budget
        assert reopened.charges() == log
        assert reopened.spent() == (1.0, 0.1)
        assert charge(reopened, rr(1), 2).sequence == 3
    with Ledger(db, Budget(10, 1e-6, pointwise=5.0)) as same:
        assert same.spent() == (2.0, 0.1)


@pytest.mark.parametrize(
    "other", [Budget(11, pointwise=5), Budget(10, 1e-7, pointwise=5), Budget(10, pointwise=6)]
)
def test_reopen_with_different_budget_raises(db, other):
    Ledger(db, Budget(10, pointwise=5)).close()
    with pytest.raises(LedgerConfigError):
        Ledger(db, other)
    with Ledger(db) as ledger:
        assert ledger.budget == Budget(10, pointwise=5)


def test_open_without_budget_and_nothing_stored_raises(db):
    with pytest.raises(LedgerConfigError):
        Ledger(db)
    with Ledger(db, Budget(2)) as ledger:  # nothing was enrolled by the failed open
        assert ledger.budget == Budget(2)


def test_charge_log_and_budget_are_append_only(db):
    with Ledger(db, Budget(10)) as ledger:
        charge(ledger, rr(1))
    conn = sqlite3.connect(db)
    for statement in (
        "UPDATE ledger_charges SET charged = 0",
        "DELETE FROM ledger_charges",
        "UPDATE ledger_budget SET epsilon = 100",
        "DELETE FROM ledger_budget",
    ):
        with pytest.raises(sqlite3.DatabaseError):
            conn.execute(statement)
    conn.close()
    with Ledger(db) as ledger:
        assert ledger.spent() == (1.0, 0.0)


# --- concurrency ------------------------------------------------------------------------------


def _charge_twenty_halves(path: str, start, results) -> None:
    with Ledger(path) as ledger:
        start.wait()
        accepted = 0
        for n in range(20):
            time.sleep(0.001)  # let the other process in between charges
            try:
                charge(ledger, rr(0.5), n)
                accepted += 1
            except BudgetExceeded:
                pass
        results.put(accepted)


def test_two_processes_never_overspend(db):
    Ledger(db, Budget(10)).close()
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(2), ctx.Queue()
    workers = [
        ctx.Process(target=_charge_twenty_halves, args=(str(db), start, results)) for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    accepted = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    assert sum(accepted) == 20
    with Ledger(db) as ledger:
        assert ledger.spent() == (10.0, 0.0)
        assert len(ledger.charges()) == 20


# --- refusals do not depend on the answer (§A.4 rule 3) -----------------------------------------


def test_decisions_depend_only_on_the_costs(tmp_path):
    for method in (Ledger.charge, Ledger.can_afford):
        assert "answer" not in inspect.signature(method).parameters
        assert "value" not in inspect.signature(method).parameters
    costs = [rr(1), gauss(0.2), rr(3), rr(2), gauss(0.05), rr(0.5), rr(4), gauss(0.1), rr(0.1)]

    def decisions(path, survey: str, mechanism: str) -> list[bool]:
        out = []
        with Ledger(path, Budget(8, pointwise=5)) as ledger:
            for n, cost in enumerate(costs):
                affordable = ledger.can_afford(cost)
                try:
                    ledger.charge(
                        cost, request_id=str(n), survey_id=survey, question_id=str(n),
                        mechanism=mechanism,
                    )  # fmt: skip
                    out.append(True)
                except BudgetExceeded:
                    out.append(False)
                assert affordable == out[-1]
        return out

    first = decisions(tmp_path / "a.db", "survey-a", "rr(k=2)")
    assert first == decisions(tmp_path / "b.db", "survey-b", "rr(k=7)")
    assert True in first and False in first
