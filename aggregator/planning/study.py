"""Study planning for people: the power of a planned study with n reports, or the n that a target
power needs, for one mechanism or ranked over all of them, and the power curve as a figure.

The numbers are those of ``aggregator.stats.power``, ``sample_size`` and ``advise`` (this module
only chooses the candidates, builds alternatives from an effect size, and formats); with a survey
design, those of the design-based test under its design effect (``stats.design_power``); a
sequential plan adds the stopping forecast of ``aggregator.stats.anytime.stopping`` beside them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from aggregator.errors import InvalidInputError
from aggregator.planning.groups import FAMILIES
from aggregator.stats import advise, power, sample_size
from aggregator.stats.anytime.stopping import (
    SimulatedStopping,
    StoppingForecast,
    forecast_stopping,
    simulate_stopping,
)
from aggregator.stats.design.power import (
    DesignEffect,
    DesignPlan,
    plan_goodness_of_fit,
    plan_independence,
)
from aggregator.stats.gof import GOF_METHODS
from aggregator.stats.validate import check_distribution
from client.mechanisms import GaussianNoise, Mechanism, PublicCoinBit

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ADVISOR_N = 1_000  # any n: the advisor is only asked which mechanisms to compare
BOOTSTRAP_CURVE_POINTS = 6


@dataclass(frozen=True)
class PlanRow:
    """One mechanism's figure: its power at the planned n, or the n it needs."""

    mechanism: Mechanism | PublicCoinBit
    method: str
    n: int
    power: float
    note: str = ""
    deff: float | None = None  # with a design: the reports' design effect applied

    def to_dict(self) -> dict:
        out = {
            "mechanism": self.mechanism.describe(),
            "method": self.method,
            "n": self.n,
            "power": self.power,
            "note": self.note,
        }
        return out if self.deff is None else {**out, "deff": self.deff}


@dataclass(frozen=True)
class StudyPlan:
    """A planned test (goodness of fit against ``null``, or independence of a ``shape`` table)
    against ``alternative``; rows best first."""

    test: str
    alternative: np.ndarray
    null: np.ndarray | None
    shape: tuple[int, int] | None
    alpha: float
    target_power: float | None  # None: the rows give the power at a planned n
    rows: tuple[PlanRow, ...]
    design: DesignEffect | None = None
    design_df: int | None = None

    def to_dict(self) -> dict:
        return {
            **({} if self.design is None else {"design": self.design.to_dict()}),
            "test": self.test,
            "alpha": self.alpha,
            "target_power": self.target_power,
            "null": None if self.null is None else self.null.tolist(),
            "shape": None if self.shape is None else list(self.shape),
            "alternative": self.alternative.tolist(),
            "rows": [row.to_dict() for row in self.rows],
        }

    def summary(self) -> str:
        goal = (
            f"reports needed for power {self.target_power:g}"
            if self.target_power is not None
            else f"power with n = {self.rows[0].n:,} reports"
        )
        lines = [f"{self.test} at alpha = {self.alpha:g}: {goal}"]
        if self.design is not None:
            lines.append(f"  survey design: {self.design.header()}")
        width = max(len(row.mechanism.describe()) for row in self.rows)
        for row in self.rows:
            figure = (
                f"n = {row.n:>10,}" if self.target_power is not None else f"power = {row.power:.3f}"
            )
            note = f"  ({row.note})" if row.note else ""
            lines.append(f"  {row.mechanism.describe():<{width}}  {figure}  {row.method}{note}")
        return "\n".join(lines)


def tilted_alternative(null: np.ndarray, effect: float) -> np.ndarray:
    """The alternative at Cohen's effect size ``effect`` (w = sqrt(sum (p1 - p0)^2 / p0)) that tilts
    ``null`` linearly across its categories: p1_j = p0_j (1 + c z_j) with z centred under p0."""
    _check_effect(effect)
    z = np.linspace(-1.0, 1.0, null.size)
    z -= np.dot(null, z)
    scale = math.sqrt(float(np.dot(null, z**2)))
    if scale == 0:
        raise InvalidInputError("a null with all its mass in one category cannot be tilted")
    return _tilt(null, z, effect / scale)


def interaction_alternative(shape: tuple[int, int], effect: float) -> np.ndarray:
    """A joint table with uniform marginals and a linear-by-linear association of Cohen's effect
    size ``effect`` (its marginals stay uniform, so only the dependence differs from the null)."""
    _check_effect(effect)
    rows, cols = shape
    independent = np.full(rows * cols, 1.0 / (rows * cols))
    a = np.linspace(-1.0, 1.0, rows)
    b = np.linspace(-1.0, 1.0, cols)
    z = np.outer(a, b).ravel()
    return _tilt(independent, z, effect / math.sqrt(float(np.dot(independent, z**2))))


