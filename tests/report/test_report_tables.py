"""The report's tables for survey practice (docs/reports.md): a large domain shows its top
categories (a sorted plot and a table) and links its full table as CSV, checked in a real
headless Chromium; a pooled report of a survey with a public group label shows a column per
group, never the numbers of a group below the release threshold, nor numbers that would give
them away by differencing."""

from __future__ import annotations

import csv
import io
import os
import re
import time
from html import unescape
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import numpy as np
import pytest
from cli_runner import run_cli
from report.test_report import chromium, run_chromium  # noqa: F401  (the fixture)

from aggregator.histogram import Histogram
from aggregator.presentation.numbers import interval, share
from aggregator.report import build_report, render_html, render_markdown
from aggregator.report.groups import BELOW, COMPLEMENT, COMPLEMENT_NOTE
from aggregator.report.large import TOP, full_table_csv
from aggregator.service.server.app import open_store
from aggregator.stats import estimate
from aggregator.store import ingest
from aggregator.survey_file.config import load_surveys
from protos.ldp.v1 import ldp_pb2

CONFIG = """
[[survey]]
id = "health"
min_batch_size = 100
group_label = "clinic"
group_values = ["north", "south", "east"]

[[survey.question]]
id = "occupation"
categories = [{labels}]
mechanism = "hadamard_response"
epsilon = 2.0

[[survey.question]]
id = "insured"
categories = ["yes", "no", "unsure"]
mechanism = "randomized_response"
epsilon = 1.0
"""


def write_config(tmp_path: Path, k: int) -> Path:
    path = tmp_path / "health.toml"
    labels = ", ".join(f'"occ-{j:04d}"' for j in range(k))
    path.write_text(CONFIG.format(labels=labels))
    return path


def zipf(k: int, seed: int) -> np.ndarray:
    p = 1 / np.arange(1, k + 1) ** 1.1
    np.random.default_rng(seed).shuffle(p)
    return p / p.sum()


def simulate(question, p, n, rng) -> Histogram:
    answers = rng.choice(question.k, size=n, p=p)
    return Histogram.from_reports(question.mechanism, question.mechanism.simulate(answers, rng))


def fill(config: Path, db: Path, sizes: dict[str, int], seed: int = 0) -> None:
    """Reports of every question from each clinic, stored as a server stores them."""
    surveys = load_surveys(config)
    rng = np.random.default_rng(seed)
    batch = []
    for question in surveys["health"].questions:
        truth = zipf(question.k, 1) if question.k > 3 else np.array([0.7, 0.2, 0.1])
        for group, n in sizes.items():
            values = question.mechanism.simulate(rng.choice(question.k, size=n, p=truth), rng)
            batch += [
                ldp_pb2.Report(
                    report_id=os.urandom(16),
                    survey_id="health",
                    question_id=question.id,
                    payload=question.mechanism.encode(v),
                    group=group,
                )
                for v in values
            ]
    store = open_store(surveys, str(db))
    try:
        store.submit_batches(ingest.validate_upload(batch, surveys).batches).result()
    finally:
        store.close()


def section_of(page: str, question_id: str) -> str:
    return page.split(f'<section id="q-{question_id}">')[1].split("</section>")[0]


def table_rows(html: str) -> list[list[str]]:
    """The estimate table's body rows as text cells (a line break read as a space)."""
    body = html.split('<table class="estimate">')[1].split("<tbody>")[1].split("</tbody>")[0]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in body.split("</tr>") if "<td" in row]
    return [[text(cell) for cell in row] for row in rows]


def text(cell: str) -> str:
    return unescape(re.sub(r"<[^>]+>", "", cell.replace("<br>", " "))).strip()


def full_table_href(section: str) -> str:
    found = re.search(r'<a class="full-table" href="([^"]+)"', section)
    assert found is not None, "no link to the full table"
    return unescape(found.group(1))


@pytest.mark.slow
def test_a_large_domain_shows_its_top_categories_and_links_the_full_table(
    tmp_path,
    chromium,  # noqa: F811
):
    """Through the command, over a real SQLite store: the top TOP categories sorted, the full
    table beside the page, and in Chromium the section, its rows and a link that resolves."""
    k = 200
    config, db = write_config(tmp_path, k), tmp_path / "reports.sqlite"
    fill(config, db, {"north": 2_000, "south": 2_000, "east": 1_000})
    out = tmp_path / "report.html"
    done = run_cli("agg", "report", "--config", config, "--db", db, "--out", out, check=True)
    assert "full tables: report-occupation.csv" in done.stdout

    table = tmp_path / "report-occupation.csv"
    rows = list(csv.DictReader(io.StringIO(table.read_text())))
    assert [row["category"] for row in rows] == [f"occ-{j:04d}" for j in range(k)]
    top = sorted(rows, key=lambda row: -float(row["estimate"]))[:TOP]

    dom = run_chromium(chromium, "--dump-dom", out.as_uri()).stdout
    section = section_of(dom, "occupation")
    assert section.count("<svg") == 1  # one sorted plot of the top categories
    shown = table_rows(section)
    assert [row[0] for row in shown] == [row["category"] for row in top]
    assert [row[1] for row in shown] == [share(float(row["estimate"])) for row in top]
    href = full_table_href(section)
    target = urlparse(urljoin(out.as_uri(), href))
    assert target.scheme == "file" and Path(unquote(target.path)) == table
    small = section_of(dom, "insured")  # 3 categories: every one, in the question's order
    assert [row[0] for row in table_rows(small)] == ["yes", "no", "unsure"]
    assert "full-table" not in small


