"""The survey report: content (release rule, marginals, declared tests, sentences), the analysis
section of a survey file, and the rendered HTML in a real headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from aggregator.histogram import Histogram
from aggregator.presentation.numbers import share
from aggregator.report import build_report, render_html, render_markdown
from aggregator.report.sentences import format_p, result_sentence
from aggregator.stats import goodness_of_fit
from aggregator.survey_file.analyses import load_analyses
from aggregator.survey_file.config import ConfigError, load_surveys

SURVEY = """
[[survey]]
id = "panel"
title = "Panel & friends"
min_batch_size = 500

[[survey.question]]
id = "mood"
text = "How do you feel?"
categories = ["great", "fine", "low", "bad"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.question]]
id = "sleep"
categories = ["<5", "5-6", "7-8", ">8"]
mechanism = "gaussian"
rho = 0.5

[[survey.question]]
id = "smoke_by_sport"
mechanism = "randomized_response"
epsilon = 2.0
attributes = [
    { name = "smoker", categories = ["no", "yes"] },
    { name = "sport", categories = ["never", "weekly", "daily"] },
]

[[survey.analysis]]
title = "Is mood uniform?"
question = "mood"
test = "goodness_of_fit"
p0 = [0.25, 0.25, 0.25, 0.25]

[[survey.analysis]]
question = "smoke_by_sport"
test = "independence"
alpha = 0.01
"""

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "survey.toml"
    path.write_text(SURVEY)
    return path


def simulate(question, p, n, rng) -> Histogram:
    answers = rng.choice(question.k, size=n, p=p)
    return Histogram.from_reports(question.mechanism, question.mechanism.simulate(answers, rng))


def histograms(survey, n_by_question, seed=0):
    rng = np.random.default_rng(seed)
    return {
        q.id: simulate(q, np.full(q.k, 1 / q.k), n_by_question[q.id], rng)
        for q in survey.questions
        if q.id in n_by_question
    }


def test_analysis_section_is_read_and_checked(config):
    surveys = load_surveys(config)
    analyses = load_analyses(config, surveys)["panel"]
    assert [a.test for a in analyses] == ["goodness_of_fit", "independence"]
    assert analyses[0].p0 == (0.25, 0.25, 0.25, 0.25) and analyses[1].alpha == 0.01
    assert analyses[1].title == "independence: smoke_by_sport"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('question = "mood"\ntest = "anova"', "test must be one of"),
        ('question = "nope"\ntest = "independence"', "no question 'nope'"),
        ('question = "mood"\ntest = "independence"', "two attributes"),
        (
            'question = "mood"\ntest = "goodness_of_fit"\np0 = [0.5, 0.5]',
            "the question has 4 categories",
        ),
        ('question = "mood"\ntest = "goodness_of_fit"\np0 = [0.3, 0.3, 0.3, 0.3]', "sum to 1"),
        ('question = "mood"\ntest = "goodness_of_fit"\np0 = [1, 0, 0, 0]\nalpha = 2', "alpha"),
        (
            'question = "smoke_by_sport"\ntest = "independence"\np0 = [1]',
            "only goodness_of_fit takes p0",
        ),
        ('question = "mood"\ntest = "goodness_of_fit"\nlevel = 1', "unknown key"),
    ],
)
def test_a_wrong_analysis_is_refused_with_its_place(tmp_path, entry, message):
    head = SURVEY.split("[[survey.analysis]]")[0]
    path = tmp_path / "bad.toml"
    path.write_text(head + "[[survey.analysis]]\n" + entry + "\n")
    with pytest.raises(ConfigError, match=message) as caught:
        load_analyses(path, load_surveys(path))
    assert "survey 'panel' analysis 1" in str(caught.value)


def test_p0_within_the_stated_tolerance_of_one_is_accepted(tmp_path):
    head = SURVEY.split("[[survey.analysis]]")[0]
    path = tmp_path / "near.toml"
    path.write_text(
        head
        + '[[survey.analysis]]\nquestion = "mood"\ntest = "goodness_of_fit"\n'
        + "p0 = [0.1, 0.2, 0.3, 0.4000000000001]\n"
    )
    assert load_analyses(path, load_surveys(path))["panel"][0].p0[3] == 0.4000000000001


def test_nothing_is_released_below_the_threshold(config):
    survey = load_surveys(config)["panel"]
    analyses = load_analyses(config, {"panel": survey})["panel"]
    hists = histograms(survey, {"mood": 499, "smoke_by_sport": 2_000})
    report = build_report(survey, hists, analyses, now=NOW)
    mood, sleep, table = report.questions
    assert not mood.released and mood.n == 499 and mood.estimate is None
    assert mood.tests[0].result is None and "released from 500" in mood.tests[0].sentence
    assert not sleep.released and sleep.n == 0  # no reports at all
    assert table.released and table.tests[0].result is not None
    page = render_html(report)
    assert "Not released: 499 reports so far" in page
    assert "Not released: 0 reports so far" in page


def test_marginals_are_sums_of_the_joint_estimate_with_covering_intervals(config):
    """Marginal intervals of a 2x3 RR question cover the true marginal at about the nominal
    rate (300 simulated studies, 95% level: a 99% binomial band is about [0.91, 0.98])."""
    survey = load_surveys(config)["panel"]
    question = survey.question("smoke_by_sport")
    truth = np.array([0.30, 0.25, 0.15, 0.10, 0.12, 0.08])
    true_marginals = [truth.reshape(2, 3).sum(axis=1), truth.reshape(2, 3).sum(axis=0)]
    rng = np.random.default_rng(7)
    covered = np.zeros(5)
    trials = 300
    for _ in range(trials):
        hist = simulate(question, truth, 2_000, rng)
        report = build_report(survey, {question.id: hist}, now=NOW)
        section = report.questions[2]
        joint = section.estimate.frequencies.reshape(2, 3)
        smoker, sport = section.marginals
        assert smoker.attribute == "smoker" and sport.labels == ["never", "weekly", "daily"]
        np.testing.assert_allclose(smoker.frequencies, joint.sum(axis=1))
        np.testing.assert_allclose(sport.frequencies, joint.sum(axis=0))
        inside = [
            (m.ci_low <= t) & (t <= m.ci_high)
            for m, t in zip((smoker, sport), true_marginals, strict=True)
        ]
        covered += np.concatenate(inside)
    assert np.all(covered / trials >= 0.91), covered / trials
    assert np.all(covered / trials <= 0.985), covered / trials


def test_declared_tests_run_with_their_level_and_a_sentence(config):
    survey = load_surveys(config)["panel"]
    analyses = load_analyses(config, {"panel": survey})["panel"]
    rng = np.random.default_rng(3)
    skewed = np.array([0.55, 0.05, 0.05, 0.05, 0.05, 0.25])  # smoking and sport related
    hists = {
        "mood": simulate(survey.question("mood"), np.full(4, 0.25), 4_000, rng),
        "smoke_by_sport": simulate(survey.question("smoke_by_sport"), skewed, 4_000, rng),
    }
    report = build_report(survey, hists, analyses, now=NOW)
    gof = report.questions[0].tests[0]
    independence = report.questions[2].tests[0]
    assert gof.result.alpha == 0.05 and independence.result.alpha == 0.01
    assert independence.result.reject
    assert "smoker and sport are related at the 0.01 level" in independence.sentence
    assert "n = 4,000" in independence.sentence and "randomized_response" in independence.sentence
    assert ("consistent with" in gof.sentence) != gof.result.reject
    assert gof.result.calibration == "asymptotic" and "chi-square limit)" in gof.sentence
    simulated = goodness_of_fit(hists["mood"], np.full(4, 0.25), calibration="monte-carlo", rng=1)
    sentence = result_sentence("goodness_of_fit", simulated, ["mood"])
    assert f"Monte Carlo null, {simulated.n_draws:,} draws)" in sentence


def test_sentences_say_what_can_and_cannot_be_concluded(config):
    mood = load_surveys(config)["panel"].question("mood")
    result = goodness_of_fit(Histogram(mood.mechanism, 100, [25, 25, 25, 25]), np.full(4, 0.25))
    sentence = result_sentence("goodness_of_fit", result, ["mood"])
    assert sentence.startswith("The data are consistent with the hypothesized distribution")
    assert "does not show that it is the true distribution" in sentence
    assert format_p(0.0) == "p < 0.0001" and format_p(0.5) == "p = 0.500"
    assert format_p(0.004321) == "p = 0.0043"


def test_no_negative_zero_and_flagged_out_of_range_estimates(config):
    assert share(-0.00001) == "0.0000" and share(-0.2) == "-0.2000" and share(0.0) == "0.0000"
    survey = load_surveys(config)["panel"]
    # a Gaussian question with few reports and a zero category: estimates fall below 0
    rng = np.random.default_rng(11)
    hist = simulate(survey.question("sleep"), np.array([0.0, 0.5, 0.5, 0.0]), 600, rng)
    report = build_report(survey, {"sleep": hist}, now=NOW)
    est = report.questions[1].estimate
    assert (est.frequencies < 0).any()
    page = render_html(report)
    assert page.count("title='outside [0, 1]'") == int((est.frequencies < 0).sum())
    assert "-0.0000" not in page and "-0.0000" not in render_markdown(report)
    assert "▲" in render_markdown(report)


def test_markdown_has_every_question_and_the_device_cost(config):
    survey = load_surveys(config)["panel"]
    report = build_report(survey, histograms(survey, {"mood": 600, "sleep": 600}), now=NOW)
    text = render_markdown(report)
    for question in survey.questions:
        assert f"## {question.id}" in text
    assert "ε = 3 (pure LDP) plus ρ = 0.5 zCDP" in text
    assert "generated 2026-11-23T12:00:00+00:00" in text


def test_the_page_is_self_contained(config):
    survey = load_surveys(config)["panel"]
    report = build_report(survey, histograms(survey, {"mood": 600, "smoke_by_sport": 900}))
    page = render_html(report)
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert page.count("<svg") == 1 + 1 + 2  # mood, the joint table and its two marginals
    assert "Panel &amp; friends" in page  # titles are escaped


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def chromium() -> str:
    browser = find_chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install Debian's chromium package (.ci/run)")
        pytest.skip("chromium is not installed")
    return browser


def run_chromium(browser: str, *args: str) -> subprocess.CompletedProcess:
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)


@pytest.mark.slow
def test_the_report_renders_in_a_real_browser_on_screen_and_printed(config, tmp_path, chromium):
    """Chromium lays the page out (the DOM it parsed has every figure), paints it (a screenshot,
    kept beside the test, whose plot area is not blank) and prints it to PDF."""
    from matplotlib.image import imread

    survey = load_surveys(config)["panel"]
    analyses = load_analyses(config, {"panel": survey})["panel"]
    hists = histograms(survey, {"mood": 2_000, "sleep": 2_000, "smoke_by_sport": 2_000})
    page = tmp_path / "report.html"
    page.write_text(render_html(build_report(survey, hists, analyses)), encoding="utf-8")
    url = page.as_uri()

    dom = run_chromium(chromium, "--dump-dom", url).stdout
    assert dom.count("<svg") == 5 and dom.count("<table") == 5
    assert "Is mood uniform?" in dom

    shot = tmp_path / "report.png"
    run_chromium(chromium, f"--screenshot={shot}", "--window-size=1200,1600", url)
    pixels = imread(shot)
    assert pixels.shape[0] == 1600 and pixels.shape[1] == 1200
    ink = (pixels[..., :3].mean(axis=2) < 0.5).mean()  # share of dark pixels
    assert 0.005 < ink < 0.5, ink

    pdf = tmp_path / "report.pdf"
    run_chromium(chromium, f"--print-to-pdf={pdf}", "--no-pdf-header-footer", url)
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF") and data.count(b"/Type /Page") >= 2
