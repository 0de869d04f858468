"""Progress of long command-line work: a tqdm bar on a terminal, nothing anywhere else.

The bar is drawn on stderr, and only when stderr is a terminal and the caller did not ask for
machine-readable output (``--json``): a piped, redirected or scripted run prints exactly what it
printed before. tqdm comes with the ``aggregator`` extra, not with a device install: it is
imported only when a bar is actually shown, and where it is not installed there is no bar (the
work runs the same). Used by both command lines
(``ldp-client``, ``ldp-aggregator``) and by the scripts in ``scripts/``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sized
from typing import Protocol, TextIO, TypeVar

T = TypeVar("T")
#: "reports:  22%|██████      | 22.0k/100k reports [00:07<00:29, 2.60k reports/s]"
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt}{unit} [{elapsed}<{remaining}, {rate_noinv_fmt}]"


class Bar(Protocol):
    """What callers use of a bar: ``update``, ``refresh`` (draw now), ``write`` (a line of
    output on stdout that does not tear the bar) and ``close`` (also as a context manager)."""

    def update(self, n: float = 1) -> object: ...

    def refresh(self) -> None: ...

    def write(self, text: str) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Bar: ...

    def __exit__(self, *exc: object) -> object: ...


class _Silent:
    """The bar when none is shown."""

    def update(self, n: float = 1) -> None:
        pass

    def refresh(self) -> None:
        pass

    def write(self, text: str) -> None:
        print(text, flush=True)

    def close(self) -> None:
        pass

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def shown(quiet: bool = False, stream: TextIO | None = None) -> bool:
    """Whether a bar would be drawn: not ``quiet`` and ``stream`` (stderr) is a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return not quiet and stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def bar(total: float | None, desc: str, *, unit: str = "items", quiet: bool = False) -> Bar:
    """A bar counting to ``total`` ``unit`` (a plural: "reports"; None: a count without a
    total); advance it with ``update(n)`` and close it (or use it in a ``with`` block)."""
    if not shown(quiet):
        return _Silent()
    try:
        from tqdm import tqdm
    except ImportError:  # a device install (no aggregator extra): no bar, same work
        return _Silent()

    return tqdm(
        total=total,
        desc=desc,
        unit=f" {unit}",
        unit_scale=total is not None and total >= 10_000,  # 10.0k/100k reports, but 3/4 shards
        bar_format=BAR_FORMAT,
        file=sys.stderr,
        leave=False,
        dynamic_ncols=True,
        mininterval=0.2,
    )


def track(
    items: Iterable[T],
    desc: str,
    *,
    total: int | None = None,
    unit: str = "it",
    quiet: bool = False,
) -> Iterator[T]:
    """``items``, advancing a bar by one for each (``total`` defaults to ``len(items)``)."""
    if total is None and isinstance(items, Sized):
        total = len(items)
    with bar(total, desc, unit=unit, quiet=quiet) as progress:
        for item in items:
            yield item
            progress.update(1)
