"""Family-wise error control for a family of tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aggregator.errors import InvalidInputError
from aggregator.stats.validate import check_alpha


@dataclass(frozen=True)
class HolmResult:
    """Holm step-down adjusted p-values and decisions, in the input order."""

    adjusted: np.ndarray
    reject: np.ndarray
    alpha: float


def holm(pvalues: np.ndarray, alpha: float = 0.05) -> HolmResult:
    """Holm ([Holm1979]): controls the family-wise error rate at alpha under any dependence.

    Parameters
    ----------
    pvalues : array_like of float, shape (m,)
        The p-values of the family, each in [0, 1]; any order.
    alpha : float, default 0.05
        Family-wise error rate, in (0, 1).

    Returns
    -------
    HolmResult
        ``adjusted`` (the step-down adjusted p-values, capped at 1) and ``reject``
        (``adjusted <= alpha``), both in the input order, and ``alpha``.

    Raises
    ------
    InvalidInputError
        An empty or non-numeric ``pvalues``, a p-value outside [0, 1], or ``alpha`` outside (0, 1).

    References
    ----------
    [Holm1979]; privacy-accounting spec §C.2 (the preregistered confirmatory family).

    Examples
    --------
    >>> from aggregator.stats import holm
    >>> result = holm([0.01, 0.04, 0.03, 0.2])
    >>> result.adjusted.round(3).tolist()
    [0.04, 0.09, 0.09, 0.2]
    >>> result.reject.tolist()
    [True, False, False, False]
    """
    alpha = check_alpha(alpha)
    try:
        p = np.asarray(pvalues, dtype=float)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"pvalues must be a vector of numbers: {exc}") from None
    if p.ndim != 1 or p.size == 0:
        raise InvalidInputError("pvalues must be a non-empty vector")
    if not np.isfinite(p).all() or (p < 0).any() or (p > 1).any():
        raise InvalidInputError("p-values must lie in [0, 1]")
    m = p.size
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(stepped, 1.0)
    return HolmResult(adjusted=adjusted, reject=adjusted <= alpha, alpha=alpha)
