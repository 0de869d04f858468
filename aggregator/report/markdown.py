"""The survey report as Markdown: the same content as the HTML page, tables instead of plots."""

from __future__ import annotations

from aggregator.presentation.numbers import interval, out_of_range, reports, share
from aggregator.report.content import QuestionSection, SurveyReport


def render_markdown(report: SurveyReport) -> str:
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
        "",
        f"Privacy cost per device for answering every question once: {' plus '.join(spent)}; "
        f"the device budget that pays for it: `ldp-client ... {cost.flags}`.",
    ]
    if report.side_note:
        lines += ["", f"**{report.side_note}**"]
    if report.group_note:
        lines += ["", f"**{report.group_note}**"]
    for section in report.questions:
        lines += _question(section)
    lines += [
        "",
        "Estimates are unbiased and may fall outside [0, 1] (marked ▲); the projected column is "
        "the closest proper distribution.",
    ]
    return "\n".join(lines) + "\n"


def _question(section: QuestionSection) -> list[str]:
    question = section.question
    lines = ["", f"## {question.id}", ""]
    if question.text:
        lines += [question.text, ""]
    lines.append(f"{question.mechanism.describe()}, n = {section.n:,}.")
    if not section.released:
        lines += [
            "",
            f"**Not released:** {reports(section.n)} so far, results are released from "
            f"{section.min_batch_size:,}.",
        ]
    elif section.withheld:
        lines += ["", f"No estimate: {section.withheld}."]
    else:
        est = section.estimate
        assert est is not None
        projected = est.projected()
        lines += [
            "",
            "| category | estimate | s.e. | interval | projected |",
            "|---|---:|---:|---|---:|",
        ]
        for j, label in enumerate(question.labels):
            flag = " ▲" if out_of_range(est.frequencies[j]) else ""
            lines.append(
                f"| {label} | {share(est.frequencies[j])}{flag} | {share(est.standard_errors[j])} "
                f"| {interval(est.ci_low[j], est.ci_high[j])} | {share(projected[j])} |"
            )
        for marginal in section.marginals:
            lines += [
                "",
                f"Marginal of {marginal.attribute}:",
                "",
                "| category | estimate | interval |",
                "|---|---:|---|",
            ]
            for j, label in enumerate(marginal.labels):
                lines.append(
                    f"| {label} | {share(marginal.frequencies[j])} | "
                    f"{interval(marginal.ci_low[j], marginal.ci_high[j])} |"
                )
    for test in section.tests:
        lines += ["", f"### {test.analysis.title}", "", test.sentence]
    return lines