def _tilt(base: np.ndarray, z: np.ndarray, c: float) -> np.ndarray:
    factor = 1.0 + c * z
    if (factor < 0).any():
        largest = 1.0 / float(np.max(-z[z < 0])) * math.sqrt(float(np.dot(base, z**2)))
        raise InvalidInputError(
            f"effect size too large for this null: at most {largest:.3g} keeps every "
            "probability non-negative"
        )
    return base * factor


def _check_effect(effect: float) -> None:
    if not (math.isfinite(effect) and effect > 0):
        raise InvalidInputError(f"effect must be a positive number, got {effect!r}")


def plan_study(
    *,
    k: int,
    epsilon: float,
    alternative: np.ndarray,
    null: np.ndarray | None = None,
    shape: tuple[int, int] | None = None,
    mechanisms: Sequence[Mechanism] | None = None,
    n: int | None = None,
    target_power: float | None = None,
    alpha: float = 0.05,
    design: DesignEffect | None = None,
    design_df: int | None = None,
) -> StudyPlan:
    """Power at ``n`` or the n for ``target_power`` (exactly one), for ``mechanisms`` (their
    default tests) or, when None, every mechanism and test the advisor ranks at ``epsilon``;
    best first. With ``design``, every mechanism runs the design-based Rao-Scott test under that
    design effect (F with ``design_df`` = PSUs - strata, else chi-square)."""
    if (n is None) == (target_power is None):
        raise InvalidInputError("give either n (power at n) or a target power (n needed)")
    if (null is None) == (shape is None):
        raise InvalidInputError("give either null (goodness of fit) or shape (independence)")
    alternative = check_distribution(alternative, k, "alternative")
    if null is not None:
        null = check_distribution(null, k, "p0")
    test = "goodness of fit" if null is not None else "independence"
    if design is not None:
        return _design_study(
            test,
            k,
            epsilon,
            alternative,
            null,
            shape,
            mechanisms,
            n,
            target_power,
            alpha,
            design,
            design_df,
        )
    advised = advise(
        k,
        epsilon,
        alternative,
        n or ADVISOR_N,
        null=null,
        shape=shape,
        alpha=alpha,
        u_statistics=mechanisms is None,  # given mechanisms: their default tests
    )
    candidates = (
        [(a.mechanism, a.method, a.note) for a in advised]
        if mechanisms is None
        else [(m, _default_method(advised, m, null is not None), "") for m in mechanisms]
    )
    rows = []
    for mechanism, method, note in candidates:
        chosen = method or None
        if n is not None:
            figure = power(
                mechanism, alternative, n, null=null, shape=shape, alpha=alpha, method=chosen
            )
            rows.append(PlanRow(mechanism, method, n, figure, note))
        elif target_power is not None:  # exactly one of n and target_power: checked above
            needed = sample_size(
                mechanism,
                alternative,
                null=null,
                shape=shape,
                power=target_power,
                alpha=alpha,
                method=chosen,
            )
            rows.append(PlanRow(mechanism, method, needed, target_power, note))
    rows.sort(key=(lambda r: -r.power) if n is not None else (lambda r: r.n))
    return StudyPlan(test, alternative, null, shape, alpha, target_power, tuple(rows))


def _design_study(
    test: str,
    k: int,
    epsilon: float,
    alternative: np.ndarray,
    null: np.ndarray | None,
    shape: tuple[int, int] | None,
    mechanisms: Sequence[Mechanism] | None,
    n: int | None,
    target_power: float | None,
    alpha: float,
    design: DesignEffect,
    design_df: int | None,
) -> StudyPlan:
    """With a design every mechanism runs one test, the design-based Rao-Scott test: one row per
    mechanism (by default every epsilon-LDP family and the Gaussian at rho = eps^2/2)."""
    if mechanisms is None:
        candidates: list[tuple[Mechanism, str]] = [
            (GaussianNoise(k, epsilon**2 / 2), "rho = eps^2/2 zCDP: weaker than eps-LDP")
        ]
        candidates += [(family(k, epsilon), "") for family in FAMILIES]
    else:  # design_power refuses a mechanism without a per-report contribution
        candidates = [(m, "") for m in mechanisms]
    rows = []
    for mechanism, note in candidates:
        planned = _design_plan(mechanism, alternative, null, shape, design)
        row = _design_row(mechanism, planned, design, n, target_power, alpha, design_df)
        rows.append(replace(row, note="; ".join(filter(None, [note, row.note]))))
    rows.sort(key=(lambda r: -r.power) if n is not None else (lambda r: r.n))
    return StudyPlan(
        test, alternative, null, shape, alpha, target_power, tuple(rows), design, design_df
    )


