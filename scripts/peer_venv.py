"""Benchmarks against peer libraries run in a virtual environment of their own: the peers are
not dependencies of ldp-survey. Standard library only (it runs before anything is installed)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def ensure_venv(script: str, venv: Path, needed: Sequence[str], install: Sequence[str]) -> None:
    """Return if every module of ``needed`` imports here; otherwise create ``venv``, pip install
    ``install`` into it when a module is missing there, and re-execute the calling script inside
    it (once: a second miss is an error naming the modules)."""
    if all(importlib.util.find_spec(name) for name in needed):
        return
    mark = f"LDP_{script.upper()}_REEXEC"
    if os.environ.get(mark):
        missing = [name for name in needed if not importlib.util.find_spec(name)]
        sys.exit(f"{script}: still missing {', '.join(missing)} in {sys.prefix}")
    python = venv / "bin" / "python"
    try:
        if not python.exists():
            print(f"{script}: creating {venv}", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        probe = f"import importlib.util as u; exit(not all(map(u.find_spec, {tuple(needed)!r})))"
        if subprocess.run([str(python), "-c", probe]).returncode != 0:
            print(f"{script}: installing {' '.join(install)}", file=sys.stderr)
            pip = [str(python), "-m", "pip", "install", "--quiet"]
            subprocess.run([*pip, *install], check=True)
    except subprocess.CalledProcessError as exc:
        sys.exit(f"{script}: could not prepare {venv}: {exc}")
    os.environ[mark] = "1"
    os.execv(str(python), [str(python), os.path.abspath(sys.argv[0]), *sys.argv[1:]])
