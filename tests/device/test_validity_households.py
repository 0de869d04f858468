"""Statistical check of the household guard (privacy-accounting spec D.3), fast enough for CI:
with every member of 4-person households answering a fully shared attribute the test's Type I
error is far above alpha; with one respondent per household it is inside the binomial band.
The full table (20,000 trials per setting) is scripts/household_type1.py -> docs/validation.md."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a statistical validation (docs/validation.md)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "household_type1.py"
TRIALS = 2000


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("household_type1", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def setting(study, label: str):
    return next(s for s in study.SETTINGS if s.label == label)


def test_guard_keeps_type1_at_alpha(study):
    guarded = setting(study, "households of 4, fully shared, guard")
    # the exact level of the discrete test on 500 independent reports is 0.0544, not 0.05
    level = study.independent_level(guarded.reports)
    assert level == pytest.approx(0.0544, abs=1e-4)
    low, high = study.band(TRIALS, level)  # 99.9% band: a correct test fails 1 time in 1,000
    assert low <= study.type1(guarded, TRIALS, seed=1604) <= high


def test_without_guard_type1_is_inflated_as_predicted(study):
    clustered = setting(study, "households of 4, fully shared, no guard")
    rate = study.type1(clustered, TRIALS, seed=1603)
    level = study.independent_level(clustered.reports)
    assert rate > study.band(TRIALS, level)[1]  # far outside the band of a correct test
    # the design-effect prediction (0.292) within 3.29 binomial standard errors
    predicted = clustered.predicted()
    assert abs(rate - predicted) <= 3.29 * (predicted * (1 - predicted) / TRIALS) ** 0.5
