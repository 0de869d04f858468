"""Monte Carlo decision rule ([Rogers2017] Alg. 8 and 16; local-chi-square-tests spec §2.3)."""

from __future__ import annotations

import math

import numpy as np

from aggregator.errors import InvalidInputError


def minimum_draws(alpha: float) -> int:
    """Smallest m for which the Monte Carlo test can reject at level alpha: ceil(1/alpha) - 1."""
    return math.ceil(1 / alpha - 1e-12) - 1


def check_draws(n_draws: int, alpha: float) -> int:
    """Validate the number of Monte Carlo draws for level alpha."""
    if isinstance(n_draws, bool) or not isinstance(n_draws, int) or n_draws < 1:
        raise InvalidInputError(f"n_draws must be a positive integer, got {n_draws!r}")
    if n_draws < minimum_draws(alpha):
        raise InvalidInputError(
            f"n_draws={n_draws} cannot reach level alpha={alpha}: need at least "
            f"{minimum_draws(alpha)}"
        )
    return n_draws


def monte_carlo_pvalue(observed: float, null_draws: np.ndarray) -> float:
    """``(1 + #{r_i >= observed}) / (m + 1)``; rejecting when it is <= alpha is exact.

    A replicate whose statistic is NaN counts as exceeding the observed one (conservative).
    """
    null_draws = np.asarray(null_draws, dtype=float)
    null_draws = np.where(np.isnan(null_draws), np.inf, null_draws)  # a failed replicate counts
    return float((1 + np.count_nonzero(null_draws >= observed)) / (null_draws.size + 1))
