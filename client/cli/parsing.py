"""Argument parsing shared by both command lines (``ldp-client``, ``ldp-aggregator``): help that
shows every option's default, a command-line mistake reported in one line, and a quiet exit when
the reader of the output goes away."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn


class DefaultsFormatter(argparse.HelpFormatter):
    """--help shows every option's default (unless its text already says it, or it has none)."""

    def __init__(self, prog: str) -> None:
        # argparse makes a formatter for every option it adds, and its own asks shutil for the
        # terminal width; shutil imports bz2 and lzma, 0.4 MB of a device's one answer
        # (docs/performance.md, "Device footprint"). The same width, read as shutil reads it.
        super().__init__(prog, width=_terminal_columns() - 2)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)" if action.option_strings else text


def _terminal_columns() -> int:
    """COLUMNS if it is a positive integer, else the width of the terminal on stdout, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0 and sys.__stdout__ is not None:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


class OneLineParser(argparse.ArgumentParser):
    """A command-line mistake is one line on stderr (the usage is one --help away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def reader_went_away() -> int:
    """The exit status when stdout's reader closed the pipe (``... | head``): nothing more is
    printed, not even Python's own complaint at exit (stdout now points at /dev/null)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141  # 128 + SIGPIPE, what a shell reports for a command ended by a closed pipe
