"""The running budget: the best-of rule for pure-only devices (privacy-accounting spec §A.3) and
the zCDP odometer (§B.4), checked against the spec's printed numbers, on real SQLite ledgers,
and through ``ldp-client budget``."""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess

import pytest
from cli_runner import run_cli

from client.device.accounting import fallback_bound, odometer, rho_cap, zcdp_to_epsilon
from client.device.household import HouseholdTerms, create_terms
from client.device.ledger import Budget, BudgetExceeded, Ledger, LedgerConfigError
from client.mechanisms.base import PrivacyCost


def rr(epsilon: float) -> PrivacyCost:
    return PrivacyCost("pure", epsilon)


def capacity(ledger: Ledger, epsilon: float) -> int:
    n = 0
    while True:
        try:
            ledger.charge(
                rr(epsilon), request_id=f"r{n}", survey_id="s", question_id="q", mechanism="rr"
            )
        except BudgetExceeded:
            return n
        n += 1


def client(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return run_cli("client", *args, input=stdin)  # in this process (tests/cli_runner.py)


# --- the formulas ------------------------------------------------------------------------------


def test_conversions_match_the_spec():
    # §A.5: "Budget eps_g = 10, delta = 1e-6: rho_cap = 1.3530 (check: converts back to 10.000)"
    assert rho_cap(10, 1e-6) == pytest.approx(1.3530, abs=5e-5)
    assert zcdp_to_epsilon(0, rho_cap(10, 1e-6), 1e-6) <= 10 + 1e-9
    # §A.1: "rho=0.01: 0.705 vs 0.753" (Thm 2.2.4's form is smaller, and we take the min) ...
    assert zcdp_to_epsilon(0, 0.01, 1e-6) == pytest.approx(0.705, abs=5e-4)
    # ... "and larger otherwise (rho=5: 22.43 vs 21.62)"; §A.5 "zCDP: rho = 5 -> 21.623"
    assert zcdp_to_epsilon(0, 5, 1e-6) == pytest.approx(21.623, abs=5e-4)
    assert rho_cap(0, 1e-6) == 0.0 and zcdp_to_epsilon(3, 0, 1e-6) == 3


def test_odometer_matches_the_spec():
    # §B.4: "(delta_g = 1e-6) with c = sqrt(2e-4), t = 1e3 (covers R in [1e-4, 100]),
    # ln(1/beta) = 36.35 and odo(0.5) = 9.03, odo(5) = 31.96, odo(50) = 135.27"
    for rho, expected in ((0.5, 9.03), (5, 31.96), (50, 135.27)):
        reading = odometer(rho, 1e-6)
        assert reading.form == "window" and reading.delta == 1e-6
        assert reading.epsilon == pytest.approx(expected, abs=5e-3)
    assert (odometer(0.5, 1e-6).epsilon - 0.5) ** 2 / (4 * 0.5) == pytest.approx(36.35, abs=5e-3)
    # "For comparison the filter guarantee at the same R ... is 5.76, 21.62, 102.57"
    for rho, filt in ((0.5, 5.76), (5, 21.62), (50, 102.57)):
        assert zcdp_to_epsilon(0, rho, 1e-6) == pytest.approx(filt, abs=5e-3)
        assert odometer(rho, 1e-6).epsilon > filt  # the price of not committing to a cap
    # "Thm 5.4.1 with a badly chosen x is much worse (x = 1e-4: 13.25 at R = 0.5)"
    assert fallback_bound(0.5, 1e-6, x=1e-4) == pytest.approx(13.25, abs=5e-3)
    # outside the window (R > 100, or R < 1e-4) the fallback applies; R = 0 is exact
    assert odometer(200, 1e-6).form == "fallback" and odometer(1e-6, 1e-6).form == "fallback"
    assert odometer(0, 1e-6, pointwise=3) == odometer(0, 1e-6, pointwise=3)
    assert (odometer(0, 1e-6, 3).epsilon, odometer(0, 1e-6, 3).delta) == (3, 0.0)


# --- the best-of rule --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("epsilon", "best_of", "expected"),
    # §A.5: "Capacity for eps=1 RR answers: basic 10, zCDP 2, best-of 10.
    # For eps=0.1: basic 100, zCDP 270, best-of 270."
    [(1.0, False, 10), (1.0, True, 10), (0.1, False, 100), (0.1, True, 270)],
)
def test_best_of_capacity_matches_the_spec(tmp_path, epsilon, best_of, expected):
    with Ledger(tmp_path / "d.sqlite", Budget(10, 1e-6, best_of=best_of)) as ledger:
        assert capacity(ledger, epsilon) == expected


def test_best_of_admission_and_guarantee(tmp_path):
    path = tmp_path / "d.sqlite"
    with Ledger(path, Budget(10, best_of=True)) as ledger:
        assert capacity(ledger, 0.1) == 270
        spent = ledger.spent()[0]
        assert spent == pytest.approx(27.0)  # past the basic sum: now (10, 1e-6)-DP
        assert ledger.best_of_spent() == pytest.approx(270 * 0.005)
        assert "on its zCDP side" in ledger.guarantee()
        with pytest.raises(BudgetExceeded, match="best-of zCDP side"):
            ledger.charge(rr(0.1), request_id="x", survey_id="s", question_id="q", mechanism="rr")
        reading = ledger.odometer()  # min(basic 27, odo(1.35))
        assert reading.form == "window" and reading.epsilon == pytest.approx(
            odometer(270 * 0.005, 1e-6).epsilon
        )
        assert reading.epsilon < spent
    with Ledger.read_only(path) as again:
        assert again.budget == Budget(10, best_of=True)
    with pytest.raises(LedgerConfigError, match="enrolled with"):
        Ledger(path, Budget(10))  # the policy is fixed at enrollment


