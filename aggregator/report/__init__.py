"""The survey report: every question's release status, estimates with intervals (as plots and
tables; the top categories of a large domain, its full table as CSV), a column per public group,
marginals of multi-attribute questions, the per-device privacy cost and the tests the survey
file declares, each with a plain-language sentence; on a sealed confirmation side the sealed
family first (docs/reports.md). Rendered as one self-contained HTML page or as Markdown.

May import ``aggregator.stats``, ``aggregator.histogram``, ``aggregator.survey_file``,
``aggregator.presentation``, ``aggregator.confirm.labels``, ``aggregator.errors``,
``aggregator.analysis.monitor_answers`` (the plain Monitor answers of the "as of n" section) and
``client``, scipy; matplotlib (the ``[plot]`` extra) only in ``plots``. Never
``aggregator.service``, ``aggregator.store`` or ``aggregator.jobs``: the caller loads histograms.
"""

from aggregator.report.content import QuestionSection, SurveyReport, build_report
from aggregator.report.html import render_html
from aggregator.report.markdown import render_markdown

__all__ = ["QuestionSection", "SurveyReport", "build_report", "render_html", "render_markdown"]
