"""Bugs the type checker found (issue 23): each test failed before its fix."""

from __future__ import annotations

from client import progress


def test_track_counts_an_iterator_without_a_length_on_a_terminal(monkeypatch, capsys):
    """``track`` over a generator (no ``len``, no ``total``) drew its bar with total None, and
    ``bar`` compared None >= 10_000: a TypeError on a terminal only."""
    monkeypatch.setattr(progress, "shown", lambda quiet=False, stream=None: True)
    assert list(progress.track((i for i in range(3)), "count", unit="items")) == [0, 1, 2]
    assert "count: " in capsys.readouterr().err  # the bar was drawn