def test_a_2000_category_section_is_small(tmp_path):
    """k = 2,000, n = 60,000 (issue 25: 2.85 MB and 18 s before): the section is built and
    rendered in under 3 s of CPU (start-up aside), the page stays small, and a page rendered
    without files beside it carries the full table as a data: URL."""
    import matplotlib.figure  # noqa: F401  (start-up, not the section's cost)

    config = write_config(tmp_path, 2_000)
    survey = load_surveys(config)["health"]
    question = survey.question("occupation")
    hist = simulate(question, zipf(question.k, 1), 60_000, np.random.default_rng(5))
    cpu = time.process_time()
    report = build_report(survey, {"occupation": hist})
    linked = render_html(report, {"occupation": "report-occupation.csv"})
    assert time.process_time() - cpu < 3.0
    assert len(linked.encode()) < 150_000
    section = section_of(linked, "occupation")
    assert len(table_rows(section)) == TOP
    assert 'href="report-occupation.csv"' in section

    inline = section_of(render_html(report), "occupation")
    href = full_table_href(inline)
    prefix = "data:text/csv;charset=utf-8,"
    assert href.startswith(prefix)
    assert unquote(href.removeprefix(prefix)) == full_table_csv(report.questions[0])

    text = render_markdown(report, {"occupation": "report-occupation.csv"})
    assert "[the full table (CSV)](report-occupation.csv)" in text
    assert text.count("| occ-") == TOP


def grouped(tmp_path: Path, sizes: dict[str, int], seed: int = 2):
    """The pooled report of ``insured`` with these clinic sizes: (report, group histograms)."""
    survey = load_surveys(write_config(tmp_path, 60))["health"]
    question = survey.question("insured")
    rng = np.random.default_rng(seed)
    groups = {
        g: simulate(question, np.array([0.7, 0.2, 0.1]), n, rng) if n else
        Histogram.empty(question.mechanism)
        for g, n in sizes.items()
    }  # fmt: skip
    pooled = sum(groups.values(), Histogram.empty(question.mechanism))
    given = {("insured", g): hist for g, hist in groups.items()}
    return build_report(survey, {"insured": pooled}, group_histograms=given), groups


def test_each_group_has_a_column_beside_the_pooled_estimate(tmp_path):
    report, groups = grouped(tmp_path, {"north": 400, "south": 300, "east": 200})
    section = report.questions[1]
    assert [column.group for column in section.groups] == ["north", "south", "east"]
    page = section_of(render_html(report), "insured")
    assert "<th>north (n = 400)</th><th>south (n = 300)</th><th>east (n = 200)</th>" in page
    rows = table_rows(page)
    for g, column in zip(groups, section.groups, strict=True):
        own = estimate(groups[g], 0.95)
        np.testing.assert_allclose(column.estimate.frequencies, own.frequencies)
        cells = [row[5 + list(groups).index(g)] for row in rows]
        assert cells == [
            f"{share(own.frequencies[j])} {interval(own.ci_low[j], own.ci_high[j])}"
            for j in range(3)
        ]
    markdown = render_markdown(report)
    assert "| north (n = 400) | south (n = 300) | east (n = 200) |" in markdown


def test_a_small_group_shows_no_numbers_and_cannot_be_recovered_by_differencing(tmp_path):
    """east (40 reports) is below the threshold of 100; pooled minus north minus south would be
    east, so the smaller of the two (south) is withheld too; an empty group needs no cover."""
    report, _ = grouped(tmp_path, {"north": 500, "south": 300, "east": 40})
    columns = {column.group: column for column in report.questions[1].groups}
    assert columns["east"].estimate is None and columns["east"].withheld == BELOW
    assert columns["south"].estimate is None and columns["south"].withheld == COMPLEMENT
    assert columns["north"].estimate is not None
    page = section_of(render_html(report), "insured")
    assert "<th>east</th>" in page and "(n = 40)" not in page
    for row in table_rows(page):
        assert row[6:] == [COMPLEMENT, BELOW]
    markdown = render_markdown(report)
    assert markdown.count(f" {BELOW} |") == 3

    report, _ = grouped(tmp_path, {"north": 500, "south": 300, "east": 0})
    columns = {column.group: column for column in report.questions[1].groups}
    assert columns["east"].withheld == BELOW
    assert columns["north"].estimate is not None and columns["south"].estimate is not None

    report, _ = grouped(tmp_path, {"north": 500, "south": 60, "east": 60})
    columns = {column.group: column for column in report.questions[1].groups}
    assert [columns[g].withheld for g in ("south", "east")] == [BELOW, BELOW]
    assert columns["north"].estimate is not None  # south and east together reach 100


def test_the_command_shows_group_columns_from_the_store(tmp_path):
    config, db = write_config(tmp_path, 60), tmp_path / "reports.sqlite"
    fill(config, db, {"north": 600, "south": 500, "east": 30})
    out = tmp_path / "report.md"
    run_cli("agg", "report", "--config", config, "--db", db, "--out", out, "--format", "md",
            check=True)  # fmt: skip
    insured = out.read_text().split("## insured")[1]
    assert "| pooled estimate | s.e. | interval | projected | north (n = 600) | south | east |" in (
        insured
    )
    assert "(n = 500)" not in insured and "(n = 30)" not in insured
    assert insured.count(f" {BELOW} |") == 3 and insured.count(f" {COMPLEMENT} |") == 3
    assert COMPLEMENT_NOTE in insured  # said once, under the table
    single = tmp_path / "north.md"
    run_cli("agg", "report", "--config", config, "--db", db, "--out", single, "--format", "md",
            "--group", "north", check=True)  # fmt: skip
    assert "pooled estimate" not in single.read_text()  # one group's report: no columns
