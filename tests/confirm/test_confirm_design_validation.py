"""The confirmatory family's Type I on a clustered, weighted design (scripts/
validate_confirm_design.py, issue 36 item 7): sealed design-based by default it keeps the
family-wise level (inside the 99 % binomial band); the same plan run as a simple random sample
rejects a true null far more often. 300 trials here, 2,000 in docs/validation.md."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "validate_confirm_design.py"


def test_the_design_based_family_keeps_its_level_where_the_simple_one_does_not():
    spec = importlib.util.spec_from_file_location("validate_confirm_design", SCRIPT)
    assert spec is not None and spec.loader is not None
    study = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = study
    spec.loader.exec_module(study)
    trials = 300
    rates = study.run(trials, seed=29, epsilon=2.0, concentration=9.0)
    low, high = study.band(trials)
    assert low <= rates["design-based"] <= high, rates
    assert rates["as a simple random sample"] > 2 * high, rates
