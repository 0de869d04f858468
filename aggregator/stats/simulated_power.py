"""Power of a test as it is run when it calibrates by simulation (docs/calibration.md, Planning).

The Monte Carlo test rejects when its statistic exceeds, up to the discreteness of 1/(m + 1), the
(1 - alpha) quantile of the statistic's null law; the bootstrap uses the null law at the fitted
parameters. Its power at an alternative p1 is therefore simulated directly: ``draws`` statistics
at the null (p0, or for a composite null the model's closest fit to p1) give the critical value,
``draws`` statistics at p1 give the rejection rate. A fixed seed makes the plan reproducible and,
as every n uses the same random stream, monotone enough to search over n.
"""

from __future__ import annotations

import numpy as np

from aggregator.errors import InvalidInputError
from aggregator.stats.calibration import simulate_null
from aggregator.stats.composite import _fit
from aggregator.stats.gof import _statistic
from aggregator.stats.models import ParametricModel
from client.mechanisms import Mechanism

PLAN_DRAWS = 1000  # goodness of fit; a composite null refits every draw, so it uses fewer
COMPOSITE_PLAN_DRAWS = 400
PLAN_SEED = 20_111


def simulated_power(
    mechanism: Mechanism,
    alternative: np.ndarray,
    n: float,
    alpha: float,
    method: str,
    *,
    null: np.ndarray | None = None,
    model: ParametricModel | None = None,
    fitted: np.ndarray | None = None,
    draws: int = PLAN_DRAWS,
) -> float:
    """Rejection rate at ``alternative`` of the calibrated test with n reports."""
    rng = np.random.default_rng(PLAN_SEED)
    n = max(1, round(n))
    if model is not None:
        draws = min(draws, COMPOSITE_PLAN_DRAWS)
    if model is None:
        if null is None:
            raise InvalidInputError("simulated power of goodness of fit needs the null p0")
        statistic = _statistic(mechanism, method, n, null)
        at_null = statistic(simulate_null(mechanism, n, null, rng, draws))
        at_alternative = statistic(simulate_null(mechanism, n, alternative, rng, draws))
    else:
        if fitted is None:
            raise InvalidInputError("simulated power of a composite test needs the fitted null")
        projected = method != "nonprojected"
        at_null = _fit(
            mechanism, model, simulate_null(mechanism, n, fitted, rng, draws), n, projected
        ).statistic
        at_alternative = _fit(
            mechanism, model, simulate_null(mechanism, n, alternative, rng, draws), n, projected
        ).statistic
    critical = np.quantile(np.nan_to_num(at_null, nan=np.inf), 1 - alpha, method="higher")
    return float(np.mean(at_alternative > critical))
