"""What a device costs: install size, import time, and peak memory and wall time of one answer.

Builds the device distribution of this tree (``ldp-survey-device``, client and protos only:
scripts/build_device_wheel.py), or of a git ref (``--ref main``), or the root distribution
``ldp-survey`` without extras (``--full``: what devices installed before the device distribution,
aggregator/ included), installs it into a fresh venv that has no pip of its own (so the size is
the device's packages and the interpreter's venv, nothing else), then measures with that venv's
interpreter, from a folder outside the source tree:

* install size: bytes on disk of the whole venv (allocated blocks, like ``du``), with what each
  top-level entry of site-packages takes; and, beside it, the size of the venv a device gets with
  a plain ``python -m venv`` (which adds pip and setuptools) and that venv's pip installing the
  same wheel;
* import time of ``client.device.reporter``: fresh interpreters, median of ``--runs``;
* one answer submitted end to end against a real aggregator on loopback (started from this
  interpreter's full environment, ``scripts/demo_survey.toml``, plaintext): a fresh device state
  enrols, answers the randomized-response question ``mood`` and flushes; peak RSS (the process's
  ``ru_maxrss``) and wall time from process start to exit, median of ``--runs``, once through the
  library (``Reporter``) and once through the command line (``ldp-client submit``);
* the modules the library's answer loaded that a device does not need (``HEAVY``: numpy among
  them, since one answer is randomized and encoded in pure Python).

Timings depend on the machine and its load: the table prints ``nproc``, the CPU model and the
load average beside them. docs/performance.md ("Device footprint") has the figures.

    python scripts/bench_device_footprint.py                      # this tree's device wheel
    python scripts/bench_device_footprint.py --ref main --full    # a committed ref, ldp-survey
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from build_device_wheel import build as build_device_wheel

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "scripts" / "demo_survey.toml"
SURVEY, QUESTION, ANSWER = "wellbeing-2026", "mood", "fine"
BUDGET_FLAGS = ["--budget", "12.7566", "--pointwise", "7"]  # ldp-aggregator cost, demo survey

IMPORT = (
    "import time\nt = time.perf_counter()\nimport client.device.reporter\n"
    "print(time.perf_counter() - t)\n"
)
#: One answer through the library, as an app embeds it.
LIBRARY = f"""
import sys
from client.device.ledger import Budget
from client.device.reporter import Reporter
from client.device.transport import Transport

server, state = sys.argv[1:3]
reporter = Reporter(Transport(server), state, Budget(12.7566, pointwise=7))
try:
    reporter.answer({SURVEY!r}, {QUESTION!r}, {ANSWER!r})
    result = reporter.flush()
finally:
    reporter.close()
assert (result.accepted, result.pending, result.error) == (1, 0, ""), result
print(" ".join(sys.modules))
"""
#: Modules one answer must not load: the device's install does not even have the first five, and
#: numpy, installed for the bulk paths (simulate, studies), is not needed to send an answer.
HEAVY = ("scipy", "tqdm", "grpc_health", "grpc_reflection", "aggregator", "numpy")


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs)


def exported(ref: str, src: Path) -> Path:
    """The files of git ref ``ref``, written into ``src``."""
    src.mkdir()
    archive = subprocess.run(["git", "archive", ref], cwd=REPO, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    return src


def tracked_copy(src: Path) -> Path:
    """The working tree's tracked (or not ignored) files, copied into ``src``."""
    files = run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO
    ).stdout.split("\0")
    for name in filter(None, files):
        path = REPO / name
        if path.is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes(path.read_bytes())
    return src


def build_wheel(ref: str | None, full: bool, work: Path) -> Path:
    """The device wheel of the working tree or of ``ref``; with ``full``, the root project's
    (built from a copy: the tree gets no build/ or egg-info)."""
    out = work / "wheel"
    if not full:
        return build_device_wheel(out, REPO if ref is None else exported(ref, work / "src"))
    src = tracked_copy(work / "src") if ref is None else exported(ref, work / "src")
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(src)])
    return next(out.glob("ldp_survey-*.whl"))


def make_device_venv(wheel: Path, venv: Path) -> Path:
    """A venv without pip holding the wheel and its core dependencies only; its python."""
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            str(wheel),
        ]
    )
    return python


def venv_with_pip_bytes(wheel: Path, venv: Path) -> int:
    """Bytes on disk of the venv a plain ``python -m venv`` gives (pip and setuptools included)
    once its own pip has installed ``wheel``."""
    run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)])
    return disk_bytes(venv)


def site_packages_mb(venv: Path) -> dict[str, float]:
    """MB on disk of each top-level entry of the venv's site-packages, largest first."""
    (site,) = venv.glob("lib/python*/site-packages")
    sizes = {
        entry.name: (disk_bytes(entry) if entry.is_dir() else os.lstat(entry).st_blocks * 512) / 1e6
        for entry in site.iterdir()
    }
    return dict(sorted(sizes.items(), key=lambda item: -item[1]))


def disk_bytes(folder: Path) -> int:
    """Bytes allocated on disk under ``folder`` (each hard-linked file once), as ``du``."""
    seen, total = set(), 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            info = os.lstat(os.path.join(root, name))
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
    return total


