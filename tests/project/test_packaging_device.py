"""The device distribution, ``ldp-survey-device`` (scripts/build_device_wheel.py;
docs/architecture.md, "Packaging by role"): one real wheel, built once per session from this
tree, holds ``client`` and ``protos`` and nothing of the aggregator, requires exactly the root
project's four dependencies and installs ``ldp-client`` only. Installing it into a fresh venv and
answering a real aggregator is scripts/check_device_install.sh (CI)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build_device_wheel.py"
ROOT = tomllib.loads((REPO / "pyproject.toml").read_text())
_spec = importlib.util.spec_from_file_location("build_device_wheel", SCRIPT)
assert _spec is not None and _spec.loader is not None
builder = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(builder)

DIST_INFO = f"ldp_survey_device-{ROOT['project']['version']}.dist-info"


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    return builder.build(tmp_path_factory.mktemp("device-wheel"))


@pytest.fixture(scope="session")
def files(wheel) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def dist_info(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(f"{DIST_INFO}/{name}").decode()


def test_the_wheel_is_named_for_the_device_and_the_root_version(wheel):
    assert wheel.name == f"ldp_survey_device-{ROOT['project']['version']}-py3-none-any.whl"
    assert wheel.is_file()


def test_the_wheel_holds_client_and_protos_and_nothing_of_the_aggregator(files):
    assert {name.split("/")[0] for name in files} == {"client", "protos", DIST_INFO}
    assert not [name for name in files if "aggregator" in name.split("/")[0]]


def test_every_file_of_client_and_protos_is_in_the_wheel(files):
    """Package discovery found every subpackage, and the package data (the conformance vectors
    ldp-client selftest replays, the proto, the stubs' types) came along."""
    tracked = subprocess.run(
        ["git", "ls-files", "client", "protos"], cwd=REPO, capture_output=True, text=True
    ).stdout.split()
    assert set(files) - {name for name in files if name.startswith(DIST_INFO)} == set(tracked)
    assert "protos/ldp/v1/testvectors.json" in files


def test_the_metadata_requires_exactly_the_four_device_dependencies(wheel):
    metadata = Parser().parsestr(dist_info(wheel, "METADATA"))
    assert metadata["Name"] == "ldp-survey-device"
    assert metadata["Version"] == ROOT["project"]["version"]
    assert metadata["Requires-Python"] == ROOT["project"]["requires-python"]
    required = metadata.get_all("Requires-Dist") or []
    names = {r.split(">")[0].split("<")[0].split("=")[0].strip().lower() for r in required}
    assert names == {"numpy", "grpcio", "protobuf", "cryptography"}
    assert len(required) == len(ROOT["project"]["dependencies"])
    assert metadata.get_all("Provides-Extra") is None


def test_the_only_console_script_is_ldp_client(wheel):
    assert dist_info(wheel, "entry_points.txt").split() == [
        "[console_scripts]",
        "ldp-client",
        "=",
        "client.cli.main:main",
    ]


def test_the_unpacked_wheel_replays_the_vectors_from_its_own_files(wheel, tmp_path):
    """ldp-client selftest run from the wheel's files (first on the path, from a folder outside
    the tree): the vectors it replays are the ones the wheel ships."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path / "site")
    code = (
        "import sys, client, protos\n"
        "from client.cli.main import main\n"
        "assert client.__file__.startswith(sys.argv[1]), client.__file__\n"
        "assert protos.__file__.startswith(sys.argv[1]), protos.__file__\n"
        "sys.exit(main(['selftest']))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "site")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr + done.stdout


def test_the_device_project_is_derived_from_the_root_one():
    """Same version, license, Python and dependency strings; no extras, no ldp-aggregator."""
    device = tomllib.loads(builder.device_pyproject(ROOT))
    project = device["project"]
    for key in ("version", "license", "requires-python", "dependencies"):
        assert project[key] == ROOT["project"][key]
    assert project["scripts"] == {"ldp-client": "client.cli.main:main"}
    assert "optional-dependencies" not in project
    assert device["tool"]["setuptools"]["packages"]["find"]["include"] == ["client*", "protos*"]
    assert device["tool"]["setuptools"]["package-data"] == {
        "protos.ldp.v1": ["testvectors.json", "ldp.proto"]
    }


def test_a_failed_build_is_one_line_and_exit_1(tmp_path):
    """A source tree without a pyproject.toml: one line on stderr, exit status 1."""
    (tmp_path / "client").mkdir()
    (tmp_path / "protos").mkdir()
    (tmp_path / "LICENSE").write_text("license\n")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "out"), "--source", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("build_device_wheel: error:")
