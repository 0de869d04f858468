"""Estimates with their intervals, and the "as of n" confidence sequences and e-values, drawn as
inline SVG (matplotlib, the ``[plot]`` extra).

Figures are built on a bare ``Figure`` (no pyplot state, no display needed) and written as SVG
whose text is drawn as paths, so the page needs no fonts or network to show them.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence

import numpy as np

PLOT_EXTRA_HINT = "plots need matplotlib: pip install 'ldp-survey[plot]'"


def plots_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def interval_plot(
    labels: Sequence[str],
    frequencies: np.ndarray,
    ci_low: np.ndarray,
    ci_high: np.ndarray,
    title: str,
    projected: np.ndarray | None = None,
) -> str:
    """One row per category: the unbiased estimate with its interval (and, when given, the
    projected estimate as a hollow marker); returns an ``<svg>`` element."""
    from matplotlib.figure import Figure

    k = len(labels)
    height = min(1.2 + 0.28 * k, 30.0)
    fig = Figure(figsize=(6.4, height))
    ax = fig.add_subplot()
    rows = np.arange(k)[::-1]
    # Intervals need not be centred on the estimate (exact intervals mapped through the
    # channel), so they are drawn as segments, not as symmetric error bars.
    ax.hlines(rows, ci_low, ci_high, color="#6b8fb3", linewidth=1.6, label="interval")
    ax.plot(frequencies, rows, "o", color="#1f4e79", markersize=4, label="estimate")
    if projected is not None:
        ax.plot(projected, rows, "D", mfc="none", color="#b35900", markersize=5, label="projected")
    ax.axvline(0.0, color="#999999", linewidth=0.8)
    ax.set_yticks(rows, labels=list(labels), fontsize=8 if k <= 40 else 5)
    ax.set_xlabel("share of respondents")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})  # no date: reproducible output
    return _bare_svg(buffer.getvalue(), title)


def _bare_svg(document: str, title: str) -> str:
    """The ``<svg>`` element alone (no XML prolog or DOCTYPE), labelled for screen readers."""
    start = document.index("<svg")
    svg = document[start:]
    label = title.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
    return re.sub(r"^<svg", f'<svg role="img" aria-label="{label}"', svg, count=1)


def sequence_plot(
    look_ns: Sequence[int],
    labels: Sequence[str],
    estimate: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    log_evalues: Sequence[float],
    alpha: float,
    title: str,
    what: str = "frequency",
) -> str:
    """The "as of n" figure: each category's confidence sequence (a band) and running estimate
    over n, and beside it, when there is a test, the e-value over n (log scale) with the 1/alpha
    line the stopping rule watches; returns an ``<svg>`` element."""
    from matplotlib.figure import Figure

    panels = 2 if log_evalues else 1
    fig = Figure(figsize=(6.4 if panels == 1 else 10.0, 3.4))
    ax = fig.add_subplot(1, panels, 1)
    ns = np.asarray(look_ns, dtype=float)
    colours = [f"C{j % 10}" for j in range(len(labels))]
    for j, label in enumerate(labels):
        ax.fill_between(ns, low[:, j], high[:, j], color=colours[j], alpha=0.12, step="post")
        ax.step(ns, estimate[:, j], where="post", color=colours[j], linewidth=1.2, label=label)
    ax.set_xlabel("n (reports; one step per release)")
    ax.set_ylabel(what)
    ax.set_title("confidence sequences", fontsize=9)
    ax.grid(color="#dddddd", linewidth=0.6)
    if len(labels) <= 12:
        ax.legend(fontsize=7, loc="best")
    if log_evalues:
        right = fig.add_subplot(1, 2, 2)
        shown = np.exp(np.minimum(np.asarray(log_evalues), 700.0))
        right.step(ns[: len(shown)], shown, where="post", color="#1f4e79", label="e-value")
        right.axhline(1 / alpha, color="#8a1c1c", linestyle="--", label=f"1/α = {1 / alpha:g}")
        right.set_yscale("log")
        right.set_xlabel("n (reports)")
        right.set_title("e-value (stop when it passes 1/α)", fontsize=9)
        right.grid(color="#dddddd", linewidth=0.6)
        right.legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    return _bare_svg(buffer.getvalue(), title)
