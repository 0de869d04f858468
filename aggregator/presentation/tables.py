"""Tables built from plain columns: an HTML table (notebooks, the report) and a pandas frame.

Callers pass strings and lists, never result objects, so this module depends on nothing of
ours and anything that prints a table can use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

FRAME_HINT = "to_frame needs pandas: pip install 'ldp-survey[frame]'"


def pandas_module() -> Any:
    """pandas, or an ImportError that names the extra which installs it."""
    try:
        import pandas
    except ImportError:
        raise ImportError(FRAME_HINT) from None
    return pandas


def data_frame(
    columns: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]],
    index: Sequence[str] | None = None,
    index_name: str | None = None,
    attrs: Mapping[str, Any] | None = None,
) -> Any:
    """A pandas DataFrame from columns (or a list of rows), with a named index and attributes."""
    frame = pandas_module().DataFrame(columns, index=index)
    if index_name is not None:
        frame.index.name = index_name
    if attrs:
        frame.attrs.update(attrs)
    return frame


def html_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """An HTML table; every header and cell is escaped here (cells are plain text)."""
    head = "".join(f"<th>{escape(name)}</th>" for name in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
