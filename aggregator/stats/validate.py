"""Input checks shared by the estimators and tests; each raises a typed error."""

from __future__ import annotations

import math
import numbers

import numpy as np

from aggregator.errors import InsufficientDataError, InvalidInputError
from aggregator.histogram import Histogram

#: Why per-category analyses refuse public-coin one-bit reports (docs/mechanisms.md).
PUBLIC_COIN_REFUSAL = (
    "public_coin_bit reports identify only the masses p(S_l) of the L public subsets, not the "
    "{k} category frequencies, so there is no unbiased per-category {analysis} from them; test a "
    "hypothesised distribution with goodness_of_fit (T3), or collect with hadamard_response or "
    "optimized_unary to estimate frequencies"
)


def check_histogram(hist: object, minimum_n: int = 1) -> Histogram:
    if not isinstance(hist, Histogram):
        raise InvalidInputError(f"expected an aggregator.histogram.Histogram, got {type(hist)}")
    if hist.n < minimum_n:
        raise InsufficientDataError(f"need at least {minimum_n} report(s), got n = {hist.n}")
    bound = hist.mechanism.report_bound
    if bound is not None:  # additive noise: no report decodes beyond scale + noise_bound
        limit = hist.n * bound
        if np.abs(hist.values).max() > limit:
            raise InvalidInputError(
                f"hist: values beyond +-{limit:.6g}, more than {hist.n} reports can sum to"
            )
    return hist


def check_per_category(hist: Histogram, analysis: str) -> Histogram:
    """InvalidInputError for an analysis that needs per-category information the public-coin
    statistic does not carry (estimates, composite nulls, independence)."""
    if hist.mechanism.statistic_kind == "groups":
        raise InvalidInputError(PUBLIC_COIN_REFUSAL.format(k=hist.k, analysis=analysis))
    return hist


def check_alpha(alpha: object) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise InvalidInputError(f"alpha must be a number in (0, 1), got {alpha!r}")
    try:  # numbers.Real declares no ordering with float: compare the float that is returned
        level = float(alpha)
    except OverflowError:  # an integer beyond the float range
        level = math.inf
    if not 1e-300 <= level < 1:
        raise InvalidInputError(f"alpha must be in (0, 1) (and >= 1e-300), got {alpha!r}")
    return level


def check_distribution(p: object, k: int, name: str = "p0") -> np.ndarray:
    """A probability vector of length k: finite, non-negative, summing to 1 (to 1e-8)."""
    try:
        arr = np.array(p, dtype=float)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{name} must be a vector of probabilities") from exc
    if arr.ndim != 1:
        raise InvalidInputError(
            f"{name} must be a flat list of {k} probabilities, one per category"
        )
    if arr.size != k:
        raise InvalidInputError(
            f"{name} must give one probability for each of the {k} categories, got {arr.size}"
        )
    if not np.isfinite(arr).all() or (arr < 0).any() or (arr > 1).any():
        raise InvalidInputError(f"{name} must be finite and in [0, 1]")
    total = arr.sum()
    if not math.isclose(total, 1.0, rel_tol=0, abs_tol=1e-8):
        raise InvalidInputError(f"{name} must sum to 1, sums to {total:.10g}")
    return arr / total


def check_method(method: str | None, allowed: tuple[str, ...], mechanism_name: str) -> str:
    """Resolve ``method`` (None means the first, recommended one)."""
    if method is None:
        return allowed[0]
    if method not in allowed:
        raise InvalidInputError(
            f"method {method!r} is not available for {mechanism_name}; choose from {allowed}"
        )
    return method


def check_finite_statistic(statistic: float, name: str = "hist") -> float:
    """A statistic that overflowed (values near the float range) is the input's fault."""
    if not np.isfinite(statistic):
        raise InvalidInputError(
            f"{name}: the test statistic is not finite; the values are too large to test"
        )
    return statistic


def check_count(n: object, name: str = "n") -> float:
    """A planned number of reports: a finite real number >= 1."""
    if isinstance(n, bool) or not isinstance(n, numbers.Real) or not math.isfinite(n) or n < 1:
        raise InvalidInputError(f"{name} must be a finite number of reports >= 1, got {n!r}")
    return float(n)


def make_rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is not None and (
        isinstance(rng, bool) or not isinstance(rng, numbers.Integral) or rng < 0
    ):
        raise InvalidInputError(f"rng must be a numpy Generator, a seed >= 0 or None, got {rng!r}")
    return np.random.default_rng(rng)
