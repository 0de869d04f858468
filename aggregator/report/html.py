"""The survey report as one self-contained HTML page: inline CSS and SVG, no scripts, no
network, readable on screen and printed. A large domain's full table is the one thing linked: a
CSV file beside the page (or, rendered without files, a ``data:`` URL)."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape

from aggregator.presentation.numbers import interval, out_of_range, reports, share
from aggregator.report import sequential
from aggregator.report.content import Marginal, QuestionSection, SurveyReport, TestSection
from aggregator.report.design import design_html
from aggregator.report.groups import COMPLEMENT, COMPLEMENT_NOTE, GroupColumn
from aggregator.report.large import data_url, full_table_csv, is_large, shown, top_note
from aggregator.report.plots import PLOT_EXTRA_HINT, interval_plot, plots_available
from aggregator.report.sealed import SealedFamily
from aggregator.report.sentences import calibration_text, p_text, result_p
from aggregator.survey_file.design import IGNORES_DESIGN

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
th:first-child, td:first-child { text-align: left; } td { white-space: nowrap; }
.flag { color: #b35900; font-weight: 600; }
.held { background: #fff6e0; border-left: 4px solid #e0a100; padding: .5rem .8rem; }
.test { background: #f3f6fa; border-left: 4px solid #1f4e79; padding: .5rem .8rem;
        margin: .8rem 0; }
.note { font-size: .85rem; color: #555; }
.unplanned { color: #8a1c1c; font-weight: 600; font-size: .9rem; }
.sealed { background: #eef7ee; border-left: 4px solid #2e7d32; padding: .5rem .8rem; }
td.below { color: #777; font-style: italic; white-space: normal; }
@media print { body { max-width: none; margin: 0; } section, figure, .test { break-inside: avoid; }
               .pair figure { flex-basis: 22rem; } }
"""


def render_html(report: SurveyReport, full_tables: Mapping[str, str] | None = None) -> str:
    """The page. A large section (aggregator.report.large) links its full table at
    ``full_tables[question id]`` (a path relative to the page), else as a ``data:`` URL."""
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
    ]
    if report.side_note:
        parts.append(f'<p class="note"><strong>{escape(report.side_note)}</strong></p>')
    if report.design_note:
        parts.append(f'<p class="note"><strong>{escape(report.design_note)}</strong></p>')
    if report.side == "confirmation":
        parts.append(_sealed(report.sealed))
    parts.append(_cost(report))
    if report.group_note:
        parts.append(f'<p class="note"><strong>{escape(report.group_note)}</strong></p>')
    if not plots:
        parts.append(f'<p class="note">Tables only: {escape(PLOT_EXTRA_HINT)}.</p>')
    links = full_tables or {}
    parts += [
        _question(section, report.confidence, plots, report.result_label, links)
        for section in report.questions
    ]
    if report.sequential:
        parts.append(sequential.render_html(report.sequential, plots))
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


def _sealed(family: SealedFamily | None) -> str:
    """The sealed confirmatory family, as sealed: the first section of a confirmation report."""
    head = '<section id="confirmatory"><h2>Confirmatory results (sealed)</h2>'
    if family is None:
        return (
            f'{head}<p class="held">No sealed record was given to this report: it shows no '
            "confirmatory result.</p></section>"
        )
    rows = [
        f"<tr><td>{escape(t.title)}</td><td>{escape(t.question_id)}</td><td>{t.n:,}</td>"
        f"<td>{t.statistic:.4f}</td><td>{p_text(t.pvalue)}</td><td>{p_text(t.adjusted)}</td>"
        f"<td>{t.decision}</td></tr>"
        for t in family.tests
    ]
    return "\n".join(
        [
            head,
            f'<div class="sealed"><p>Plan sha256 <code>{escape(family.plan_sha256)}</code>, '
            f"sealed at {escape(family.sealed_at)}: {len(family.tests)} preregistered test(s), "
            f"{family.adjustment} at family-wise α = {family.alpha:g}. Read from the sealed "
            "record, not recomputed.</p>",
            "<table><thead><tr><th>test</th><th>question</th><th>n</th><th>statistic</th>"
            f"<th>p</th><th>adjusted p ({escape(family.multiplicity)})</th><th>decision</th>"
            "</tr></thead><tbody>",
            *rows,
            "</tbody></table></div></section>",
        ]
    )