def test_best_of_stays_pure_while_the_basic_sum_fits(tmp_path):
    with Ledger(tmp_path / "d.sqlite", Budget(10, best_of=True)) as ledger:
        assert capacity(ledger, 1.0) == 10
        assert "now pure" in ledger.guarantee()
        reading = ledger.odometer()  # the basic sum 10 beats odo(5) = 31.96, with certainty
        assert (reading.epsilon, reading.delta, reading.form) == (10, 0.0, "exact")
        with pytest.raises(BudgetExceeded, match="enrolled pure under the best-of rule"):
            ledger.charge(
                PrivacyCost("zcdp", 0.01),
                request_id="g",
                survey_id="s",
                question_id="q",
                mechanism="gaussian",
            )


def test_best_of_needs_a_pure_budget():
    with pytest.raises(LedgerConfigError, match="pure-only"):
        Budget(10, pointwise=5, best_of=True)


def test_two_bucket_odometer_adds_the_pointwise_sum(tmp_path):
    # §A.5 mixed client: 5 RR at eps = 1 plus 5 Gaussian at rho = 0.1, filter guarantee 10.757
    with Ledger(tmp_path / "d.sqlite", Budget(10.757, 1e-6, pointwise=5)) as ledger:
        for n in range(5):
            ledger.charge(
                rr(1.0), request_id=f"p{n}", survey_id="s", question_id="q", mechanism="rr"
            )
            ledger.charge(
                PrivacyCost("zcdp", 0.1),
                request_id=f"g{n}",
                survey_id="s",
                question_id="g",
                mechanism="gaussian",
            )
        reading = ledger.odometer()
        assert reading.epsilon == pytest.approx(5 + odometer(0.5, 1e-6).epsilon)
        assert reading.epsilon == pytest.approx(14.03, abs=5e-3)


def test_a_ledger_from_before_policies_reads_as_two_bucket(tmp_path):
    path = tmp_path / "d.sqlite"
    Ledger(path, Budget(3)).close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE ledger_policy")
    with Ledger.read_only(path) as ledger:
        assert ledger.budget == Budget(3) and ledger.budget.policy == "two-bucket"


# --- ldp-client budget and household ------------------------------------------------------------


def test_budget_command_shows_the_odometer_and_keeps_its_keys(tmp_path):
    state = tmp_path / "d.sqlite"
    with Ledger(state, Budget(10, best_of=True)) as ledger:
        capacity(ledger, 0.1)
    done = client("budget", "--state", str(state), "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    kept = {"epsilon_budget", "delta", "pointwise_cap", "rho_cap", "spent_pointwise"}
    kept |= {"spent_rho", "remaining_pointwise", "remaining_rho", "charges", "guarantee"}
    assert kept <= set(info) and info["charges"] == 270
    assert info["policy"] == "best-of" and info["odometer_form"] == "window"
    assert info["odometer_epsilon"] == pytest.approx(odometer(1.35, 1e-6).epsilon)
    assert info["best_of_rho_remaining"] == pytest.approx(rho_cap(10, 1e-6) - 1.35)
    assert info["household"] is None
    text = client("budget", "--state", str(state)).stdout
    assert "loss so far" in text and "with probability 1 - 1e-06" in text


def test_household_create_join_and_budget(tmp_path):
    first, second, code_file = tmp_path / "a.sqlite", tmp_path / "b.sqlite", tmp_path / "code"
    made = client(
        "household",
        "create",
        "--state",
        str(first),
        "--cap",
        "4",
        "--devices",
        "2",
        "--code-out",
        str(code_file),
        "--json",
    )
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["code"] is None  # the code went to the file only
    assert code_file.stat().st_mode & 0o777 == 0o600
    terms = HouseholdTerms.from_code(code_file.read_text())
    assert (terms.epsilon_cap, terms.devices) == (4.0, 2)
    joined = client("household", "join", "--state", str(second), stdin=code_file.read_text())
    assert joined.returncode == 0 and "joined the household" in joined.stdout
    again = client("household", "join", "--state", str(second), stdin=create_terms(1).code())
    assert again.returncode == 2 and "another household" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1 and "Traceback" not in again.stderr
    bad = client("household", "join", "--state", str(tmp_path / "c.sqlite"), stdin="ldph1-xyz\n")
    assert bad.returncode == 2 and "household code" in bad.stderr
    Ledger(second, Budget(3)).close()
    info = json.loads(client("budget", "--state", str(second), "--json").stdout)
    assert info["household"]["source"] == "joined" and info["household"]["epsilon_cap"] == 4
    assert "household" in client("budget", "--state", str(second)).stdout
    assert math.isfinite(info["odometer_epsilon"])