def _design_plan(
    mechanism: Mechanism,
    alternative: np.ndarray,
    null: np.ndarray | None,
    shape: tuple[int, int] | None,
    design: DesignEffect,
) -> DesignPlan:
    if null is not None:
        return plan_goodness_of_fit(mechanism, alternative, null, design)
    assert shape is not None  # plan_study checked: exactly one of null and shape
    return plan_independence(mechanism, alternative, shape, design)


def _design_row(
    mechanism: Mechanism,
    planned: DesignPlan,
    design: DesignEffect,
    n: int | None,
    target_power: float | None,
    alpha: float,
    design_df: int | None,
) -> PlanRow:
    method = "design-based Rao-Scott " + ("chi-square" if design_df is None else "F")
    note = design.describe(planned.share)
    if n is not None:
        return PlanRow(mechanism, method, n, planned.power(n, alpha, design_df), note, planned.deff)
    assert target_power is not None
    needed = planned.sample_size(target_power, alpha, design_df)
    return PlanRow(mechanism, method, needed, target_power, note, planned.deff)


def _default_method(advised, mechanism: Mechanism, gof: bool) -> str:
    """The default test of a mechanism of this kind: the advisor's, or for goodness of fit of a
    mechanism it does not rank, the first of its methods."""
    method = next((a.method for a in advised if type(a.mechanism) is type(mechanism)), "")
    if not method and gof:
        method = GOF_METHODS[type(mechanism)][0]
    return method


def plot_power_curves(plan: StudyPlan, path: Path) -> None:
    """:func:`power_figure` written to ``path`` (the format follows its suffix: .png, .svg or
    .pdf), the legend included."""
    power_figure(plan).savefig(path, bbox_inches="tight")


LINE_STYLES = ("-", "--", ":", "-.")


