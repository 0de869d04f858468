"""The Beam job's results use the calibration it was given (``ldp-aggregator job
--calibration``), through the same function every released question goes through."""

from __future__ import annotations

import numpy as np

from aggregator.jobs.partial import Partial
from aggregator.jobs.results import Analysis, question_result
from aggregator.survey_file.config import load_surveys


def test_job_results_record_the_calibration(survey_file):
    survey = load_surveys(survey_file)["s1"]
    total = Partial(n=60, sums=np.array([40, 10, 5, 5, 0, 0], dtype=np.int64))
    uniform = tuple([1 / 6] * 6)
    for calibration in ("monte-carlo", "asymptotic"):
        analysis = Analysis(seed=1, calibration=calibration, gof={("s1", "joint"): uniform})
        tests = question_result(survey, "joint", total, analysis)["tests"]
        for name in ("gof", "independence"):
            assert tests[name]["calibration"] == calibration
            assert (tests[name]["n_draws"] is None) == (calibration == "asymptotic")
