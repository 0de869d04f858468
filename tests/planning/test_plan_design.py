"""Planning with a survey design (docs/planning.md, 'Survey designs'): ``plan`` and
``plan-groups`` plan the design-based Rao-Scott test under a design effect, whose figures are
those of ``stats.design_power``; the output says which effect was applied and how the local
noise dilutes it; mistakes are one-line errors. The power formula itself is checked against
simulation in tests/stats/design/test_design_power.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_runner import run_cli

from aggregator.errors import InvalidInputError
from aggregator.planning.groups import plan_groups
from aggregator.planning.study import plan_study, plot_power_curves, tilted_alternative
from aggregator.stats import sample_size
from aggregator.stats.design.power import (
    DesignEffect,
    plan_goodness_of_fit,
    plan_k_sample,
    signal_share,
)
from client.mechanisms import PublicCoinBit, RandomizedResponse

P0 = np.full(4, 0.25)
ALTERNATIVE = tilted_alternative(P0, 0.1)
GROUPS = [[0.4, 0.3, 0.2, 0.1], [0.3, 0.3, 0.25, 0.15]]


def test_a_given_design_effect_multiplies_the_reports_of_the_srs_plan():
    rr = RandomizedResponse(4, 1.0)
    plan = plan_study(
        k=4, epsilon=1.0, alternative=ALTERNATIVE, null=P0, mechanisms=[rr], target_power=0.8,
        design=DesignEffect(total=2.0),
    )  # fmt: skip
    (row,) = plan.rows
    srs = sample_size(rr, ALTERNATIVE, null=P0, power=0.8)  # Pearson: the same quadratic form
    assert abs(row.n - 2 * srs) <= 2
    assert row.deff == 2.0 and row.method == "design-based Rao-Scott chi-square"
    assert "design effect 2 of privatized reports" in plan.summary()


def test_raw_effects_are_diluted_per_mechanism_and_every_family_is_ranked():
    design = DesignEffect(clustering=3.0, weighting=1.2)
    plan = plan_study(k=4, epsilon=2.0, alternative=ALTERNATIVE, null=P0, n=5000, design=design)
    assert len(plan.rows) == 8  # one row per mechanism: every epsilon-LDP family and Gaussian
    assert [r.power for r in plan.rows] == sorted((r.power for r in plan.rows), reverse=True)
    rr = next(r for r in plan.rows if r.mechanism.name == "randomized_response")
    share = signal_share(RandomizedResponse(4, 2.0), P0)
    assert rr.deff == pytest.approx(1.2 * (1 + 2 * share))
    expected = plan_goodness_of_fit(RandomizedResponse(4, 2.0), ALTERNATIVE, P0, design)
    assert rr.power == pytest.approx(expected.power(5000))
    assert f"signal share {share:.2f}" in rr.note
    data = plan.to_dict()
    assert data["design"] == {"clustering": 3.0, "weighting": 1.2, "total": None}
    assert data["rows"][0]["deff"] > 1.2


def test_the_f_law_with_few_psus_needs_more_reports(tmp_path):
    design = DesignEffect(total=1.5)

    def planned(design_df: int | None):
        return plan_study(
            k=4, epsilon=1.0, alternative=ALTERNATIVE, null=P0, target_power=0.8, design=design,
            design_df=design_df,
        )  # fmt: skip

    chi2, few = planned(None), planned(8)
    assert all(a.n < b.n for a, b in zip(chi2.rows, few.rows, strict=True))
    assert few.rows[0].method == "design-based Rao-Scott F"
    plot_power_curves(few, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_plan_groups_with_a_design_effect():
    rr = RandomizedResponse(4, 1.0)
    srs = plan_groups(distributions=GROUPS, mechanisms=[rr], target_power=0.8)
    design = DesignEffect(clustering=2.0)
    planned = plan_groups(distributions=GROUPS, mechanisms=[rr], target_power=0.8, design=design)
    (row,), (base,) = planned.rows, srs.rows
    assert row.deff == pytest.approx(1 + signal_share(rr, np.mean(GROUPS, axis=0)))
    assert row.sizes is not None and base.sizes is not None and row.deff is not None
    assert abs(row.sizes[0] - row.deff * base.sizes[0]) <= 2
    expected = plan_k_sample(rr, GROUPS, [1, 1], design).power(2 * row.sizes[0])
    assert row.power == pytest.approx(expected)
    assert "clustering 2" in planned.summary() and planned.to_dict()["rows"][0]["deff"]


def test_public_coin_reports_have_no_design_based_test():
    with pytest.raises(InvalidInputError, match="one-hot"):
        plan_study(
            k=4, epsilon=1.0, alternative=ALTERNATIVE, null=P0, n=1000,
            mechanisms=[PublicCoinBit(4, 1.0, 0, 5)], design=DesignEffect(total=2.0),
        )  # fmt: skip


def test_plan_cli_with_a_design():
    done = run_cli(
        "agg", "plan", "--mechanism", "randomized_response", "--k", "4", "--epsilon", "1",
        "--effect", "0.1", "--power", "0.8", "--clustering-effect", "2",
        "--weighting-effect", "1.5", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    (row,) = data["rows"]
    expected = plan_goodness_of_fit(
        RandomizedResponse(4, 1.0), np.array(data["alternative"]), P0, DesignEffect(2.0, 1.5)
    )
    assert row["n"] == expected.sample_size(0.8) and row["deff"] == pytest.approx(expected.deff)
    done = run_cli(
        "agg", "plan-groups", "--distributions", "0.4,0.3,0.2,0.1", "0.3,0.3,0.25,0.15",
        "--epsilon", "1", "--n", "3000", "--deff", "1.7", "--design-df", "30",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "design effect 1.7 of privatized reports, applied as given" in lines[1]
    assert all("design effect 1.7 (privatized, as given)" in line for line in lines[2:])


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--deff", "2", "--clustering-effect", "2"], "not both"),
        (["--design-df", "10"], "--design-df needs a design effect"),
        (["--deff", "0"], "design effect total must be a positive number"),
        (["--weighting-effect", "nan"], "weighting must be a positive number"),
        (["--mechanism", "public_coin_bit", "--deff", "2"], "one-hot"),
    ],
)
def test_plan_design_mistakes_are_one_line(args, fragment):
    done = run_cli(
        "agg", "plan", "--k", "4", "--epsilon", "1", "--effect", "0.1", "--n", "900", *args
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and fragment in lines[0], done.stderr
