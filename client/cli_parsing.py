"""Argument parsing shared by both command lines (``ldp-client``, ``ldp-aggregator``): help that
shows every option's default, and a command-line mistake reported in one line."""

from __future__ import annotations

import argparse


class DefaultsFormatter(argparse.HelpFormatter):
    """--help shows every option's default (unless its text already says it, or it has none)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)" if action.option_strings else text


class OneLineParser(argparse.ArgumentParser):
    """A command-line mistake is one line on stderr (the usage is one --help away)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
