"""Packaging by role (docs/architecture.md), the root project: ``pip install ldp-survey`` without
extras is a device too (numpy, grpcio, protobuf, cryptography; the device distribution takes these
same strings, tests/project/test_packaging_device.py); the ``aggregator`` extra adds what only the
aggregator needs, and ``ldp-aggregator`` without it says so in one line. A real device wheel
installed into a fresh venv is checked by scripts/check_device_install.sh (CI); these are the fast
in-process checks."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from aggregator import entry

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[^A-Za-z0-9_.\-]", r, maxsplit=1)[0].lower() for r in requirements}


def test_a_device_install_pulls_only_the_four_device_dependencies():
    assert names(PROJECT["dependencies"]) == {"numpy", "grpcio", "protobuf", "cryptography"}


def test_the_aggregator_extra_adds_the_rest():
    extra = names(PROJECT["optional-dependencies"]["aggregator"])
    assert {"scipy", "grpcio-health-checking", "grpcio-reflection", "tqdm"} <= extra
    # every distribution the entry point checks for is in the extra it names
    assert set(entry.EXTRA_MODULES.values()) <= extra


def test_the_console_scripts():
    assert PROJECT["scripts"] == {
        "ldp-client": "client.cli.main:main",
        "ldp-aggregator": "aggregator.entry:main",
    }


def test_ldp_aggregator_without_the_extra_names_it_in_one_line():
    """scipy hidden (None in sys.modules makes it unimportable): one line on stderr naming the
    extra, exit status 2, no traceback, and the aggregator's modules never imported."""
    code = (
        "import sys\n"
        "sys.modules['scipy'] = None\n"
        "from aggregator.entry import main\n"
        "status = main(['--help'])\n"
        "assert 'aggregator.cli' not in sys.modules\n"
        "sys.exit(status)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "scipy" in lines[0] and "pip install 'ldp-survey[aggregator]'" in lines[0]


def test_ldp_aggregator_with_the_extra_runs_the_cli(capsys):
    assert entry.missing_modules() == []
    status: object
    try:
        status = entry.main(["--version"])
    except SystemExit as exc:  # argparse's version action exits 0
        status = exc.code
    assert status == 0
    assert "ldp-aggregator" in capsys.readouterr().out
