"""The help formatter's terminal width (client/cli/parsing.py): read as shutil reads it, without
importing shutil (docs/performance.md, "Device footprint")."""

from __future__ import annotations

import shutil

import pytest

from client.cli.parsing import DefaultsFormatter, _terminal_columns


@pytest.mark.parametrize("columns", ["123", "40", "0", "-5", "wide", "", None])
def test_the_width_is_shutils(monkeypatch, columns):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert _terminal_columns() == shutil.get_terminal_size().columns


def test_the_formatter_wraps_at_that_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    assert DefaultsFormatter("prog")._width == 58  # argparse's own: two columns of margin
