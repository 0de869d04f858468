"""Bugs the type checker found (issue 23): each test failed before its fix."""

from __future__ import annotations

import pytest

from aggregator.confirm.plan import parse_plan
from aggregator.survey_file.config import ConfigError, load_surveys
from client import progress


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
