"""The survey report as one self-contained HTML page: inline CSS and SVG, no scripts, no
network, readable on screen and printed."""

from __future__ import annotations

from html import escape

from aggregator.presentation.numbers import interval, out_of_range, reports, share
from aggregator.report.content import Marginal, QuestionSection, SurveyReport, TestSection
from aggregator.report.plots import PLOT_EXTRA_HINT, interval_plot, plots_available
from aggregator.report.sentences import calibration_text, result_p

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 70rem; margin: 2rem auto; padding: 0 1rem;
       color: #1a1a1a; line-height: 1.45; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; } h2 { font-size: 1.25rem; margin-top: 2.2rem;
     border-bottom: 1px solid #ccc; } h3 { font-size: 1.05rem; }
.meta { color: #555; font-size: .9rem; }
.pair { display: flex; flex-wrap: wrap; gap: 1.5rem; align-items: flex-start; }
.pair figure { margin: 0; flex: 1 1 26rem; } .pair figure svg { width: 100%; height: auto; }
table { border-collapse: collapse; font-size: .9rem; font-variant-numeric: tabular-nums; }
th, td { padding: .2rem .6rem; border-bottom: 1px solid #e3e3e3; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.flag { color: #b35900; font-weight: 600; }
.held { background: #fff6e0; border-left: 4px solid #e0a100; padding: .5rem .8rem; }
.test { background: #f3f6fa; border-left: 4px solid #1f4e79; padding: .5rem .8rem;
        margin: .8rem 0; }
.note { font-size: .85rem; color: #555; }
@media print { body { max-width: none; margin: 0; } section, figure, .test { break-inside: avoid; }
               .pair figure { flex-basis: 22rem; } }
"""


def render_html(report: SurveyReport) -> str:
    survey = report.survey
    plots = plots_available()
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(survey.title or survey.id)} — survey report</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{escape(survey.title or survey.id)}</h1>",
        f'<p class="meta">Survey <code>{escape(survey.id)}</code> · generated '
        f"{escape(report.generated)} · {100 * report.confidence:g}% intervals · results are "
        f"released from {survey.min_batch_size:,} reports per question</p>",
        _cost(report),
    ]
    if report.side_note:
        parts.append(f'<p class="note"><strong>{escape(report.side_note)}</strong></p>')
    if report.group_note:
        parts.append(f'<p class="note"><strong>{escape(report.group_note)}</strong></p>')
    if not plots:
        parts.append(f'<p class="note">Tables only: {escape(PLOT_EXTRA_HINT)}.</p>')
    parts += [_question(section, report.confidence, plots) for section in report.questions]
    parts.append(
        '<p class="note">Estimates are unbiased: with few reports or strong privacy one may fall '
        "below 0 or above 1. Such values are marked <span class=flag>▲</span>; the projected "
        "estimate beside them is the closest proper distribution (biased, but never "
        "impossible).</p>"
    )
    parts.append("</body></html>")
    return "\n".join(parts)


def _cost(report: SurveyReport) -> str:
    cost = report.cost
    lines = []
    if cost.epsilon:
        lines.append(f"ε = {cost.epsilon:g} (pure local differential privacy)")
    if cost.rho:
        lines.append(f"ρ = {cost.rho:g} zCDP")
    return (
        "<p><strong>Privacy cost per device</strong> for answering every question once: "
        + " plus ".join(lines)
        + f"; the device budget that pays for it: <code>ldp-client ... {escape(cost.flags)}</code>."
        + "</p>"
    )


def _question(section: QuestionSection, confidence: float, plots: bool) -> str:
    question = section.question
    head = [
        "<section>",
        f"<h2>{escape(question.id)}</h2>",
        f"<p>{escape(question.text)}</p>" if question.text else "",
        f'<p class="meta">{escape(question.mechanism.describe())} · n = {section.n:,}</p>',
    ]
    if not section.released or section.withheld:
        head.append(
            f'<p class="held">No estimate: {escape(section.withheld)}.</p>'
            if section.withheld
            else f'<p class="held">Not released: {reports(section.n)} so far, results are '
            f"released from {section.min_batch_size:,}.</p>"
        )
        head += [_test(test) for test in section.tests]
        return "\n".join([*head, "</section>"])
    est = section.estimate
    assert est is not None
    labels = question.labels
    projected = est.projected()
    title = f"{question.id}: estimate with {100 * confidence:g}% interval"
    body = [
        '<div class="pair">',
        _figure(labels, est.frequencies, est.ci_low, est.ci_high, title, projected, plots),
        _table(labels, est.frequencies, est.standard_errors, est.ci_low, est.ci_high, projected),
        "</div>",
    ]
    for marginal in section.marginals:
        body += [f"<h3>Marginal: {escape(marginal.attribute)}</h3>", _marginal(marginal, plots)]
    body += [_test(test) for test in section.tests]
    return "\n".join([*head, *body, "</section>"])


def _figure(labels, freqs, low, high, title, projected, plots: bool) -> str:
    if not plots:
        return ""
    svg = interval_plot(labels, freqs, low, high, title, projected)
    return f"<figure>{svg}</figure>"


def _table(labels, freqs, errors, low, high, projected) -> str:
    rows = [
        "<table><thead><tr><th>category</th><th>estimate</th><th>s.e.</th>"
        "<th>interval</th><th>projected</th></tr></thead><tbody>"
    ]
    for j, label in enumerate(labels):
        flag = " <span class=flag title='outside [0, 1]'>▲</span>" if out_of_range(freqs[j]) else ""
        rows.append(
            f"<tr><td>{escape(label)}</td><td>{share(freqs[j])}{flag}</td>"
            f"<td>{share(errors[j])}</td><td>{interval(low[j], high[j])}</td>"
            f"<td>{share(projected[j])}</td></tr>"
        )
    rows.append("</tbody></table>")
    return "\n".join(rows)


def _marginal(marginal: Marginal, plots: bool) -> str:
    title = f"marginal of {marginal.attribute}"
    rows = [
        "<table><thead><tr><th>category</th><th>estimate</th><th>interval</th></tr></thead><tbody>"
    ]
    for j, label in enumerate(marginal.labels):
        rows.append(
            f"<tr><td>{escape(label)}</td><td>{share(marginal.frequencies[j])}</td>"
            f"<td>{interval(marginal.ci_low[j], marginal.ci_high[j])}</td></tr>"
        )
    rows.append("</tbody></table>")
    figure = _figure(
        marginal.labels, marginal.frequencies, marginal.ci_low, marginal.ci_high, title, None, plots
    )
    return "\n".join(['<div class="pair">', figure, *rows, "</div>"])


def _test(test: TestSection) -> str:
    parts = [
        f'<div class="test"><h3>{escape(test.analysis.title)}</h3>',
        f"<p>{escape(test.sentence)}</p>",
    ]
    result = test.result
    if result is not None:
        dof = "Monte Carlo null" if result.dof is None else f"{result.dof} degrees of freedom"
        parts.append(
            f'<p class="note">statistic {result.statistic:.4g}, {dof}, {result_p(result)}, '
            f"α = {result.alpha:g}; {calibration_text(result)}</p>"
        )
    parts.append("</div>")
    return "\n".join(parts)