def _question(
    section: QuestionSection,
    confidence: float,
    plots: bool,
    label: str,
    links: Mapping[str, str],
) -> str:
    question = section.question
    head = [
        f'<section id="q-{escape(question.id)}">',
        f"<h2>{escape(question.id)}</h2>",
        f"<p>{escape(question.text)}</p>" if question.text else "",
        f'<p class="meta">{escape(question.mechanism.describe())} · n = {section.n:,}</p>',
        f'<p class="unplanned">{escape(label)}</p>' if label else "",
    ]
    if not section.released or section.withheld:
        head.append(
            f'<p class="held">No estimate: {escape(section.withheld)}.</p>'
            if section.withheld
            else f'<p class="held">Not released: {reports(section.n)} so far, results are '
            f"released from {section.min_batch_size:,}.</p>"
        )
        head += [_test(test, label) for test in section.tests]
        return "\n".join([*head, "</section>"])
    est = section.estimate
    assert est is not None
    rows = shown(section)
    labels = [question.labels[j] for j in rows]
    projected = est.projected()
    title = f"{question.id}: estimate with {100 * confidence:g}% interval"
    body = []
    if is_large(section):
        title = f"{question.id}: the {len(rows)} largest estimates, {100 * confidence:g}% intervals"
        href = links.get(question.id) or data_url(full_table_csv(section))
        body.append(
            f'<p class="note">{escape(top_note(section))}: <a class="full-table" '
            f'href="{escape(href)}" download="{escape(question.id)}.csv">download the full '
            f"table (CSV, {question.k:,} rows)</a>.</p>"
        )
    design = section.design
    if design is not None and design.plotted():  # the design-based estimate is the headline
        assert design.estimate is not None and design.low is not None and design.high is not None
        body += [
            '<div class="pair">',
            _figure(
                labels, design.estimate[rows], design.low[rows], design.high[rows],
                f"{question.id}: design-based estimate, {100 * confidence:g}% intervals", None,
                plots,
            ),
            design_html(design, question.labels, rows),
            "</div>",
            "<h3>Simple-random-sample estimate</h3>",
            f'<p class="unplanned">{escape(IGNORES_DESIGN)}</p>',
            _table(section, rows, projected),
        ]  # fmt: skip
    else:
        body += [
            '<div class="pair">',
            _figure(
                labels, est.frequencies[rows], est.ci_low[rows], est.ci_high[rows], title,
                projected[rows], plots,
            ),
            _table(section, rows, projected),
            "</div>",
            design_html(design, question.labels, rows),
        ]  # fmt: skip
    for marginal in section.marginals:
        body += [f"<h3>Marginal: {escape(marginal.attribute)}</h3>", _marginal(marginal, plots)]
    body += [_test(test, label) for test in section.tests]
    return "\n".join([*head, *body, "</section>"])


def _figure(labels, freqs, low, high, title, projected, plots: bool) -> str:
    if not plots:
        return ""
    svg = interval_plot(labels, freqs, low, high, title, projected)
    return f"<figure>{svg}</figure>"


def _table(section: QuestionSection, rows, projected) -> str:
    """The estimate's table over the categories ``rows`` (in that order), with a column per
    public group of a pooled report."""
    est = section.estimate
    assert est is not None
    labels = section.question.labels
    freqs, errors, low, high = est.frequencies, est.standard_errors, est.ci_low, est.ci_high
    name = "pooled estimate" if section.groups else "estimate"
    groups = "".join(_group_header(column) for column in section.groups)
    lines = [
        f'<table class="estimate"><thead><tr><th>category</th><th>{name}</th><th>s.e.</th>'
        f"<th>interval</th><th>projected</th>{groups}</tr></thead><tbody>"
    ]
    for j in rows:
        flag = " <span class=flag title='outside [0, 1]'>▲</span>" if out_of_range(freqs[j]) else ""
        cells = "".join(_group_cell(column, j) for column in section.groups)
        lines.append(
            f"<tr><td>{escape(labels[j])}</td><td>{share(freqs[j])}{flag}</td>"
            f"<td>{share(errors[j])}</td><td>{interval(low[j], high[j])}</td>"
            f"<td>{share(projected[j])}</td>{cells}</tr>"
        )
    lines.append("</tbody></table>")
    if any(column.withheld == COMPLEMENT for column in section.groups):
        lines.append(f'<p class="note">{escape(COMPLEMENT_NOTE)}.</p>')
    return "\n".join(lines)


def _group_header(column: GroupColumn) -> str:
    if column.estimate is None:
        return f"<th>{escape(column.group)}</th>"
    return f"<th>{escape(column.group)} (n = {column.n:,})</th>"


def _group_cell(column: GroupColumn, j: int) -> str:
    """A group's estimate and interval of category j, or why it shows none."""
    est = column.estimate
    if est is None:
        return f'<td class="below" title="{escape(column.withheld)}">{escape(column.withheld)}</td>'
    return f"<td>{share(est.frequencies[j])}<br>{interval(est.ci_low[j], est.ci_high[j])}</td>"


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


def _test(test: TestSection, label: str) -> str:
    parts = [
        f'<div class="test"><h3>{escape(test.analysis.title)}</h3>',
        f'<p class="unplanned">{escape(label)}</p>' if label else "",
        f"<p>{escape(test.sentence)}</p>",
    ]
    if test.design == IGNORES_DESIGN:
        parts.append(f'<p class="unplanned">{escape(IGNORES_DESIGN)}</p>')
    elif test.design:
        parts.append(f'<p class="note">design-based: {escape(test.design)}</p>')
    result = test.result
    if result is not None:
        dof = "Monte Carlo null" if result.dof is None else f"{result.dof} degrees of freedom"
        parts.append(
            f'<p class="note">statistic {result.statistic:.4g}, {dof}, {result_p(result)}, '
            f"α = {result.alpha:g}; {calibration_text(result)}</p>"
        )
    parts.append("</div>")
    return "\n".join(parts)