def curve_styles(count: int) -> list[tuple[str, str]]:
    """(colour, line style) of ``count`` curves, no two alike (up to 40): the ten colours of
    matplotlib's cycle solid, then dashed, dotted, dash-dotted."""
    colours = [f"C{j}" for j in range(10)]
    return [(colours[j % 10], LINE_STYLES[(j // 10) % len(LINE_STYLES)]) for j in range(count)]


def power_figure(plan: StudyPlan) -> Figure:
    """Power against n (log scale) for every mechanism of ``plan``, each curve its own colour
    and line style, the legend beside the axes (it never covers a curve). Needs the ``[plot]``
    extra. A support-count mechanism's independence test is bootstrapped, so its power is
    simulated report by report: its curve has ``BOOTSTRAP_CURVE_POINTS`` points, up to its own
    planned n."""
    from matplotlib.figure import Figure

    reference = [row.n for row in plan.rows]
    low = max(2, min(reference) // 10)
    full = np.unique(np.geomspace(low, max(reference) * 10, 60).astype(int))
    fig = Figure(figsize=(7.0, 4.2))
    ax = fig.add_subplot()
    for row, (colour, line) in zip(plan.rows, curve_styles(len(plan.rows)), strict=True):
        grid = full
        if plan.design is not None:
            planned = _design_plan(
                row.mechanism, plan.alternative, plan.null, plan.shape, plan.design
            )
            curve = [planned.power(int(m), plan.alpha, plan.design_df) for m in grid]
        else:
            if plan.shape is not None and row.mechanism.statistic_kind == "support":
                top = max(row.n, low + 1)
                grid = np.unique(np.geomspace(low, top, BOOTSTRAP_CURVE_POINTS).astype(int))
            curve = [
                power(
                    row.mechanism,
                    plan.alternative,
                    int(m),
                    null=plan.null,
                    shape=plan.shape,
                    alpha=plan.alpha,
                    method=row.method or None,
                )
                for m in grid
            ]
        ax.plot(
            grid,
            curve,
            label=f"{row.mechanism.describe()} {row.method}",
            color=colour,
            linestyle=line,
        )
    if plan.target_power is not None:
        ax.axhline(plan.target_power, color="#999999", linestyle="--", linewidth=0.8)
    else:
        ax.axvline(plan.rows[0].n, color="#999999", linestyle="--", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("reports (n)")
    ax.set_ylabel("power")
    ax.set_title(f"{plan.test}, alpha = {plan.alpha:g}", fontsize=10)
    ax.grid(color="#e0e0e0", linewidth=0.6)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return fig


@dataclass(frozen=True)
class SequentialRow:
    """One mechanism's sequential figures beside its fixed-n plan row: the forecast stopping
    law of the goodness-of-fit e-process, P(stopped by the planned n), and optionally a
    simulation of the real e-process."""

    row: PlanRow
    forecast: StoppingForecast
    stopped_by_n: float
    simulated: SimulatedStopping | None

    def to_dict(self) -> dict:
        return {
            "mechanism": self.row.mechanism.describe(),
            "fixed_n": self.row.n,
            "forecast": self.forecast.to_dict(),
            "stopped_by_fixed_n": self.stopped_by_n,
            "simulated": None if self.simulated is None else self.simulated.to_dict(),
        }


@dataclass(frozen=True)
class SequentialPlan:
    """A goodness-of-fit plan with, per mechanism, where the sequential test (looked at every
    ``batch`` reports) is expected to stop; ``quantile90`` is the maximum n to plan for."""

    plan: StudyPlan
    batch: int
    rows: tuple[SequentialRow, ...]

    def to_dict(self) -> dict:
        return {**self.plan.to_dict(), "sequential": [row.to_dict() for row in self.rows]}

    def summary(self) -> str:
        lines = [
            self.plan.summary(),
            f"sequential test (e-process), looked at every {self.batch:,} reports: reports "
            "to stop (mean, median; max n = the forecast 90% point)",
        ]
        width = max(len(row.row.mechanism.describe()) for row in self.rows)
        for row in self.rows:
            f = row.forecast
            lines.append(
                f"  {row.row.mechanism.describe():<{width}}  forecast mean {f.mean:>9,}  "
                f"median {f.median:>9,}  max n {f.quantile90:>9,}  "
                f"P(stopped by {row.row.n:,}) = {row.stopped_by_n:.2f}"
            )
            if row.simulated is not None:
                s = row.simulated
                lines.append(
                    f"  {'':<{width}}  simulated mean {s.mean:>8,.0f}  median {s.median:>9,.0f}"
                    f"  90% {s.quantile90:>11,.0f}  ({s.paths} paths up to {s.max_n:,}, "
                    f"{s.stopped:.0%} stopped)"
                )
        return "\n".join(lines)


def plan_sequential(
    plan: StudyPlan, *, batch: int = 100, simulate: int = 0, seed: int = 0
) -> SequentialPlan:
    """Where the sequential goodness-of-fit test of each mechanism of ``plan`` is expected to
    stop under its alternative (``forecast_stopping``), beside the fixed-n figure, and with
    ``simulate`` > 0 that many simulated studies of the real e-process each (up to twice the
    forecast's maximum n). Goodness-of-fit plans only; public-coin reports, which carry no
    per-category channel for the e-process, are left out."""
    if plan.null is None:
        raise InvalidInputError(
            "sequential plans cover goodness of fit (--p0 or --k); independence is not planned"
        )
    if plan.design is not None:
        raise InvalidInputError(
            "sequential plans assume independent reports (a simple random sample): the "
            "e-process takes no design effect"
        )
    if isinstance(simulate, bool) or not isinstance(simulate, int) or simulate < 0:
        raise InvalidInputError(f"simulate must be a number of paths >= 0, got {simulate!r}")
    rows = []
    kept: dict[str, PlanRow] = {}  # one row per mechanism (its best test): one e-process
    for row in plan.rows:
        if row.mechanism.statistic_kind != "groups":
            kept.setdefault(row.mechanism.describe(), row)
    for row in kept.values() or plan.rows:  # public-coin reports alone: refused by the forecast
        mech = row.mechanism
        forecast = forecast_stopping(mech, plan.alternative, plan.null, plan.alpha, batch)
        simulated = None
        if simulate:
            simulated = simulate_stopping(
                mech,
                plan.alternative,
                plan.null,
                plan.alpha,
                paths=simulate,
                batch=batch,
                max_n=2 * forecast.quantile90,
                seed=seed,
            )
        rows.append(SequentialRow(row, forecast, forecast.stopped_by(row.n), simulated))
    return SequentialPlan(plan, batch, tuple(rows))
