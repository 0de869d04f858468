"""The survey report as Markdown: the same content as the HTML page, tables instead of plots."""

from __future__ import annotations

from collections.abc import Mapping

from aggregator.presentation.numbers import interval, out_of_range, reports, share
from aggregator.report import sequential
from aggregator.report.content import QuestionSection, SurveyReport
from aggregator.report.design import design_markdown
from aggregator.report.groups import COMPLEMENT, COMPLEMENT_NOTE, GroupColumn
from aggregator.report.large import is_large, shown, top_note
from aggregator.report.sealed import SealedFamily
from aggregator.report.sentences import p_text
from aggregator.survey_file.design import IGNORES_DESIGN


def render_markdown(report: SurveyReport, full_tables: Mapping[str, str] | None = None) -> str:
    """The report as Markdown; a large section links its full table at ``full_tables[question
    id]`` (a path relative to the report), which ``ldp-aggregator report`` writes."""
    survey = report.survey
    cost = report.cost
    spent = []
    if cost.epsilon:
        spent.append(f"ε = {cost.epsilon:g} (pure LDP)")
    if cost.rho:
        spent.append(f"ρ = {cost.rho:g} zCDP")
    lines = [
        f"# {survey.title or survey.id}",
        "",
        f"Survey `{survey.id}`, generated {report.generated}; {100 * report.confidence:g}% "
        f"intervals; results are released from {survey.min_batch_size:,} reports per question.",
    ]
    if report.side_note:
        lines += ["", f"**{report.side_note}**"]
    if report.design_note:
        lines += ["", f"**{report.design_note}**"]
    if report.side == "confirmation":
        lines += _sealed(report.sealed)
    lines += [
        "",
        f"Privacy cost per device for answering every question once: {' plus '.join(spent)}; "
        f"the device budget that pays for it: `ldp-client ... {cost.flags}`.",
    ]
    if report.group_note:
        lines += ["", f"**{report.group_note}**"]
    for section in report.questions:
        lines += _question(section, report.result_label, full_tables or {})
    if report.sequential:
        lines += sequential.render_markdown(report.sequential)
    lines += [
        "",
        "Estimates are unbiased and may fall outside [0, 1] (marked ▲); the projected column is "
        "the closest proper distribution.",
    ]
    return "\n".join(lines) + "\n"


def _sealed(family: SealedFamily | None) -> list[str]:
    """The sealed confirmatory family, as sealed: the first section of a confirmation report."""
    lines = ["", "## Confirmatory results (sealed)", ""]
    if family is None:
        return [
            *lines,
            "No sealed record was given to this report: it shows no confirmatory result.",
        ]
    lines += [
        f"Plan sha256 `{family.plan_sha256}`, sealed at {family.sealed_at}: "
        f"{len(family.tests)} preregistered test(s), {family.adjustment} at family-wise "
        f"α = {family.alpha:g}. Read from the sealed record, not recomputed.",
        "",
        f"| test | question | n | statistic | p | adjusted p ({family.multiplicity}) | decision |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for t in family.tests:
        lines.append(
            f"| {t.title} | {t.question_id} | {t.n:,} | {t.statistic:.4f} | {p_text(t.pvalue)} "
            f"| {p_text(t.adjusted)} | {t.decision} |"
        )
    return lines


def _question(section: QuestionSection, label: str, links: Mapping[str, str]) -> list[str]:
    question = section.question
    lines = ["", f"## {question.id}", ""]
    if question.text:
        lines += [question.text, ""]
    lines.append(f"{question.mechanism.describe()}, n = {section.n:,}.")
    if label:
        lines += ["", f"*{label}*"]
    if not section.released:
        lines += [
            "",
            f"**Not released:** {reports(section.n)} so far, results are released from "
            f"{section.min_batch_size:,}.",
        ]
    elif section.withheld:
        lines += ["", f"No estimate: {section.withheld}."]
    else:
        design = section.design
        if design is not None and design.plotted():  # the design-based estimate first
            lines += design_markdown(design, section.question.labels, shown(section))
            lines += ["", "Simple-random-sample estimate:", "", f"*{IGNORES_DESIGN}*"]
            lines += _estimate(section, links)
        else:
            lines += _estimate(section, links)
            lines += design_markdown(design, section.question.labels, shown(section))
        for marginal in section.marginals:
            lines += [
                "",
                f"Marginal of {marginal.attribute}:",
                "",
                "| category | estimate | interval |",
                "|---|---:|---|",
            ]
            for j, name in enumerate(marginal.labels):
                lines.append(
                    f"| {name} | {share(marginal.frequencies[j])} | "
                    f"{interval(marginal.ci_low[j], marginal.ci_high[j])} |"
                )
    for test in section.tests:
        lines += ["", f"### {test.analysis.title}", ""]
        if label:
            lines += [f"*{label}*", ""]
        lines.append(test.sentence)
        if test.design == IGNORES_DESIGN:
            lines += ["", f"*{IGNORES_DESIGN}*"]
        elif test.design:
            lines += ["", f"Design-based: {test.design}."]
    return lines


def _estimate(section: QuestionSection, links: Mapping[str, str]) -> list[str]:
    """The estimate's table (the top categories of a large section), a column per group."""
    est = section.estimate
    assert est is not None
    projected = est.projected()
    lines = [""]
    if is_large(section):
        link = links.get(section.question.id)
        where = (
            f"[the full table (CSV)]({link})"
            if link
            else "the full table is written beside the report by `ldp-aggregator report`"
        )
        lines += [f"{top_note(section)}: {where}.", ""]
    name = "pooled estimate" if section.groups else "estimate"
    groups = "".join(f" {_group_header(column)} |" for column in section.groups)
    lines += [
        f"| category | {name} | s.e. | interval | projected |{groups}",
        "|---|---:|---:|---|---:|" + "---|" * len(section.groups),
    ]
    labels = section.question.labels
    for j in shown(section):
        flag = " ▲" if out_of_range(est.frequencies[j]) else ""
        cells = "".join(f" {_group_cell(column, j)} |" for column in section.groups)
        lines.append(
            f"| {labels[j]} | {share(est.frequencies[j])}{flag} | {share(est.standard_errors[j])} "
            f"| {interval(est.ci_low[j], est.ci_high[j])} | {share(projected[j])} |{cells}"
        )
    if any(column.withheld == COMPLEMENT for column in section.groups):
        lines += ["", f"{COMPLEMENT_NOTE}."]
    return lines


def _group_header(column: GroupColumn) -> str:
    return column.group if column.estimate is None else f"{column.group} (n = {column.n:,})"


def _group_cell(column: GroupColumn, j: int) -> str:
    est = column.estimate
    if est is None:
        return column.withheld
    return f"{share(est.frequencies[j])} {interval(est.ci_low[j], est.ci_high[j])}"