def measured(argv: list[str], cwd: Path) -> tuple[float, float, str]:
    """Wall time (s), peak RSS (MB) and standard output of one process, from spawn to exit."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    out, err = process.stdout.read(), process.stderr.read()  # type: ignore[union-attr]
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(
            f"{argv[:3]} failed ({process.returncode}): {err.decode()}{out.decode()}"
        )
    return wall, usage.ru_maxrss / 1024, out.decode()


class Aggregator:
    """A real aggregator on loopback, from this interpreter's (full) environment."""

    def __init__(self, work: Path) -> None:
        port_file = work / "port"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "aggregator.entry",
                "serve",
                "--config",
                str(CONFIG),
                "--db",
                str(work / "reports.sqlite"),
                "--port",
                "0",
                "--port-file",
                str(port_file),
                "--insecure",
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(600):
            if port_file.exists() and port_file.read_text().strip():
                break
            if self.process.poll() is not None:
                raise RuntimeError("the aggregator exited at start")
            time.sleep(0.1)
        else:
            raise RuntimeError("the aggregator did not start")
        self.target = f"127.0.0.1:{port_file.read_text().strip()}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "load": [round(x, 2) for x in os.getloadavg()],
    }


def bench(ref: str | None, full: bool, runs: int, keep: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ldp-footprint-") as tmp:
        work = Path(tmp)
        venv = keep or work / "device"
        python = venv / "bin" / "python"
        with_pip = None
        if not python.exists():
            wheel = build_wheel(ref, full, work)
            python = make_device_venv(wheel, venv)
            with_pip = venv_with_pip_bytes(wheel, work / "with-pip") / 1e6
        client_cli = venv / "bin" / "ldp-client"
        outside = work / "run"
        outside.mkdir()
        imports = [float(run([str(python), "-c", IMPORT], cwd=outside).stdout) for _ in range(runs)]
        server = Aggregator(work)
        try:
            library, cli = [], []
            for i in range(runs):
                library.append(
                    measured(
                        [
                            str(python),
                            "-c",
                            LIBRARY,
                            server.target,
                            str(outside / f"lib{i}.sqlite"),
                        ],
                        outside,
                    )
                )
                cli.append(
                    measured(
                        [
                            str(client_cli),
                            "submit",
                            "--server",
                            server.target,
                            "--insecure",
                            "--state",
                            str(outside / f"cli{i}.sqlite"),
                            *BUDGET_FLAGS,
                            "--survey",
                            SURVEY,
                            "--question",
                            QUESTION,
                            "--answer",
                            ANSWER,
                            "--json",
                        ],
                        outside,
                    )
                )
        finally:
            server.stop()
        loaded = {name.split(".")[0] for _, _, out in library for name in out.split()}
        return {
            "ref": ref or "working tree",
            "distribution": "ldp-survey" if full else "ldp-survey-device",
            "install_mb": disk_bytes(venv) / 1e6,
            "install_with_pip_mb": with_pip,
            "site_packages_mb": site_packages_mb(venv),
            "import_s": statistics.median(imports),
            "import_runs": imports,
            "library_wall_s": statistics.median(w for w, _, _ in library),
            "library_rss_mb": statistics.median(r for _, r, _ in library),
            "cli_wall_s": statistics.median(w for w, _, _ in cli),
            "cli_rss_mb": statistics.median(r for _, r, _ in cli),
            "heavy_modules_loaded": sorted(loaded & set(HEAVY)),
            "machine": machine(),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", help="git ref to measure (default: the working tree)")
    parser.add_argument(
        "--full",
        action="store_true",
        help="the root distribution ldp-survey without extras, not the device distribution",
    )
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per figure")
    parser.add_argument("--venv", type=Path, help="keep (or reuse) the device venv here")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args()
    result = bench(args.ref, args.full, args.runs, args.venv)
    if args.json:
        print(json.dumps(result))
        return 0
    m = result["machine"]
    print(
        f"device footprint of {result['distribution']}, {result['ref']} ({m['nproc']} cores, "
        f"{m['cpu']}, Python {m['python']}, load average {' '.join(map(str, m['load']))})"
    )
    print(f"  install (venv, no pip)           {result['install_mb']:7.1f} MB")
    if result["install_with_pip_mb"] is not None:
        print(f"  install (python -m venv, its pip) {result['install_with_pip_mb']:6.1f} MB")
    print(
        "    site-packages: "
        + ", ".join(
            f"{name} {mb:.2f}" for name, mb in result["site_packages_mb"].items() if mb >= 0.05
        )
        + " MB"
    )
    print(
        f"  import client.device.reporter    {result['import_s']:7.3f} s   (median of "
        f"{len(result['import_runs'])})"
    )
    print(
        f"  one answer, library: peak RSS    {result['library_rss_mb']:7.1f} MB, wall "
        f"{result['library_wall_s']:.3f} s"
    )
    print(
        f"  one answer, ldp-client: peak RSS {result['cli_rss_mb']:7.1f} MB, wall "
        f"{result['cli_wall_s']:.3f} s"
    )
    print(
        "  modules one answer loads without needing them: "
        f"{', '.join(result['heavy_modules_loaded']) or 'none'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
