"""Bugs the type checker found (issue 23): each test failed before its fix."""

from __future__ import annotations

from fractions import Fraction

import pytest

from aggregator.confirm.plan import parse_plan
from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats import goodness_of_fit
from aggregator.survey_file.config import ConfigError, load_surveys
from client.cli import progress
from client.mechanisms import RandomizedResponse


def test_track_counts_an_iterator_without_a_length_on_a_terminal(monkeypatch, capsys):
    """``track`` over a generator (no ``len``, no ``total``) drew its bar with total None, and
    ``bar`` compared None >= 10_000: a TypeError on a terminal only."""
    monkeypatch.setattr(progress, "shown", lambda quiet=False, stream=None: True)
    assert list(progress.track((i for i in range(3)), "count", unit="items")) == [0, 1, 2]
    assert "count: " in capsys.readouterr().err  # the bar was drawn


@pytest.mark.parametrize("value", ['["s1"]', "{ id = 's1' }"])
def test_a_plan_naming_its_survey_by_a_list_or_table_is_a_config_error(value):
    """``survey = [...]`` in a plan looked the list up in the surveys dict: TypeError
    (unhashable), a traceback instead of the ConfigError naming the mistake."""
    with pytest.raises(ConfigError, match="'survey' must name a survey"):
        parse_plan(f"survey = {value}\n", {})


@pytest.mark.parametrize("value", ['["randomized_response"]', "{ name = 'laplace' }"])
def test_a_mechanism_given_as_a_list_or_table_is_a_config_error(tmp_path, value):
    """``mechanism = [...]`` in a survey file was looked up in MECHANISM_NAMES: TypeError
    (unhashable) instead of the ConfigError naming the question."""
    path = tmp_path / "surveys.toml"
    path.write_text(
        '[[survey]]\nid = "s1"\n[[survey.question]]\nid = "q"\ncategories = ["a", "b"]\n'
        f"mechanism = {value}\nepsilon = 1.0\n"
    )
    with pytest.raises(ConfigError, match="question q: unknown mechanism"):
        load_surveys(path)


def test_an_alpha_that_rounds_to_one_is_refused():
    """``check_alpha`` compared the exact number with 1 and returned its float: a Fraction just
    below 1 passed as alpha = 1.0, a test that rejects whatever the data."""
    hist = Histogram(RandomizedResponse(k=4, epsilon=1.0), 2000, [500, 500, 500, 500])
    with pytest.raises(InvalidInputError, match="alpha must be in"):
        goodness_of_fit(hist, [0.25] * 4, alpha=Fraction(10**30 - 1, 10**30))
    with pytest.raises(InvalidInputError, match="alpha must be in"):
        goodness_of_fit(hist, [0.25] * 4, alpha=-(10**400))  # beyond the float range
    assert goodness_of_fit(hist, [0.25] * 4, alpha=Fraction(1, 20)).alpha == 0.05
