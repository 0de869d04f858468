"""Planning a sequential study (issue 30): the forecast stopping law of the goodness-of-fit
e-process (aggregator/stats/anytime/stopping.py) checked against simulations of the real
e-process on three settings, and ``plan --sequential`` in Python and on the command line.
Fixed seeds."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_runner import run_cli
from scipy import stats

from aggregator.errors import InvalidInputError
from aggregator.planning.study import plan_sequential, plan_study
from aggregator.stats.anytime import expected_stopping_time, forecast_stopping, simulate_stopping
from client.mechanisms import (
    GaussianNoise,
    OptimizedUnaryEncoding,
    PublicCoinBit,
    RandomizedResponse,
)

P0 = np.full(4, 0.25)
P1 = np.array([0.3, 0.3, 0.2, 0.2])
PATHS = 100


@pytest.mark.parametrize(
    ("mech", "alternative"),
    [
        (RandomizedResponse(4, 1.0), P1),
        (OptimizedUnaryEncoding(4, 1.0), P1),
        (GaussianNoise(3, 0.5), np.array([0.4, 0.35, 0.25])),
    ],
    ids=lambda v: v.describe() if hasattr(v, "describe") else "",
)
def test_forecast_matches_the_simulated_stopping_law(mech, alternative):
    """Looked at every 100 reports: the simulated paths stopped by the forecast median are
    Binomial(100, 1/2) within its 99.9% band widened by 10 paths for the model, those stopped by
    its 90% point at least 75 in 100, and the simulated mean within 20% of the forecast mean."""
    null = np.full(mech.k, 1 / mech.k)
    forecast = forecast_stopping(mech, alternative, null, 0.05, batch=100)
    assert forecast.median < forecast.quantile90
    assert forecast.stopped_by(forecast.median) >= 0.5 > forecast.stopped_by(forecast.median - 100)
    sim = simulate_stopping(
        mech, alternative, null, paths=PATHS, batch=100, max_n=3 * forecast.quantile90, seed=5
    )
    assert sim.stopped == 1.0
    low, high = stats.binom.interval(0.999, PATHS, 0.5)
    assert low - 10 <= sim.stopped_by(forecast.median) * PATHS <= high + 10
    assert sim.stopped_by(forecast.quantile90) >= 0.75
    assert sim.mean == pytest.approx(forecast.mean, rel=0.2)


def test_expected_stopping_time_is_the_forecast_mean_and_refuses_the_null():
    mech = RandomizedResponse(4, 1.0)
    assert (
        expected_stopping_time(mech, P1, P0, batch=100)
        == forecast_stopping(mech, P1, P0, batch=100).mean
    )
    assert expected_stopping_time(mech, [0.4, 0.3, 0.2, 0.1], P0) < expected_stopping_time(
        mech, P1, P0
    )
    with pytest.raises(InvalidInputError, match="satisfies the null"):
        forecast_stopping(mech, P0, P0)
    with pytest.raises(InvalidInputError, match="look interval"):
        forecast_stopping(mech, P1, P0, batch=0)
    with pytest.raises(InvalidInputError, match="paths"):
        simulate_stopping(mech, P1, P0, paths=0)


def test_plan_sequential_one_row_per_mechanism_beside_the_fixed_n():
    plan = plan_study(k=4, epsilon=1.0, alternative=P1, null=P0, target_power=0.8)
    sequential = plan_sequential(plan, batch=100)
    names = [row.row.mechanism.describe() for row in sequential.rows]
    assert len(names) == len(set(names))
    assert PublicCoinBit(4, 1.0, 0, 5).describe() not in names  # no per-category channel
    for row in sequential.rows:
        assert row.forecast.median <= row.forecast.quantile90
        assert 0 <= row.stopped_by_n <= 1
    assert "sequential" in sequential.to_dict()
    independence = plan_study(k=4, epsilon=1.0, alternative=P1, shape=(2, 2), n=1000)
    with pytest.raises(InvalidInputError, match="goodness of fit"):
        plan_sequential(independence)


def test_plan_command_sequential_with_simulation():
    result = run_cli(
        "agg",
        "plan",
        "--mechanism",
        "randomized_response",
        "--epsilon",
        "1",
        "--k",
        "4",
        "--alternative",
        "0.3,0.3,0.2,0.2",
        "--power",
        "0.8",
        "--sequential",
        "--simulate",
        "20",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    (row,) = data["sequential"]
    forecast = forecast_stopping(RandomizedResponse(4, 1.0), P1, P0, batch=100)
    assert row["forecast"]["median"] == forecast.median
    assert row["fixed_n"] == data["rows"][0]["n"]
    assert row["simulated"]["paths"] == 20 and row["simulated"]["stopped"] > 0.9
    text = run_cli(
        "agg",
        "plan",
        "--epsilon",
        "1",
        "--k",
        "4",
        "--effect",
        "0.2",
        "--n",
        "2000",
        "--sequential",
        "--look-every",
        "50",
        check=True,
    ).stdout
    assert "looked at every 50 reports" in text and "max n" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--simulate", "5"], "go with --sequential"),
        (["--sequential", "--shape", "2,2"], "goodness of fit"),
        (["--sequential", "--deff", "1.5"], "independent reports"),
    ],
)
def test_plan_command_sequential_mistakes_are_one_line(extra, message):
    base = ["plan", "--epsilon", "1", "--effect", "0.2", "--n", "1000"]
    if "--shape" not in extra:
        base += ["--k", "4"]
    result = run_cli("agg", *base, *extra)
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr
