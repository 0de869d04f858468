"""Design weights whose size or ratio would overflow the variance, or drown its smaller terms
below double precision, are refused in one line where the design cells are built (issue 36
item 5): by a Design of reports and by the cells of a store's design keys alike."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.errors import InvalidInputError
from aggregator.stats.design.cells import MAX_WEIGHT_RATIO, Design, design_cells
from aggregator.stats.design.estimate import design_estimate
from aggregator.stats.design.keys import keyed_cells

STRATA = np.repeat([0, 1], 4)
PSUS = np.tile([0, 0, 1, 1], 2)


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (np.array([1.0, 1e300] * 4), "lie in \\[1e-100, 1e\\+100\\], got 1 to 1e\\+300"),
        (np.array([1e-90, 1e90] * 4), "ratio of 1e\\+180"),
        (np.array([1.0, 2e12] * 4), "ratio of 2e\\+12, beyond 1e\\+12"),
        (np.full(8, 1e150), "lie in \\[1e-100, 1e\\+100\\]"),
        (np.full(8, 1e-150), "lie in \\[1e-100, 1e\\+100\\]"),
        (np.array([1.0, np.inf] * 4), "finite and positive"),
        (np.array([1.0, np.nan] * 4), "finite and positive"),
        (np.array([1.0, 0.0] * 4), "finite and positive"),
        (np.array([1.0, -2.0] * 4), "finite and positive"),
    ],
)
def test_weights_that_break_the_variance_are_refused(weights, message):
    with pytest.raises(InvalidInputError, match=message) as design_error:
        Design(STRATA, PSUS, weights)
    with pytest.raises(InvalidInputError, match=message) as keyed_error:
        keyed_cells(STRATA, PSUS, weights, None, np.ones(8), np.ones((8, 2)), np.ones((8, 2)))
    for error in (design_error, keyed_error):
        assert "\n" not in str(error.value)


def test_weights_at_the_bound_still_give_an_answer_that_ignores_their_scale():
    """A ratio of 1e12 is accepted, and the Hajek estimate and its SE do not depend on the
    weights' common scale: multiplying them all by 1e80 changes only rounding, which at this
    ratio costs the SE about 2.2e-16 x 1e12 of relative precision (four digits are left)."""
    rng = np.random.default_rng(1)
    x = np.eye(2)[rng.integers(0, 2, 8)]
    weights = np.array([1.0, MAX_WEIGHT_RATIO, 3.0, 5.0, 2.0, 7.0, 1.0, 4.0])
    one = design_estimate(design_cells(x, Design(STRATA, PSUS, weights)), None)
    scaled = design_estimate(design_cells(x, Design(STRATA, PSUS, weights * 1e80)), None)
    assert np.all(np.isfinite(one.standard_error)) and np.all(one.standard_error > 0)
    np.testing.assert_allclose(scaled.estimate, one.estimate, rtol=1e-12)
    np.testing.assert_allclose(scaled.standard_error, one.standard_error, rtol=1e-3)
