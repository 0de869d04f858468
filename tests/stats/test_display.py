"""Estimates and test results in notebooks and data frames: ``_repr_html_`` shows the summary
table, ``to_frame`` gives pandas frames with the same numbers."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from aggregator.errors import InvalidInputError
from aggregator.histogram import Histogram
from aggregator.stats import estimate, goodness_of_fit
from client.mechanisms import GaussianNoise, RandomizedResponse

LABELS = ["great", "fine", "low", "<bad>"]


@pytest.fixture
def hist() -> Histogram:
    mech = RandomizedResponse(4, 1.0)
    rng = np.random.default_rng(4)
    return Histogram.from_reports(mech, mech.simulate(rng.choice(4, 2_000), rng))


def test_estimate_frame_has_the_estimate_s_numbers(hist):
    est = estimate(hist, simultaneous=True).with_labels(LABELS)
    frame = est.to_frame()
    assert list(frame.index) == LABELS and frame.index.name == "category"
    np.testing.assert_array_equal(frame["estimate"], est.frequencies)
    np.testing.assert_array_equal(frame["ci_low"], est.ci_low)
    np.testing.assert_array_equal(frame["simultaneous_high"], est.simultaneous_high)
    assert frame.attrs["n"] == 2_000 and frame.attrs["interval_method"] == est.interval_method
    assert est.summary().splitlines()[2].lstrip().startswith("great")


def test_estimate_html_names_and_flags_categories():
    mech = GaussianNoise(4, 0.5)
    rng = np.random.default_rng(11)
    hist = Histogram.from_reports(mech, mech.simulate(np.repeat([1, 2], 300), rng))
    est = estimate(hist).with_labels(LABELS)
    page = est._repr_html_()
    assert "&lt;bad&gt;" in page and "<bad>" not in page
    assert page.count("\u25b2") == int(est.outside.sum()) + (1 if est.outside.any() else 0)
    assert "-0.0000" not in page and "n = 600" in page
    unlabelled = estimate(hist)._repr_html_()
    assert "<td>0</td>" in unlabelled and "<td>3</td>" in unlabelled


def test_labels_must_name_every_category(hist):
    with pytest.raises(InvalidInputError, match="each of the 4 categories, got 3"):
        estimate(hist).with_labels(LABELS[:3])


def test_result_frame_and_html(hist):
    result = goodness_of_fit(hist, np.array([0.7, 0.1, 0.1, 0.1]), calibration="monte-carlo", rng=2)
    frame = result.to_frame()
    assert len(frame) == 1 and frame.loc[0, "pvalue"] == result.pvalue
    assert frame.loc[0, "calibration"] == "monte-carlo"
    page = result._repr_html_()
    assert "reject H0" in page and "calibration: monte-carlo" in page
    assert f"m = {result.n_draws}" in page  # at the Monte Carlo floor: p <= 1/(m+1)


def test_without_pandas_to_frame_says_which_extra():
    code = (
        "import sys; sys.modules['pandas'] = None\n"
        "from aggregator.histogram import Histogram\n"
        "from aggregator.stats import estimate\n"
        "from client.mechanisms import RandomizedResponse\n"
        "est = estimate(Histogram(RandomizedResponse(2, 1.0), 10, [5, 5]))\n"
        "try:\n    est.to_frame()\nexcept ImportError as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "pip install 'ldp-survey[frame]'" in done.stdout, done.stderr
