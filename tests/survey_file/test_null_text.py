"""A goodness-of-fit null as users write it (aggregator/survey_file/null_text.py): 'uniform',
numbers in category order, a label table, a file; every mistake is one message, never a reordered
null."""

from __future__ import annotations

import pytest

from aggregator.survey_file.analyses import load_analyses
from aggregator.survey_file.config import ConfigError, load_surveys
from aggregator.survey_file.null_text import NullTextError, parse_null

LABELS = ("great", "fine", "low", "bad")


def test_uniform_numbers_and_tables_give_the_same_null() -> None:
    expected = (0.4, 0.3, 0.2, 0.1)
    assert parse_null(" Uniform ", LABELS) == (0.25,) * 4
    assert parse_null("0.4, 0.3,0.2 ,0.1", LABELS) == expected
    assert parse_null([0.4, 0.3, 0.2, 0.1], LABELS) == expected
    assert parse_null({"bad": 0.1, "low": 0.2, "great": 0.4, "fine": 0.3}, LABELS) == expected


def test_a_file_by_label_in_any_order_or_by_position(tmp_path) -> None:
    by_label = tmp_path / "p0.csv"
    by_label.write_text("category,p0\n# census 2021\nbad,0.1\n\nlow\t0.2\ngreat,0.4\nfine 0.3\n")
    assert parse_null(f"@{by_label}", LABELS) == (0.4, 0.3, 0.2, 0.1)
    by_position = tmp_path / "p0.txt"
    by_position.write_text("0.4\n0.3\n0.2, 0.1\n")
    assert parse_null(f"@{by_position}", LABELS) == (0.4, 0.3, 0.2, 0.1)
    likert = tmp_path / "likert.csv"
    likert.write_text("2,0.7\n1,0.3\n")  # labels that look like numbers stay labels
    assert parse_null(f"@{likert}", ("1", "2")) == (0.3, 0.7)
    labels_with_spaces = ("very good", "not good")
    spaced = tmp_path / "spaced.csv"
    spaced.write_text("not good,0.7\nvery good,0.3\n")
    assert parse_null(f"@{spaced}", labels_with_spaces) == (0.3, 0.7)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("0.5,0.5", "has 2 probabilities; the question has 4"),
        ("0.4,0.3,0.2,x", "'x' is not a number"),
        ("0.5,0.3,0.2,0.1", "must sum to 1"),
        ("0.4,0.3,0.4,-0.1", "non-negative"),
        ("nan,0.3,0.2,0.1", "non-negative"),
        ({"great": 0.4, "fine": 0.3, "low": 0.3}, "no probability for 1 categories: 'bad'"),
        ({"great": 1.0, "fine": 0, "low": 0, "bad": 0, "awful": 0}, "no category named 'awful'"),
        ([True, 0, 0, 0], "is not a probability"),
        (0.25, "must be 'uniform'"),
    ],
)
def test_mistakes_are_one_clear_message(value, fragment) -> None:
    with pytest.raises(NullTextError) as caught:
        parse_null(value, LABELS)
    assert fragment in str(caught.value)


def test_file_mistakes(tmp_path) -> None:
    twice = tmp_path / "twice.csv"
    twice.write_text("great,0.4\ngreat,0.3\nlow,0.2\nbad,0.1\n")
    empty = tmp_path / "empty.csv"
    empty.write_text("# nothing\n\n")
    for path, fragment in (
        (twice, "listed twice"),
        (empty, "holds no probabilities"),
        (tmp_path / "absent.csv", "cannot be read"),
    ):
        with pytest.raises(NullTextError) as caught:
            parse_null(f"@{path}", LABELS)
        assert fragment in str(caught.value) and str(path) in str(caught.value)


SURVEY = """
[[survey]]
id = "s"
[[survey.question]]
id = "mood"
categories = ["great", "fine", "low", "bad"]
mechanism = "randomized_response"
epsilon = 1.0
[[survey.analysis]]
question = "mood"
test = "goodness_of_fit"
"""


def test_survey_file_analyses_take_uniform_and_tables_but_not_files(tmp_path) -> None:
    path = tmp_path / "s.toml"
    for p0, expected in (
        ('"uniform"', (0.25,) * 4),
        ("{ bad = 0.1, low = 0.2, fine = 0.3, great = 0.4 }", (0.4, 0.3, 0.2, 0.1)),
        ("[0.4, 0.3, 0.2, 0.1]", (0.4, 0.3, 0.2, 0.1)),
    ):
        path.write_text(SURVEY + f"p0 = {p0}\n")
        analyses = load_analyses(path, load_surveys(path))
        assert analyses["s"][0].p0 == expected
    for p0, fragment in (
        ('"@p0.csv"', "cannot name a file"),
        ("{ great = 1.0 }", "no probability for 3 categories"),
        ("", "needs p0"),
    ):
        path.write_text(SURVEY + (f"p0 = {p0}\n" if p0 else ""))
        with pytest.raises(ConfigError) as caught:
            load_analyses(path, load_surveys(path))
        assert fragment in str(caught.value) and "analysis 1" in str(caught.value)
