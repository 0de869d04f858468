"""Plain-language sentences for test results: what a reader may and may not conclude."""

from __future__ import annotations

from aggregator.stats import TestResult


def format_p(pvalue: float) -> str:
    """A p-value as a reader should see it: never 0, never more digits than it has."""
    if pvalue < 1e-4:
        return "p < 0.0001"
    return f"p = {pvalue:.4f}" if pvalue < 0.01 else f"p = {pvalue:.3f}"


def p_text(pvalue: float) -> str:
    """A p-value in a table cell: :func:`format_p` without its "p =" (never 0)."""
    return format_p(pvalue).removeprefix("p = ").replace("p < ", "< ")


def result_p(result: TestResult) -> str:
    """The p-value of a result: a Monte Carlo p-value at its floor reads p <= 1/(m+1)."""
    if result.at_floor and result.n_draws is not None:  # at_floor: a Monte Carlo p-value
        return f"p <= 1/{result.n_draws + 1:,}"
    return format_p(result.pvalue)


def calibration_text(result: TestResult) -> str:
    """How the p-value was calibrated, in words."""
    if result.calibration == "monte-carlo":
        return f"Monte Carlo null, {result.n_draws:,} draws"
    return "chi-square limit"


def result_sentence(test: str, result: TestResult, attributes: list[str]) -> str:
    """One or two sentences stating the outcome of ``result`` with its basis (mechanism, n,
    method and level); ``attributes`` names the two attributes of an independence test or the
    two groups of a two-sample test."""
    basis = (
        f"({result_p(result)}; {result.method}, {result.mechanism}, n = {result.n:,}, "
        f"{calibration_text(result)})"
    )
    if result.inconclusive:
        return (
            f"No conclusion can be drawn: {result.reason}. The hypothesis is not rejected {basis}."
        )
    level = f"at the {result.alpha:g} level"
    if test == "two_sample":
        first, second = attributes
        if result.reject:
            return f"The data show that {first} and {second} answered differently {level} {basis}."
        return (
            f"The data are consistent with {first} and {second} answering alike {basis}; this "
            "does not show that they answer alike, only that these reports cannot tell them "
            "apart."
        )
    if test == "independence":
        first, second = attributes[0], attributes[1]
        if result.reject:
            return f"The data show that {first} and {second} are related {level} {basis}."
        return (
            f"The data are consistent with {first} and {second} being independent {basis}; "
            "this does not show that they are independent, only that these reports cannot "
            "tell them apart from it."
        )
    if result.reject:
        return f"The data are not consistent with the hypothesized distribution {level} {basis}."
    return (
        f"The data are consistent with the hypothesized distribution {basis}; this does not "
        "show that it is the true distribution, only that these reports cannot tell them apart."
    )
