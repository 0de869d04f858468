"""`categories_file` in a survey file: hundreds of labels read from a file beside the survey file,
in order; every mistake is one message naming the question (and the label)."""

from __future__ import annotations

import pytest
from cli_runner import run_cli

from aggregator.survey_file.config import ConfigError, load_surveys

QUESTION = """
[[survey]]
id = "jobs"
[[survey.question]]
id = "occupation"
mechanism = "hadamard_response"
epsilon = 1.0
"""


def write(folder, body: str, labels: list[str] | None = None):
    (folder / "lists").mkdir(exist_ok=True)
    if labels is not None:
        (folder / "lists" / "occupations.txt").write_text("\n".join(labels) + "\n")
    path = folder / "survey.toml"
    path.write_text(QUESTION + body)
    return path


def test_labels_come_from_the_file_in_order(tmp_path, monkeypatch) -> None:
    labels = [f"ISCO {code:04d} worker" for code in range(300)]
    path = write(tmp_path, 'categories_file = "lists/occupations.txt"\n', ["# ISCO-08", *labels])
    monkeypatch.chdir(tmp_path / "lists")  # relative to the survey file, not the working folder
    question = load_surveys(path)["jobs"].question("occupation")
    assert list(question.labels) == labels and question.k == 300


def test_an_attribute_may_read_its_categories_from_a_file(tmp_path) -> None:
    body = """
[[survey.question]]
id = "job_by_region"
mechanism = "randomized_response"
epsilon = 1.0
attributes = [
    { name = "job", categories_file = "lists/occupations.txt" },
    { name = "region", categories = ["north", "south"] },
]
"""
    path = write(tmp_path, 'categories = ["a", "b"]\n' + body, ["nurse", "", "baker", "pilot"])
    question = load_surveys(path)["jobs"].question("job_by_region")
    assert question.shape == (3, 2) and list(question.labels[:2]) == ["nurse|north", "nurse|south"]


@pytest.mark.parametrize(
    ("body", "labels", "fragment"),
    [
        (
            'categories = ["a", "b"]\ncategories_file = "lists/occupations.txt"\n',
            ["x", "y"],
            "not both",
        ),
        ('categories_file = "lists/absent.txt"\n', None, "cannot read categories_file"),
        ('categories_file = "lists/occupations.txt"\n', ["# only a comment"], "lists no"),
        ('categories_file = "lists/occupations.txt"\n', ["nurse", "pilot", "nurse"], "'nurse'"),
        ("categories_file = 3\n", None, "must name a file"),
    ],
)
def test_mistakes_name_the_question(tmp_path, body, labels, fragment) -> None:
    path = write(tmp_path, body, labels)
    with pytest.raises(ConfigError) as caught:
        load_surveys(path)
    assert fragment in str(caught.value) and "occupation" in str(caught.value)


def test_check_config_reports_a_repeated_label_in_one_line(tmp_path) -> None:
    path = write(tmp_path, 'categories_file = "lists/occupations.txt"\n', ["a", "b", "a"])
    done = run_cli("agg", "check-config", str(path))

    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "'a'" in done.stderr
