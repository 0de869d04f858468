"""Estimates and test results for notebooks and data frames: ``_repr_html_`` (a notebook shows
the summary table, not a dataclass repr) and ``to_frame`` (pandas, the optional ``[frame]``
extra)."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING, Any

from aggregator.numbers import share

if TYPE_CHECKING:
    from aggregator.stats.estimate import Estimate
    from aggregator.stats.result import TestResult

FRAME_HINT = "to_frame needs pandas: pip install 'ldp-survey[frame]'"


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError(FRAME_HINT) from None
    return pandas


def estimate_rows(est: Estimate) -> dict[str, list]:
    """The estimate's columns, one entry per category (the simultaneous ones when computed)."""
    columns: dict[str, list] = {
        "estimate": est.frequencies.tolist(),
        "std_error": est.standard_errors.tolist(),
        "ci_low": est.ci_low.tolist(),
        "ci_high": est.ci_high.tolist(),
        "projected": est.projected().tolist(),
        "outside_unit_interval": est.outside.tolist(),
    }
    if est.simultaneous_low is not None and est.simultaneous_high is not None:
        columns["simultaneous_low"] = est.simultaneous_low.tolist()
        columns["simultaneous_high"] = est.simultaneous_high.tolist()
    return columns


def category_names(est: Estimate) -> list[str]:
    if est.labels is not None:
        return list(est.labels)
    return [str(j) for j in range(est.frequencies.size)]


def estimate_frame(est: Estimate) -> Any:
    frame = _pandas().DataFrame(estimate_rows(est), index=category_names(est))
    frame.index.name = "category"
    frame.attrs.update(
        mechanism=est.mechanism,
        n=est.n,
        confidence=est.confidence,
        interval_method=est.interval_method,
    )
    return frame


def estimate_html(est: Estimate) -> str:
    """A small table: category, estimate, s.e., interval, projected (flagged when outside)."""
    level = f"{100 * est.confidence:g}%"
    head = (
        f"<p><b>estimate</b> [{escape(est.mechanism)}], n = {est.n:,}; "
        f"{level} intervals: {escape(est.interval_method or 'normal')}</p>"
    )
    rows = [
        "<table><thead><tr><th>category</th><th>estimate</th><th>s.e.</th>"
        f"<th>{level} interval</th><th>projected</th></tr></thead><tbody>"
    ]
    projected = est.projected()
    for j, name in enumerate(category_names(est)):
        flag = " &#9650;" if est.outside[j] else ""
        rows.append(
            f"<tr><td>{escape(name)}</td><td>{share(est.frequencies[j])}{flag}</td>"
            f"<td>{share(est.standard_errors[j])}</td>"
            f"<td>[{share(est.ci_low[j])}, {share(est.ci_high[j])}]</td>"
            f"<td>{share(projected[j])}</td></tr>"
        )
    rows.append("</tbody></table>")
    note = (
        "<p><small>&#9650; outside [0, 1]: unbiased, not a share; read the projected value."
        "</small></p>"
        if est.outside.any()
        else ""
    )
    return head + "".join(rows) + note


def result_frame(result: TestResult) -> Any:
    """One row: the test's figures (the expected and observed vectors stay on the result)."""
    row = {
        key: value for key, value in result.to_dict().items() if key not in ("expected", "observed")
    }
    return _pandas().DataFrame([row])


def result_html(result: TestResult) -> str:
    if result.inconclusive:
        decision = f"inconclusive ({escape(result.reason)}); H0 not rejected"
    else:
        decision = "<b>reject H0</b>" if result.reject else "do not reject H0"
    dof = "Monte Carlo null" if result.dof is None else f"{result.dof} degrees of freedom"
    return (
        f"<p><b>{escape(result.method)}</b> [{escape(result.mechanism)}]<br>"
        f"n = {result.n:,}, statistic = {result.statistic:.4g}, {dof}<br>"
        f"{escape(result.pvalue_text())} at &alpha; = {result.alpha:g}: {decision}<br>"
        f"<small>calibration: {escape(result.calibration)}"
        + (f" ({escape(result.calibration_reason)})" if result.calibration_reason else "")
        + "</small></p>"
    )
