"""Hostile numbers in a survey file (issue 37 item 7): each is refused by ``check-config`` and
``serve`` alike, in one line with exit status 2, never a traceback and never a server that
starts and then cannot answer (``min_batch_size = 2**64`` once started one whose GetSurvey
failed with UNKNOWN; ``epsilon = 1e308`` once ended check-config with an OverflowError)."""

from __future__ import annotations

import pytest
from cli_runner import run_cli, run_process

SURVEY = """
[[survey]]
id = "h"
min_batch_size = {min_batch_size}

[[survey.question]]
id = "q"
categories = ["a", "b", "c"]
mechanism = "{mechanism}"
{parameter} = {value}
"""

CASES = [
    ("18446744073709551616", "randomized_response", "epsilon", "1.0", "min_batch_size must be at"),
    ("1000000001", "randomized_response", "epsilon", "1.0", "at most 1,000,000,000"),
    ("100", "randomized_response", "epsilon", "1e308", "epsilon must be at most 100"),
    ("100", "flip_components", "epsilon", "100.5", "epsilon must be at most 100"),
    ("100", "laplace", "epsilon", "inf", "epsilon must be at most 100, got inf"),
    ("100", "randomized_response", "epsilon", "nan", "epsilon must be a positive finite number"),
    ("100", "gaussian", "rho", "1e308", "rho must be at most 10000"),
]


def survey_file(tmp_path, min_batch_size, mechanism, parameter, value):
    path = tmp_path / "surveys.toml"
    path.write_text(
        SURVEY.format(
            min_batch_size=min_batch_size, mechanism=mechanism, parameter=parameter, value=value
        )
    )
    return path


@pytest.mark.parametrize(("min_batch_size", "mechanism", "parameter", "value", "message"), CASES)
def test_check_config_and_serve_refuse_hostile_numbers(
    tmp_path, min_batch_size, mechanism, parameter, value, message
):
    path = survey_file(tmp_path, min_batch_size, mechanism, parameter, value)
    checked = run_cli("agg", "check-config", path)
    served = run_process(  # a process: a server that starts anyway fails the test at the timeout
        "agg", "serve", "--config", path, "--db", tmp_path / "r.sqlite", "--port", "0",
        "--insecure", timeout=60,
    )  # fmt: skip
    for done in (checked, served):
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2, done.stderr
        assert len(lines) == 1 and message in lines[0] and "Traceback" not in done.stderr, lines


def test_the_bounds_themselves_are_accepted(tmp_path):
    """Control: the largest values allowed still make a valid survey."""
    for mechanism, parameter, value in (
        ("randomized_response", "epsilon", "100"),
        ("gaussian", "rho", "10000"),
    ):
        path = survey_file(tmp_path, "1000000000", mechanism, parameter, value)
        done = run_cli("agg", "check-config", path)
        assert done.returncode == 0, done.stderr
