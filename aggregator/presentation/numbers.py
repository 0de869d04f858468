"""Number formatting shared by everything that prints estimates (CLI tables, reports, notebook
tables): fixed digits, and never a "-0.0000"."""

from __future__ import annotations


def fixed(value: float, digits: int = 4) -> str:
    """A number with fixed digits; a value that rounds to zero prints without a minus sign."""
    text = f"{value:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def share(value: float, digits: int = 4) -> str:
    """A frequency with fixed digits (never "-0.0000")."""
    return fixed(value, digits)


def interval(low: float, high: float) -> str:
    return f"[{share(low)}, {share(high)}]"


def out_of_range(value: float) -> bool:
    """An unbiased estimate outside [0, 1]: legitimate, but a reader must be told."""
    return value < 0 or value > 1


def reports(n: int) -> str:
    """n with its noun: "1 report", "2,000 reports"."""
    return f"{n:,} report" + ("" if n == 1 else "s")
