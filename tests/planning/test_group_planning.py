"""Planning two- and k-sample comparisons (aggregator/planning/groups.py): the n per group it
plans reaches the target power in simulation, the n just below does not reach it by the
formula, allocations scale the groups, and mistakes are typed errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from aggregator.errors import InvalidInputError
from aggregator.planning.groups import plan_groups
from aggregator.stats import k_sample_power
from aggregator.stats.studies import k_sample_rate
from client.mechanisms import RandomizedResponse

P = [0.4, 0.3, 0.2, 0.1]
Q = [0.3, 0.3, 0.25, 0.15]


def test_planned_n_reaches_the_target_in_simulation():
    rr = RandomizedResponse(4, 1.0)
    plan = plan_groups(distributions=[P, Q], mechanisms=[rr], target_power=0.8)
    (row,) = plan.rows
    assert row.sizes is not None and row.sizes[0] == row.sizes[1] and row.power >= 0.8
    below = k_sample_power(rr, [P, Q], [row.sizes[0] - 1] * 2)
    assert below < 0.8
    rate = k_sample_rate(rr, [np.array(P), np.array(Q)], row.sizes, trials=300, seed=3)
    assert rate.close_to(0.8, points=0.06), rate.rate


def test_ranked_plan_at_n_with_an_allocation():
    plan = plan_groups(distributions=[P, Q, P], epsilon=1.0, n=500, allocation=[1, 2, 1])
    assert len(plan.rows) == 7
    powers = [row.power for row in plan.rows]
    assert powers == sorted(powers, reverse=True)
    assert all(row.sizes == (500, 1000, 500) for row in plan.rows)
    best = plan.rows[0]
    assert best.power == pytest.approx(k_sample_power(best.mechanism, [P, Q, P], [500, 1000, 500]))
    assert "k-sample (3 groups)" in plan.summary()
    assert plan.to_dict()["rows"][0]["sizes"] == [500, 1000, 500]


def test_an_unreachable_target_says_so():
    rr = RandomizedResponse(4, 0.001)
    near = [0.4, 0.3, 0.2, 0.1]
    tiny = [0.4001, 0.2999, 0.2, 0.1]
    plan = plan_groups(distributions=[near, tiny], mechanisms=[rr], target_power=0.9)
    assert plan.rows[0].sizes is None and "not reachable" in plan.summary()


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"distributions": [P, P], "epsilon": 1.0, "n": 100}, "equal"),
        ({"distributions": [P], "epsilon": 1.0, "n": 100}, "two or more"),
        ({"distributions": [P, Q], "epsilon": 1.0}, "either n"),
        ({"distributions": [P, Q], "epsilon": 1.0, "n": 100, "allocation": [1, -1]}, "positive"),
        ({"distributions": [P, Q], "n": 100}, "epsilon"),
        ({"distributions": [P, Q], "epsilon": 1.0, "target_power": 0.01}, "not above alpha"),
        ({"distributions": [P, [0.5, 0.5]], "epsilon": 1.0, "n": 100}, "group 2"),
    ],
)
def test_mistakes_are_typed(kwargs, fragment):
    with pytest.raises(InvalidInputError, match=fragment):
        plan_groups(**kwargs)


def test_the_command_prints_the_plan_and_refuses_mistakes_in_one_line():
    from cli_runner import run_cli

    p, q = ",".join(map(str, P)), ",".join(map(str, Q))
    done = run_cli(
        "agg", "plan-groups", "--distributions", p, q, "--epsilon", "1", "--power", "0.8"
    )
    assert done.returncode == 0, done.stderr
    assert "two-sample homogeneity at alpha = 0.05: reports per group needed for power 0.8" in (
        done.stdout
    )
    rr = RandomizedResponse(4, 1.0)
    planned = plan_groups(distributions=[P, Q], mechanisms=[rr], target_power=0.8).rows[0]
    as_json = run_cli(
        "agg", "plan-groups", "--distributions", p, q, "--mechanism", "randomized_response",
        "--epsilon", "1", "--power", "0.8", "--json",
    )  # fmt: skip
    assert json.loads(as_json.stdout)["rows"][0]["sizes"] == list(planned.sizes)
    for args, fragment in [
        (["--distributions", p, "--epsilon", "1", "--n", "10"], "two or more"),
        (["--distributions", p, "0.5,x", "--epsilon", "1", "--n", "10"], "comma-separated"),
        (["--distributions", p, q, "--n", "10"], "needs --epsilon"),
        (
            ["--distributions", p, q, "--epsilon", "1", "--n", "10", "--allocation", "1"],
            "2 positive",
        ),
    ]:
        wrong = run_cli("agg", "plan-groups", *args)
        lines = wrong.stderr.strip().splitlines()
        assert wrong.returncode == 2 and len(lines) == 1 and fragment in lines[0], wrong.stderr
