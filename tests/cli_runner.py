"""The command-line tools run in the test's own process: ``run_cli("agg", "estimate", ...)``.

A subprocess (``python -m aggregator.cli ...``) spends 1.3-2.4 s importing the interpreter,
NumPy, SciPy and gRPC before it does anything; calling ``main(argv)`` here costs only the
command itself. What the user sees is kept as a subprocess would show it: the exit status
(``SystemExit`` from argparse included), stdout and stderr as text, log lines (``--log-level``)
and warnings on stderr, and an empty stdin. An exception that escapes ``main`` fails the test with
its traceback, as it would print one in a process.

Nothing leaks into the next run or test: the root logger's handlers and level, ``os.environ``
(``env``), the working directory (``cwd``) and the standard streams are restored afterwards.

Keep a real process where the test is about the process: the console script, signals, a closed
output pipe, gRPC's own C-core log lines (GRPC_VERBOSITY is read once per process), and a few
"one line on stderr, no traceback" checks end to end (tests/cli/test_cli.py).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

MODULES = {
    "agg": "aggregator.cli",
    "aggregator": "aggregator.cli",
    "aggregator.cli": "aggregator.cli",
    "client": "client.cli.main",
    "client.cli": "client.cli.main",
}
#: Warnings a fresh interpreter does not show (Python's default filters outside ``__main__``).
_HIDDEN_BY_DEFAULT = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def run_cli(
    tool: str,
    *args: str | os.PathLike,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess:
    """``main(args)`` of ``tool`` ("agg"/"aggregator.cli" or "client"/"client.cli") in this
    process; a CompletedProcess with its exit status, stdout and stderr. ``input`` is stdin's
    text, ``env`` extra environment variables, ``check`` asserts exit status 0."""
    module = MODULES[tool]
    argv = [os.fspath(arg) for arg in args]
    main = importlib.import_module(module).main
    stdout, stderr = io.StringIO(), io.StringIO()
    with (
        _isolated(env, cwd),
        _streams(stdout, stderr, input),
        _root_logging(),
        _warnings_to(stderr),
    ):
        try:
            status = main(argv)
        except SystemExit as exit_:  # argparse: --help, --version, usage errors
            status = _exit_status(exit_.code, stderr)
    done = subprocess.CompletedProcess(
        ["-m", module, *argv], 0 if status is None else status, stdout.getvalue(), stderr.getvalue()
    )
    if check:
        assert done.returncode == 0, (done.returncode, done.stderr)
    return done


def run_process(
    tool: str,
    *args: str | os.PathLike,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    check: bool = False,
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """The same as :func:`run_cli` in a real ``python -m MODULE`` process: for the tests that are
    about the process (gRPC's C-core log lines, signals, what a user's shell sees)."""
    command = [sys.executable, "-m", MODULES[tool], *(os.fspath(arg) for arg in args)]
    done = subprocess.run(
        command,
        input=input,
        env=None if env is None else {**os.environ, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check:
        assert done.returncode == 0, (done.returncode, done.stderr)
    return done


def _exit_status(code: object, stderr: io.StringIO) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=stderr)  # sys.exit("message"), as the interpreter prints it
    return 1


@contextlib.contextmanager
def _isolated(env: Mapping[str, str] | None, cwd: str | os.PathLike | None) -> Iterator[None]:
    saved_env = dict(os.environ)
    saved_cwd = Path.cwd()
    try:
        os.environ.update(env or {})
        # argparse wraps --help to the terminal; a subprocess with piped output has none (80)
        os.environ.setdefault("COLUMNS", "80")
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


@contextlib.contextmanager
def _streams(stdout: io.StringIO, stderr: io.StringIO, input: str | None) -> Iterator[None]:
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(input or ""), stdout, stderr
    try:
        yield
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved


@contextlib.contextmanager
def _root_logging() -> Iterator[None]:
    """The root logger as in a fresh process: no handlers, so ``logging.basicConfig`` in
    ``main`` writes to the captured stderr, and without it Python's last-resort handler prints
    warnings there. Records of threads that were running before (a test's server thread) stay
    out of the command's stderr. Afterwards pytest's handlers and the old level are back."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    saved_basic_config, saved_last_resort = logging.basicConfig, logging.lastResort
    this_run = _ThisRunOnly({t.ident for t in threading.enumerate()} - {threading.get_ident()})

    def basic_config(**kwargs) -> None:
        before = set(root.handlers)
        saved_basic_config(**kwargs)
        for handler in set(root.handlers) - before:
            handler.addFilter(this_run)

    for handler in saved_handlers:
        root.removeHandler(handler)
    logging.basicConfig = basic_config
    logging.lastResort = _StderrNow(this_run)
    try:
        yield
    finally:
        logging.basicConfig, logging.lastResort = saved_basic_config, saved_last_resort
        for handler in root.handlers[:]:
            root.removeHandler(handler)
            handler.close()
        for handler in saved_handlers:
            root.addHandler(handler)
        root.setLevel(saved_level)


class _ThisRunOnly(logging.Filter):
    """Passes the records of the command's own threads, not of threads that ran before it."""

    def __init__(self, foreign: set[int | None]) -> None:
        super().__init__()
        self.foreign = foreign

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread not in self.foreign


class _StderrNow(logging.StreamHandler):
    """Python's last-resort handler (warnings and worse on whatever sys.stderr is now), for
    this run's threads only."""

    def __init__(self, this_run: _ThisRunOnly) -> None:
        super().__init__()
        self.setLevel(logging.WARNING)
        self.addFilter(this_run)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


@contextlib.contextmanager
def _warnings_to(stderr: io.StringIO) -> Iterator[None]:
    """Warnings a user would see, written to stderr once each (Python's default filters)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            seen = set()
            for w in caught:
                key = (str(w.message), w.category, w.filename, w.lineno)
                if issubclass(w.category, _HIDDEN_BY_DEFAULT) or key in seen:
                    continue
                seen.add(key)
                stderr.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno))
