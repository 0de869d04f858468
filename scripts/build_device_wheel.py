"""Build the device distribution, ``ldp-survey-device``: the ``client`` and ``protos`` packages.

A device runs ``client`` and ``protos``; the root project ``ldp-survey`` also ships ``aggregator/``
(docs/architecture.md, "Packaging by role"). This script copies those two packages of a source
tree into a scratch folder, writes a ``pyproject.toml`` there derived from the tree's own (same
version, license, Python and the same four dependencies; ``ldp-client`` only) and builds the wheel
from it, so the device's metadata cannot drift from the root project's and the tree gets no
``build/`` or egg-info.

    python scripts/build_device_wheel.py dist/   # dist/ldp_survey_device-<version>-py3-none-any.whl
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAME = "ldp-survey-device"
#: What a device installs of the tree, and the one console script it gets.
PACKAGES = ("client", "protos")
SCRIPT = "ldp-client"
DESCRIPTION = (
    "The device side of ldp-survey: on-device randomizers, the privacy ledger, the durable "
    "outbox and ldp-client (no aggregator)."
)


def toml_value(value: object) -> str:
    """A string or a list of strings as TOML (JSON's escapes are valid TOML basic strings)."""
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"no TOML form for {value!r}")


def device_pyproject(root: dict) -> str:
    """The device project's ``pyproject.toml``, from the root project's parsed one."""
    project = root["project"]
    scripts = {SCRIPT: project["scripts"][SCRIPT]}
    data = {
        name: files
        for name, files in root["tool"]["setuptools"].get("package-data", {}).items()
        if name.split(".")[0] in PACKAGES
    }
    lines = [
        "[build-system]",
        f"requires = {toml_value(root['build-system']['requires'])}",
        f"build-backend = {toml_value(root['build-system']['build-backend'])}",
        "",
        "[project]",
        f"name = {toml_value(NAME)}",
        f"version = {toml_value(project['version'])}",
        f"description = {toml_value(DESCRIPTION)}",
        f"requires-python = {toml_value(project['requires-python'])}",
        f"license = {toml_value(project['license'])}",
        f"dependencies = {toml_value(project['dependencies'])}",
        "",
        "[project.scripts]",
        *(f"{toml_value(name)} = {toml_value(target)}" for name, target in scripts.items()),
        "",
        "[tool.setuptools.packages.find]",
        f"include = {toml_value([f'{package}*' for package in PACKAGES])}",
        "",
        "[tool.setuptools.package-data]",
        *(f"{toml_value(name)} = {toml_value(files)}" for name, files in data.items()),
    ]
    return "\n".join(lines) + "\n"


def source_files(source: Path) -> list[str]:
    """The files of ``source`` that belong to the device: git's view of a work tree (tracked or
    not ignored, so no caches or scratch files), every file otherwise (an exported ref)."""
    if (source / ".git").exists():
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", *PACKAGES],
            cwd=source,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split("\0")
    else:
        listed = [
            str(path.relative_to(source))
            for package in PACKAGES
            for path in (source / package).rglob("*")
            if path.is_file() and "__pycache__" not in path.parts
        ]
    files = sorted(name for name in listed if name and (source / name).is_file())
    return [*files, "LICENSE"]


def stage(source: Path, folder: Path) -> Path:
    """The device project of ``source``, ready to build, in ``folder``."""
    for name in source_files(source):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, folder / name)
    root = tomllib.loads((source / "pyproject.toml").read_text())
    (folder / "pyproject.toml").write_text(device_pyproject(root))
    return folder


def build(out: Path, source: Path = REPO, python: str = sys.executable) -> Path:
    """Build the device wheel of ``source`` into ``out`` with ``python``'s pip; its path."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ldp-device-build-") as tmp:
        staged = stage(source, Path(tmp))
        done = subprocess.run(
            [python, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(staged)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            said = (done.stderr + done.stdout).strip().splitlines() or ["no output"]
            raise RuntimeError(f"pip wheel failed: {said[-1]}")
    version = tomllib.loads((source / "pyproject.toml").read_text())["project"]["version"]
    return out / f"{NAME.replace('-', '_')}-{version}-py3-none-any.whl"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write the wheel into")
    parser.add_argument("--source", type=Path, default=REPO, help="source tree (default: this one)")
    args = parser.parse_args(argv)
    try:
        print(build(args.out, args.source.resolve()))
    except (RuntimeError, OSError, subprocess.CalledProcessError, KeyError) as error:
        print(f"build_device_wheel: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
