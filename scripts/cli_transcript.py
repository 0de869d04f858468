"""A transcript of CLI outputs on fixed stores, so a refactor can be checked byte for byte.

    python scripts/cli_transcript.py make-stores DIR   # once: serve, simulate, stop (stores)
    python scripts/cli_transcript.py run DIR OUT       # per tree: every command's output
    diff before.txt after.txt                          # empty, or the refactor changed output

Reports are randomized with secure randomness, so the stores are built once and reused; ``run``
works on copies of them, runs both CLIs as ``python -m`` with PYTHONPATH = this file's checkout
(a copy of this file in another tree tests that tree), and masks what changes from run to run
(temporary paths, ports, timestamps, secrets, random ids).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The modules the two command lines run as (``python -m``).
AGGREGATOR_MODULE = "aggregator.cli"
CLIENT_MODULE = "client.cli"
AGG, CLI = "ldp-aggregator", "ldp-client"
PROGS = {AGG: AGGREGATOR_MODULE, CLI: CLIENT_MODULE}
#: A fixed environment: help text wraps at COLUMNS, times print in UTC; warnings are off (their
#: text names source files and lines, which a refactor moves).
ENV_FIXED = {
    "PYTHONPATH": str(REPO),
    "COLUMNS": "100",
    "LINES": "40",
    "TZ": "UTC",
    "LC_ALL": "C.UTF-8",
    "LANG": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONWARNINGS": "ignore",
}
ENV_DROPPED = ("GRPC_VERBOSITY", "GRPC_TRACE", "PROMETHEUS_MULTIPROC_DIR", "NO_COLOR", "TERM")
COMMAND_TIMEOUT = 300.0


DEMO_TRUTHS = {
    "mood": "0.4,0.3,0.2,0.1",
    "transport": "0.3,0.2,0.2,0.1,0.15,0.05",
    "sleep": "0.1,0.3,0.5,0.1",
    "stress": "0.25,0.4,0.25,0.1",
    "smoking_by_exercise": "0.18,0.3,0.32,0.12,0.05,0.03",
}

DESIGN_SURVEYS = """\
# A stratified cluster design with unequal weights (frame.csv), a post-stratified one and a raked
# one (scripts/cli_transcript.py).

[[survey]]
id = "field"
title = "Field study with a sampling design"
min_batch_size = 50
group_label = "region"
group_values = ["north", "south"]
design = { table = "frame.csv" }

[[survey.question]]
id = "rr"
text = "Which one?"
categories = ["a", "b", "c", "d"]
mechanism = "randomized_response"
epsilon = 2.0

[[survey.question]]
id = "noise"
categories = ["x", "y", "z"]
mechanism = "gaussian"
rho = 1.0

[[survey.question]]
id = "pair"
mechanism = "flip_components"
epsilon = 4.0
attributes = [
    { name = "smoker", categories = ["no", "yes"] },
    { name = "exercise", categories = ["never", "weekly", "daily"] },
]

[[survey]]
id = "field-post"
title = "Post-stratified to known counts"
min_batch_size = 50
design = { table = "frame_post.csv", population = { young = 52000, old = 48000 } }

[[survey.question]]
id = "rr"
categories = ["a", "b", "c"]
mechanism = "randomized_response"
epsilon = 2.0

[[survey]]
id = "field-raked"
title = "Raked to two margins"
min_batch_size = 50
design = { table = "frame_raked.csv", margins = MARGINS }

[[survey.question]]
id = "rr"
categories = ["a", "b", "c"]
mechanism = "randomized_response"
epsilon = 2.0
""".replace(
    "MARGINS", "{ age = { young = 6000, old = 4000 }, area = { town = 7000, country = 3000 } }"
)

GROUP_SURVEYS = """\
# Public groups (two-sample, k-sample, ordinal trend) and a second survey with the same question
# (two-sample across surveys) (scripts/cli_transcript.py).

[[survey]]
id = "clinics"
title = "Clinics"
min_batch_size = 100
group_label = "clinic"
group_values = ["north", "south", "east", "west"]

[[survey.question]]
id = "smoker"
text = "Do you smoke?"
categories = ["never", "former", "current"]
mechanism = "randomized_response"
epsilon = 2.0

[[survey.question]]
id = "mood"
categories = ["1", "2", "3", "4", "5"]
mechanism = "randomized_response"
epsilon = 2.0
scores = [0, 25, 50, 75, 100]

[[survey.question]]
id = "pain"
categories = ["none", "mild", "moderate", "severe"]
mechanism = "flip_components"
epsilon = 2.0
ordinal = true

[[survey.question]]
id = "sleep"
categories = ["<5", "5-6", "7-8", ">8"]
mechanism = "gaussian"
rho = 1.0

[[survey.analysis]]
title = "Does smoking differ between north and east?"
question = "smoker"
test = "two_sample"
groups = ["north", "east"]
sequential = true

[[survey.analysis]]
title = "Is mood uniform?"
question = "mood"
test = "goodness_of_fit"
p0 = [0.2, 0.2, 0.2, 0.2, 0.2]
sequential = true
max_n = 20000

[[survey]]
id = "followup"
title = "Follow-up wave"
min_batch_size = 100

[[survey.question]]
id = "smoker"
categories = ["never", "former", "current"]
mechanism = "randomized_response"
epsilon = 2.0
"""

SPLIT_SURVEYS = """\
# An exploration/confirmation split (docs/adaptive-analysis.md) (scripts/cli_transcript.py).

[[survey]]
id = "wellbeing-2026"
title = "Wellbeing field study"
min_batch_size = 500
exploration_fraction = 0.5

[[survey.question]]
id = "mood"
categories = ["great", "fine", "low", "bad"]
mechanism = "randomized_response"
epsilon = 1.0

[[survey.question]]
id = "smoking_by_exercise"
mechanism = "randomized_response"
epsilon = 2.0
attributes = [
    { name = "smoking", categories = ["no", "yes"] },
    { name = "exercise", categories = ["rarely", "weekly", "daily"] },
]
"""

SPLIT_PLAN = """\
survey = "wellbeing-2026"
alpha = 0.05
multiplicity = "holm"

[[test]]
title = "Mood is not uniform"
question = "mood"
test = "goodness_of_fit"
p0 = [0.25, 0.25, 0.25, 0.25]

[[test]]
title = "Smoking depends on exercise"
question = "smoking_by_exercise"
test = "independence"
"""

SPLIT_PLAN_OTHER = SPLIT_PLAN.replace('multiplicity = "holm"', 'multiplicity = "bonferroni"')

#: A fixed Ed25519 device key (its private key is 32 bytes of 7; only the public half is used).
DEVICE_KEY_SEED = bytes([7]) * 32


def design_frames() -> dict[str, str]:
    """The three sampling frames: 3 strata x 6 PSUs x 2 weight classes; the post-stratified
    one adds an age band per key, the raked one an age band and an area."""
    rows = [
        (f"k{h}{c}{w}", f"s{h}", f"p{h}{c}", 1.0 + h + 3.0 * w)
        for h in range(3)
        for c in range(6)
        for w in range(2)
    ]
    plain = ["key,stratum,psu,weight"] + [f"{k},{s},{p},{w:g}" for k, s, p, w in rows]
    post = ["key,stratum,psu,weight,post_stratum"] + [
        f"{k},{s},{p},{w:g},{'young' if int(k[2]) % 2 else 'old'}" for k, s, p, w in rows
    ]
    raked = ["key,stratum,psu,weight,age,area"]
    for k, s, p, w in rows:
        for age in ("young", "old"):
            area = "town" if int(k[2]) % 3 else "country"
            raked.append(f"{k}{age[0]},{s},{p},{w:g},{age},{area}")
    return {
        "frame.csv": "\n".join(plain) + "\n",
        "frame_post.csv": "\n".join(post) + "\n",
        "frame_raked.csv": "\n".join(raked) + "\n",
    }


# --------------------------------------------------------------------------------------------
# Running the command lines


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROPPED and not k.startswith("LDP")}
    env.update(ENV_FIXED)
    return env


def command(prog: str, args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", PROGS[prog], *args]


def start_server(folder: Path, output=subprocess.DEVNULL) -> tuple[subprocess.Popen, str, str]:
    """``serve`` of folder/survey.toml on folder/store.sqlite, on free ports: the process, the
    device address and the analyst address."""
    for name in ("port", "analyst-port"):
        (folder / name).unlink(missing_ok=True)
    argv = shlex.split(
        "serve --config survey.toml --db store.sqlite --port 0 --port-file port "
        "--analyst-port-file analyst-port --insecure"
    )
    server = subprocess.Popen(
        command(AGG, argv), cwd=folder, env=environment(), stdout=output, stderr=output
    )
    deadline = time.monotonic() + 60
    ports = [folder / "port", folder / "analyst-port"]
    while not all(p.exists() and p.read_text().strip() for p in ports):
        if server.poll() is not None or time.monotonic() > deadline:
            stop_server(server)
            raise RuntimeError(f"the aggregator in {folder} did not start")
        time.sleep(0.1)
    device, analyst = (f"127.0.0.1:{p.read_text().strip()}" for p in ports)
    return server, device, analyst


def stop_server(server: subprocess.Popen) -> None:
    """SIGTERM (a graceful stop that drains and closes the store), then wait."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=120)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
        raise RuntimeError("the aggregator did not stop on SIGTERM") from None


# --------------------------------------------------------------------------------------------
# make-stores

DEMO_SIMULATION = "--survey wellbeing-2026 --devices 20000 --seed 7 " + " ".join(
    f"--truth {q}={t}" for q, t in DEMO_TRUTHS.items()
)
GROUP_SIMULATION = (
    "--survey clinics --devices 2000 --group-share north=0.32,south=0.32,east=0.35,west=0.01 "
    "--truth smoker=0.6,0.25,0.15 --truth mood=0.1,0.2,0.3,0.25,0.15 "
    "--truth pain=0.4,0.3,0.2,0.1 --truth sleep=0.1,0.3,0.5,0.1 "
    "--truth-for east:smoker=0.4,0.3,0.3 --truth-for east:mood=0.05,0.15,0.3,0.3,0.2 "
    "--truth-for east:pain=0.25,0.3,0.25,0.2"
)
#: Reads over the Analyst service between uploads: each moves the release points that watch and
#: the report's "as of n" section read as looks (docs/monitoring.md).
GROUP_READS = [
    ("read", "watch --config survey.toml --survey clinics --once"),
    ("read", "report --config survey.toml --survey clinics --format md --out release.md"),
]
#: Per store: the files written into its folder, and the steps run against one server of its
#: survey.toml: ("simulate", ldp-client simulate arguments after --server and --insecure) or
#: ("read", an ldp-aggregator command sent to the server's Analyst service).
STORES: dict[str, tuple[Callable[[], dict[str, str]], list[tuple[str, str]]]] = {
    "demo": (
        lambda: {"survey.toml": (REPO / "scripts" / "demo_survey.toml").read_text()},
        [
            ("simulate", DEMO_SIMULATION),
            ("read", "report --survey wellbeing-2026 --format md --out release.md"),
        ],
    ),
    "design": (
        lambda: {"survey.toml": DESIGN_SURVEYS, **design_frames()},
        [
            (
                "simulate",
                "--survey field --devices 3000 --seed 7 --design-keys frame.csv "
                "--group-share north=0.6,south=0.4 --truth rr=0.4,0.3,0.2,0.1 "
                "--truth noise=0.5,0.3,0.2 --truth pair=0.3,0.2,0.1,0.1,0.2,0.1",
            ),
            (
                "simulate",
                "--survey field-post --devices 2000 --seed 7 --design-keys frame_post.csv "
                "--truth rr=0.5,0.3,0.2",
            ),
            (
                "simulate",
                "--survey field-raked --devices 2000 --seed 7 --design-keys frame_raked.csv "
                "--truth rr=0.5,0.3,0.2",
            ),
        ],
    ),
    "groups": (
        lambda: {"survey.toml": GROUP_SURVEYS},
        [
            *(
                step
                for seed in (7, 8, 9)
                for step in [("simulate", f"{GROUP_SIMULATION} --seed {seed}"), *GROUP_READS]
            ),
            ("simulate", "--survey followup --devices 2000 --seed 7 --truth smoker=0.55,0.3,0.15"),
        ],
    ),
    "split": (
        lambda: {
            "survey.toml": SPLIT_SURVEYS,
            "plan.toml": SPLIT_PLAN,
            "plan2.toml": SPLIT_PLAN_OTHER,
        },
        [
            (
                "simulate",
                "--survey wellbeing-2026 --devices 6000 --seed 7 "
                "--truth mood=0.35,0.3,0.2,0.15 "
                "--truth smoking_by_exercise=0.2,0.15,0.1,0.15,0.2,0.2",
            )
        ],
    ),
}


def build_store(folder: Path, files: dict[str, str], steps: list[tuple[str, str]]) -> str:
    """Write the survey files into ``folder``, serve them on a fresh store, run each step,
    stop the server; what the steps printed."""
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    log = []
    serve_log = (folder / "serve.log").open("ab")
    server, address, analyst = start_server(folder, serve_log)
    try:
        for kind, line in steps:
            if kind == "simulate":
                prog, argv = (
                    CLI,
                    ["simulate", "--server", address, "--insecure", *shlex.split(line)],
                )
            else:
                prog, argv = AGG, [*shlex.split(line), "--server", analyst]
            done = subprocess.run(
                command(prog, argv),
                cwd=folder,
                env=environment(),
                capture_output=True,
                text=True,
                check=False,
            )
            log.append(f"$ {prog} {shlex.join(argv)}\n[exit {done.returncode}]\n")
            log.append(done.stdout + done.stderr)
            print("".join(log[-2:]), end="", flush=True)
            if done.returncode not in (0, 3):  # 3: a read before a release (watch --once)
                raise RuntimeError(f"{prog} failed in {folder}")
    finally:
        stop_server(server)
        serve_log.close()
    for name in ("port", "analyst-port", "serve.log", "release.md"):
        (folder / name).unlink(missing_ok=True)
    return "".join(log)


def make_stores(root: Path) -> None:
    if root.exists() and any(root.iterdir()):
        sys.exit(f"{root} is not empty: the stores are built once, into a new folder")
    root.mkdir(parents=True, exist_ok=True)
    log = []
    for name, (files, steps) in STORES.items():
        log.append(f"## {name}\n" + build_store(root / name, files(), steps))
    (root / "make-stores.log").write_text("".join(log))
    print(f"stores written to {root}")


# --------------------------------------------------------------------------------------------
# run: the transcript


class Masker:
    """Replaces what differs between two runs of the same code: the run's folders, the checkout
    and the interpreter, then the patterns of MASKS."""

    def __init__(self, literals: dict[str, str]) -> None:
        pairs = {}
        for path, name in literals.items():
            pairs[path] = name
            pairs[os.path.realpath(path)] = name
        # Longest first: a folder inside another is replaced by its own name.
        self.literals = sorted(pairs.items(), key=lambda item: -len(item[0]))

    def __call__(self, text: str) -> str:
        for literal, name in self.literals:
            text = text.replace(literal, name)
        for pattern, replacement in MASKS:
            text = re.sub(pattern, replacement, text)
        return text


#: Patterns of what changes from run to run, and what replaces them (every command's output).
MASKS: list[tuple[str, str]] = [
    # ISO 8601 timestamps (report headers, registrations, seals, backups, listings).
    (r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(\+00:00|Z| UTC)?", "<TIME>"),
    (r"\bas of \d\d:\d\d:\d\d\b", "as of <TIME>"),
    # Ports of the loopback servers a run starts.
    (r"127\.0\.0\.1:\d+", "127.0.0.1:<PORT>"),
    # Times as seconds since the epoch in JSON (enrolled_at, stored_at, ...).
    (r'("\w+_at"): \d+\.\d+(e[+-]?\d+)?', r"\1: <TIME>"),
]
#: Masks of single commands: the ids matplotlib gives SVG clip paths and markers (a letter and
#: 10 hex digits of a hash salted at random), secret tokens, report ids.
SVG_IDS = [(r'(id="|#)([a-z])[0-9a-f]{10}\b', r"\1\2<ID>")]
TOKENS = [(r"[A-Za-z0-9_-]{32,}", "<TOKEN>")]
REPORT_IDS = [(r"\b[0-9a-f]{32}\b", "<REPORT-ID>")]
TEXT_SUFFIXES = {".md", ".html", ".json", ".jsonl", ".svg", ".csv", ".toml", ".txt", ".pem"}


class Transcript:
    """One scenario's part of the transcript: every command run in its folder ``work``."""

    def __init__(self, name: str, work: Path, mask: Masker) -> None:
        self.work = work
        self.mask = mask
        self.parts: list[str] = [f"######## {name}\n\n"]
        self.count = 0
        self.timings: list[tuple[float, str]] = []

    def write(self, name: str, text: str) -> None:
        (self.work / name).write_text(text)

    def note(self, text: str) -> None:
        self.parts.append(f"# {text}\n\n")

    def agg(self, line: str, **options) -> subprocess.CompletedProcess:
        return self.run(AGG, shlex.split(line), **options)

    def cli(self, line: str, **options) -> subprocess.CompletedProcess:
        return self.run(CLI, shlex.split(line), **options)

    def run(
        self,
        prog: str,
        argv: list[str],
        stdin: str = "",
        show: Sequence[str] = (),
        masks: Sequence[tuple[str, str]] = (),
    ) -> subprocess.CompletedProcess:
        """Run one command in the scenario's folder and add it to the transcript: argv, exit
        status, stdout, stderr, then each file or folder of ``show`` (relative to the folder),
        masked by MASKS and ``masks``."""
        self.count += 1
        started = time.monotonic()
        try:
            done = subprocess.run(
                command(prog, argv),
                cwd=self.work,
                env=environment(),
                input=stdin,
                capture_output=True,
                text=True,
                errors="backslashreplace",
                timeout=COMMAND_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            done = subprocess.CompletedProcess(argv, f"timeout after {COMMAND_TIMEOUT:g} s", "", "")
        out = [f"$ {prog} {shlex.join(argv)}\n"]
        self.timings.append((time.monotonic() - started, out[0].strip()))
        if stdin:
            out.append(f"[stdin]\n{_ended(stdin)}")
        out.append(f"[exit {done.returncode}]\n")
        out.append(f"[stdout]\n{_ended(done.stdout)}")
        out.append(f"[stderr]\n{_ended(done.stderr)}")
        out.extend(self._show(name) for name in show)
        text = self.mask("".join(out))
        for pattern, replacement in masks:
            text = re.sub(pattern, replacement, text)
        self.parts.append(text + "\n")
        return done

    def _show(self, name: str) -> str:
        """A file's text (a binary file's size and SHA-256), or every file of a folder."""
        path = self.work / name
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file())
            shown = [self._show(str(p.relative_to(self.work))) for p in files]
            return "".join(shown) or f"[folder {name}: empty]\n"
        if not path.is_file():
            return f"[file {name}: absent]\n"
        data = path.read_bytes()
        if path.suffix in TEXT_SUFFIXES:
            try:
                return f"[file {name}]\n{_ended(data.decode('utf-8'))}"
            except UnicodeDecodeError:
                pass
        return f"[file {name}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}]\n"

    def text(self) -> str:
        return "".join(self.parts)


def _ended(text: str) -> str:
    if not text or text.endswith("\n"):
        return text
    return text + "\n[no newline at end]\n"


def subcommands(help_text: str) -> list[str]:
    """The subcommands an argparse --help lists under its positional arguments."""
    names, inside = [], False
    for line in help_text.splitlines():
        if line == "positional arguments:":
            inside = True
        elif inside and not line.strip():
            break
        elif inside and (match := re.match(r"^    ([a-z][a-z0-9-]*)(\s{2,}\S.*)?$", line)):
            names.append(match.group(1))
    return names


# --------------------------------------------------------------------------------------------
# The scenarios: each runs in a folder of its own, a fresh copy of one store (or empty).

DEMO = "--config survey.toml --db store.sqlite --survey wellbeing-2026"
DESIGN = "--config survey.toml --db store.sqlite --survey field"
GROUPS = "--config survey.toml --db store.sqlite --survey clinics"
SPLIT = DEMO  # the split store's survey has the demo's id


def help_scenario(prog: str) -> Callable[[Transcript], None]:
    """--version, no command, --help and --help of every subcommand a --help lists."""

    def scenario(t: Transcript) -> None:
        t.run(prog, ["--version"])
        t.run(prog, [])
        queue: list[list[str]] = [[]]
        while queue:
            path = queue.pop(0)
            done = t.run(prog, [*path, "--help"])
            queue.extend([*path, name] for name in subcommands(done.stdout))
        t.run(prog, ["no-such-command"])

    return scenario


def demo_reads(t: Transcript) -> None:
    """Estimates, tests, summaries, watch and the survey file commands on the demo store."""
    for q in DEMO_TRUTHS:
        t.agg(f"estimate {DEMO} --question {q}")
        t.agg(f"estimate {DEMO} --question {q} --json")
    t.agg(f"estimate {DEMO} --question mood --simultaneous --confidence 0.9")
    t.agg(f"estimate {DEMO} --question transport --estimator unbiased")
    t.agg(f"estimate {DEMO} --question sleep --simultaneous --json")
    t.agg(f"test gof {DEMO} --question mood --p0 0.25,0.25,0.25,0.25")
    t.agg(f"test gof {DEMO} --question sleep --p0 0.1,0.3,0.5,0.1")
    t.agg(f"test gof {DEMO} --question stress --p0 0.25,0.25,0.25,0.25 --seed 1")
    t.agg(f"test gof {DEMO} --question stress --p0 uniform --seed 1 --json")
    t.agg(f"test gof {DEMO} --question transport --p0 uniform")
    t.agg(f"test gof {DEMO} --question transport --p0 uniform --method nonprojected --json")
    t.agg(f"test gof {DEMO} --question sleep --p0 uniform --method imhof")
    t.agg(
        f"test gof {DEMO} --question mood --p0 0.4,0.3,0.2,0.1 --calibration monte-carlo --seed 3"
    )
    t.agg(f"test gof {DEMO} --question mood --p0 uniform --method t2 --alpha 0.01")
    t.write("p0.txt", "great,0.4\nfine,0.3\nlow,0.2\nbad,0.1\n")
    t.agg(f"test gof {DEMO} --question mood --p0 @p0.txt --json")
    t.agg(f"test independence {DEMO} --question smoking_by_exercise")
    t.agg(f"test independence {DEMO} --question smoking_by_exercise --json")
    t.agg(f"test independence {DEMO} --question mood")
    t.agg(f"test homogeneity {DEMO} --question mood")
    t.agg(f"conditional {DEMO} --question smoking_by_exercise")
    t.agg(f"conditional {DEMO} --question smoking_by_exercise --given smoker --confidence 0.9")
    t.agg(f"conditional {DEMO} --question smoking_by_exercise --json")
    t.agg(f"conditional {DEMO} --question mood")
    t.agg(f"ordinal {DEMO} --question mood")
    t.agg(f"k-sample {DEMO} --question mood")
    store = "--config survey.toml --db store.sqlite"
    t.agg(f"two-sample {store} --a wellbeing-2026:mood --b wellbeing-2026:stress")
    t.agg(f"two-sample {store} --a wellbeing-2026:mood --b wellbeing-2026:mood")
    t.agg(f"watch {DEMO} --question mood --once")
    t.agg(f"watch {DEMO} --question mood --test goodness_of_fit --p0 uniform --once")
    t.agg(f"watch {DEMO} --question smoking_by_exercise --test independence --once")
    t.agg(f"watch {DEMO} --once")
    t.agg("cost --config survey.toml")
    t.agg("cost --config survey.toml --survey wellbeing-2026 --json")
    t.agg("cost --config survey.toml --delta 1e-9")
    t.agg("check-config survey.toml")
    t.agg("check-config survey.toml --db store.sqlite")
    t.agg("check-config survey.toml --db store.sqlite --json")
    t.agg("export-survey --config survey.toml --survey wellbeing-2026")
    t.agg(
        "export-survey --config survey.toml --survey wellbeing-2026 --out survey.json",
        show=["survey.json"],
    )
    t.agg(f"holdout gof {DEMO} --question mood --p0 uniform")
    t.agg(f"confirm {DEMO}")
    t.write("plan.toml", SPLIT_PLAN)
    t.agg(f"preregister {DEMO} --plan plan.toml")
    t.agg(f"estimate {DEMO} --question mood --side confirmation")
    t.agg(f"estimate {DEMO} --question mood --design")


def demo_reports(t: Transcript) -> None:
    """The survey report (Markdown, HTML) and the export to shards."""
    t.agg(f"report {DEMO} --format md --out report.md", show=["report.md"])
    t.agg(
        "report --config survey.toml --db store.sqlite --format md --confidence 0.9 --seed 3 "
        "--out report90.md",
        show=["report90.md"],
    )
    t.agg(f"report {DEMO} --out report.html", show=["report.html"], masks=SVG_IDS)
    export = "export --config survey.toml --db store.sqlite --survey wellbeing-2026 --out shards"
    t.agg(export, show=["shards"])
    t.agg(export)
    t.agg(f"{export} --force --shards 3", show=["shards"])


def demo_writes(t: Transcript) -> None:
    """Commands that write: export then import into a new store, rebuild, backup and restore."""
    store = "--config survey.toml --db store.sqlite"
    t.agg(f"export {store} --survey wellbeing-2026 --out shards --shards 2")
    t.agg("import --config survey.toml --db imported.sqlite --from shards")
    imported = "--config survey.toml --db imported.sqlite --survey wellbeing-2026"
    t.agg(f"estimate {imported} --question mood")
    t.agg("import --config survey.toml --db imported.sqlite --from shards")
    t.agg(f"rebuild {store} --json")
    t.agg(f"estimate {DEMO} --question transport")
    t.agg("backup --db store.sqlite --out backup --key backup.key")
    t.agg("restore --from backup --db restored.sqlite --key backup.key")
    t.agg(
        "estimate --config survey.toml --db restored.sqlite --survey wellbeing-2026 --question mood"
    )
    t.agg("restore --from backup --db restored.sqlite --key backup.key")
    t.agg("backup --db store.sqlite --out backup --key backup.key")
    t.agg("job --shards shards --config survey.toml --out job.json --seed 1", show=["job.json"])


def mistakes(t: Transcript) -> None:
    """User mistakes on the demo store: one line each, and the exit status."""
    store = "--config survey.toml --db store.sqlite"
    t.agg(f"estimate {DEMO} --question nope")
    t.agg(f"estimate {DEMO} --question nope --json")
    t.agg(f"estimate {store} --survey nope --question mood")
    t.agg(
        "estimate --config survey.toml --db missing.sqlite --survey wellbeing-2026 --question mood"
    )
    t.agg(
        "estimate --config missing.toml --db store.sqlite --survey wellbeing-2026 --question mood"
    )
    t.agg("estimate --db store.sqlite --survey wellbeing-2026 --question mood")
    t.agg("estimate --config survey.toml --survey wellbeing-2026 --question mood")
    t.agg(f"estimate {DEMO} --question mood --server 127.0.0.1:1")
    t.agg(f"estimate {DEMO} --question mood --confidence 1.5")
    t.agg(f"estimate {DEMO} --question mood --group x")
    t.agg(f"estimate {DEMO}")
    for p0 in ("0.5,0.5", "0.5,0.3,0.1,0.2", "0.3,0.3,0.3,0.3", "a,b,c,d", "-0.1,0.5,0.3,0.3"):
        t.agg(f"test gof {DEMO} --question mood --p0={p0}")
    t.agg(f"test gof {DEMO} --question mood --p0 @missing.txt")
    t.agg(f"test gof {DEMO} --question mood --p0 ''")
    t.agg(f"test gof {DEMO} --question mood --p0 0.5,0.5 --json")
    t.agg(f"test gof {DEMO} --question mood")
    t.agg(f"test gof {DEMO} --question mood --p0 uniform --method nope")
    t.agg(f"test gof {DEMO} --question mood --p0 uniform --alpha 2")
    t.agg(f"test nope {DEMO} --question mood")
    t.agg(f"test independence {DEMO} --question smoking_by_exercise --p0 uniform")
    t.write(
        "bad.toml",
        '[[survey]]\nid = "s"\n\n[[survey.question]]\nid = "q"\ncategories = ["a"]\n'
        'mechanism = "randomized_response"\nepsilon = 1.0\n',
    )
    t.agg("check-config bad.toml")
    t.agg("check-config bad.toml --json")
    t.write("broken.toml", "[[survey]\nid = \n")
    t.agg("check-config broken.toml")
    t.agg("check-config missing.toml")
    survey = (t.work / "survey.toml").read_text()
    t.write("changed.toml", survey.replace("epsilon = 1.0", "epsilon = 1.5", 1))
    t.agg("check-config changed.toml --db store.sqlite")
    t.agg(
        "estimate --config changed.toml --db store.sqlite --survey wellbeing-2026 --question mood"
    )
    t.agg("cost --config survey.toml --survey nope")
    t.agg("export-survey --config survey.toml --survey nope")
    t.agg(f"report {DEMO} --format pdf --out report.pdf")
    t.agg(f"report {store} --survey nope --out report.md")
    t.agg(f"watch {DEMO} --question mood --every 0 --once")
    t.agg(f"watch {DEMO} --question mood --test nope --once")
    t.agg(f"watch {DEMO} --question mood --test goodness_of_fit --once")
    t.agg("plan --k 4 --epsilon 1")
    t.agg("plan --k 4 --epsilon 1 --effect 0.1 --n 0")
    t.agg("plan --k 4 --epsilon -1 --effect 0.1 --n 100")
    t.agg("plan --p0 0.5,0.6 --epsilon 1 --effect 0.1 --n 100")
    t.agg("plan --k 4 --epsilon 1 --effect 0.1 --n 100 --simulate 5")
    t.agg("plan-groups --distributions 0.5,0.5 --epsilon 1 --n 100")
    t.agg("plan-groups --distributions 0.5,0.5 0.4,0.3,0.3 --epsilon 1 --n 100")
    t.agg("--log-level loud cost --config survey.toml")


def plans(t: Transcript) -> None:
    """Study planning: power, sample sizes, ranked mechanisms, sequential, groups, designs."""
    t.agg("plan --k 5 --epsilon 1 --effect 0.1 --power 0.8")
    t.agg(
        "plan --mechanism flip_components --epsilon 2 --p0 0.4,0.3,0.2,0.1 "
        "--alternative 0.35,0.3,0.2,0.15 --n 3000"
    )
    t.agg("plan --shape 2,3 --epsilon 2 --effect 0.1 --n 4000 --json")
    t.agg(
        "plan --shape 2,3 --epsilon 2 --effect 0.1 --n 4000 --plot power.svg",
        show=["power.svg"],
        masks=SVG_IDS,
    )
    t.agg(
        "plan --mechanism public_coin_bit --groups 10 --epsilon 1 --k 16 --effect 0.2 --power 0.8"
    )
    t.agg("plan --mechanism gaussian --rho 0.5 --k 4 --effect 0.1 --n 5000")
    t.agg(
        "plan --mechanism optimized_unary --epsilon 1 --k 4 --alternative 0.3,0.3,0.2,0.2 "
        "--power 0.8 --sequential"
    )
    t.agg(
        "plan --mechanism randomized_response --epsilon 1 --k 4 --alternative 0.3,0.3,0.2,0.2 "
        "--power 0.8 --sequential --simulate 20 --look-every 200 --json"
    )
    t.agg(
        "plan --mechanism randomized_response --epsilon 1 --k 4 --effect 0.1 --power 0.8 "
        "--clustering-effect 2 --weighting-effect 1.3 --design-df 30"
    )
    t.agg("plan --k 4 --epsilon 2 --effect 0.1 --n 2000 --deff 1.5 --alpha 0.01")
    t.agg("plan-groups --distributions 0.4,0.3,0.2,0.1 0.3,0.3,0.25,0.15 --epsilon 1 --power 0.8")
    t.agg(
        "plan-groups --distributions 0.4,0.3,0.2,0.1 0.3,0.3,0.25,0.15 0.4,0.3,0.2,0.1 "
        "--mechanism randomized_response --epsilon 1 --n 1000 --allocation 1,1,2 --json"
    )
    t.agg(
        "plan-groups --distributions 0.5,0.5 0.6,0.4 --mechanism flip_components --epsilon 2 "
        "--power 0.9 --deff 1.4"
    )


def designs(t: Transcript) -> None:
    """Design-based estimates and tests; post-stratified and raked estimates."""
    for q in ("rr", "noise", "pair"):
        t.agg(f"estimate {DESIGN} --question {q} --design")
    t.agg(f"estimate {DESIGN} --question rr")
    t.agg(f"estimate {DESIGN} --question rr --design --json")
    t.agg(f"estimate {DESIGN} --question rr --design --variance jackknife")
    t.agg(f"estimate {DESIGN} --question rr --design --variance bootstrap --replicates 50 --seed 1")
    t.agg(f"estimate {DESIGN} --question noise --design --group south")
    t.agg(f"test gof {DESIGN} --question rr --design --p0 uniform")
    for correction in ("second-order", "first-order", "wald"):
        t.agg(
            f"test gof {DESIGN} --question rr --design --p0 0.4,0.3,0.2,0.1 "
            f"--correction {correction}"
        )
    t.agg(f"test gof {DESIGN} --question noise --design --p0 uniform --json")
    t.agg(f"test independence {DESIGN} --question pair --design")
    t.agg(f"test independence {DESIGN} --question pair --design --json")
    t.agg(f"test homogeneity {DESIGN} --question rr --design")
    t.agg(f"test homogeneity {DESIGN} --question rr")
    t.agg(f"test gof {DESIGN} --question rr --p0 uniform")
    for survey in ("field-post", "field-raked"):
        base = f"--config survey.toml --db store.sqlite --survey {survey}"
        t.agg(f"estimate {base} --question rr --design")
        t.agg(f"estimate {base} --question rr --design --json")
        t.agg(f"test gof {base} --question rr --design --p0 uniform")
    t.agg(f"k-sample {DESIGN} --question rr")
    t.agg(f"two-sample {DESIGN} --question rr --groups north south")
    t.agg(f"watch {DESIGN} --question rr --once")
    t.agg(f"report {DESIGN} --format md --out field.md", show=["field.md"])
    t.agg(
        "report --config survey.toml --db store.sqlite --survey field-raked --format md "
        "--out raked.md",
        show=["raked.md"],
    )
    t.agg("check-config survey.toml")
    t.agg("check-config survey.toml --db store.sqlite --json")
    t.agg("cost --config survey.toml")
    t.agg("export-survey --config survey.toml --survey field")
    t.agg(
        "export --config survey.toml --db store.sqlite --survey field --out shards --shards 2",
        show=["shards"],
    )
    survey = (t.work / "survey.toml").read_text()
    t.write("frame_missing.toml", survey.replace('table = "frame.csv"', 'table = "nope.csv"'))
    t.agg("check-config frame_missing.toml")


def groups(t: Transcript) -> None:
    """Two-sample, k-sample, per-group estimates and ordinal summaries on the group store."""
    t.agg(f"two-sample {GROUPS} --question smoker --groups north east")
    t.agg(f"two-sample {GROUPS} --question smoker --groups north south --json")
    t.agg(f"two-sample {GROUPS} --question pain --groups north east --seed 5")
    t.agg(
        f"two-sample {GROUPS} --question sleep --groups south east --seed 5 "
        "--calibration monte-carlo"
    )
    t.agg(f"two-sample {GROUPS} --question smoker --groups north west")
    t.agg(f"two-sample {GROUPS} --question smoker --groups north mars")
    store = "--config survey.toml --db store.sqlite"
    t.agg(f"two-sample {store} --a clinics:smoker --b followup:smoker")
    t.agg(f"two-sample {store} --a clinics:smoker --b followup:smoker --alpha 0.01 --json")
    t.agg(f"two-sample {store} --a clinics:smoker --b clinics:pain")
    t.agg(f"k-sample {GROUPS} --question smoker --groups north south east")
    t.agg(f"k-sample {GROUPS} --question smoker --groups north south east --json")
    t.agg(f"k-sample {GROUPS} --question mood --groups north south east")
    t.agg(f"k-sample {GROUPS} --question pain --groups north south east --seed 3")
    t.agg(f"k-sample {GROUPS} --question smoker")
    t.agg(f"k-sample {GROUPS} --question smoker --groups north")
    t.agg(f"k-sample {GROUPS} --question smoker --groups north north")
    t.agg(f"k-sample {store} --survey followup --question smoker")
    for group in ("north", "south", "east", "west"):
        t.agg(f"estimate {GROUPS} --question smoker --group {group}")
    t.agg(f"estimate {GROUPS} --question smoker")
    t.agg(f"estimate {GROUPS} --question pain --group east --json")
    t.agg(f"estimate {GROUPS} --question smoker --group mars")
    t.agg(f"test gof {GROUPS} --question smoker --group east --p0 0.6,0.25,0.15")
    t.agg(f"ordinal {GROUPS} --question mood")
    t.agg(f"ordinal {GROUPS} --question mood --groups north south east")
    t.agg(f"ordinal {GROUPS} --question pain --groups north east --json")
    t.agg(f"ordinal {GROUPS} --question pain --group east")
    t.agg(f"ordinal {GROUPS} --question smoker")
    t.agg(f"conditional {GROUPS} --question smoker")
    t.agg(f"watch {GROUPS} --once")
    t.agg(f"watch {GROUPS} --question mood --test mean_score --once")
    t.agg(f"watch {GROUPS} --question smoker --test two_sample --groups north east --once")
    t.agg(f"watch {GROUPS} --question smoker --group east --max-n 1000 --once")
    t.agg(f"report {GROUPS} --format md --out clinics.md", show=["clinics.md"])
    t.agg(f"report {GROUPS} --format md --group east --out east.md", show=["east.md"])
    t.agg(f"report {GROUPS} --out clinics.html", show=["clinics.html"], masks=SVG_IDS)
    t.agg(f"report {store} --format md --out nosurvey.md")
    t.agg("check-config survey.toml --db store.sqlite")
    t.agg("cost --config survey.toml --json")


def split_confirm(t: Transcript) -> None:
    """A split survey: explore, preregister, confirm, then read the sealed side."""
    t.agg(f"estimate {SPLIT} --question mood")
    t.agg(f"test independence {SPLIT} --question smoking_by_exercise")
    t.agg(f"estimate {SPLIT} --question mood --side confirmation")
    t.agg(f"report {SPLIT} --format md --out explore.md", show=["explore.md"])
    t.agg(f"confirm {SPLIT}")
    t.agg(f"preregister {SPLIT} --plan missing.toml")
    t.agg(f"preregister {SPLIT} --plan plan.toml")
    t.agg(f"preregister {SPLIT} --plan plan.toml")
    t.agg(f"estimate {SPLIT} --question mood --side confirmation")
    t.agg(f"confirm {SPLIT}")
    t.agg(f"confirm {SPLIT}")
    t.agg(f"confirm {SPLIT} --json")
    t.agg(f"preregister {SPLIT} --plan plan2.toml")
    t.agg(f"estimate {SPLIT} --question mood --side confirmation")
    t.agg(f"estimate {SPLIT} --question mood --side confirmation --json")
    t.agg(f"test gof {SPLIT} --question mood --side confirmation --p0 uniform")
    t.agg(
        f"report {SPLIT} --side confirmation --format md --out confirmation.md",
        show=["confirmation.md"],
    )
    t.agg(f"holdout gof {SPLIT} --question mood --p0 uniform")
    export = "export --config survey.toml --db store.sqlite --survey wellbeing-2026"
    t.agg(f"{export} --side confirmation --out confirmation")
    t.agg(f"{export} --out exploration", show=["exploration/manifest.json"])
    t.agg("check-config survey.toml --db store.sqlite")


def split_holdout(t: Transcript) -> None:
    """A split survey whose confirmation side is a reusable holdout."""
    t.agg(
        f"holdout gof {SPLIT} --question mood --p0 0.25,0.25,0.25,0.25 --max-queries 10 "
        "--max-rejections 2"
    )
    t.agg(f"holdout gof {SPLIT} --question mood --p0 0.35,0.3,0.2,0.15")
    t.agg(f"holdout independence {SPLIT} --question smoking_by_exercise")
    t.agg(f"holdout gof {SPLIT} --question mood --p0 0.3,0.3,0.2,0.2")
    t.agg(f"preregister {SPLIT} --plan plan.toml")
    t.agg(f"holdout independence {SPLIT} --question mood")


def remote(t: Transcript) -> None:
    """The analysis commands over a running server's Analyst service (the demo store)."""
    try:
        server, _, address = start_server(t.work)
    except RuntimeError as exc:
        t.note(f"skipped: {exc}")
        return
    try:
        at = f"--server {address} --survey wellbeing-2026"
        t.agg(f"estimate {at} --question mood")
        t.agg(f"estimate {at} --config survey.toml --question transport --json")
        t.agg(f"test gof {at} --question mood --p0 uniform")
        t.agg(f"test gof {at} --question stress --p0 uniform --seed 1")
        t.agg(f"test independence {at} --question smoking_by_exercise --json")
        t.agg(f"conditional {at} --question smoking_by_exercise")
        t.agg(f"watch {at} --question mood --once")
        t.agg(f"report {at} --format md --out remote.md", show=["remote.md"])
        t.agg(f"estimate --server {address} --survey nope --question mood")
        t.agg(f"estimate {at} --question nope")
        t.agg(f"estimate {at} --question mood --db store.sqlite")
        t.agg(f"estimate {at} --question mood --token-file missing-token")
    finally:
        stop_server(server)


def device(t: Transcript) -> None:
    """ldp-client on device state files: install a survey, households, offline answers."""
    t.agg("export-survey --config survey.toml --survey wellbeing-2026 --out survey.json")
    t.cli("budget --state device.sqlite")
    t.cli("surveys --state device.sqlite")
    t.cli("install-survey survey.json --state device.sqlite")
    t.cli("install-survey survey.json --state device.sqlite --json")
    t.cli("surveys --state device.sqlite")
    t.cli("surveys --state device.sqlite --json")
    t.cli("install-survey missing.json --state device.sqlite")
    t.cli("selftest")
    t.cli("selftest --json")
    t.cli("selftest --vectors missing.json")
    t.cli(
        "household create --state home.sqlite --cap 3 --rho-cap 0.5 --devices 2 --code-out code.txt"
    )
    t.cli("budget --state home.sqlite")
    t.cli("household join --state member.sqlite --code-file code.txt --json")
    t.cli("budget --state member.sqlite --json")
    t.cli("household join --state other.sqlite", stdin="not a code\n")
    t.cli("household create --state home.sqlite --cap 3 --code-out code.txt")
    answer = "--survey wellbeing-2026 --question mood --answer fine --no-flush"
    t.cli(f"submit --server 127.0.0.1:1 --state device.sqlite {answer} --budget 5")
    offline = "--server 127.0.0.1:1 --insecure --state device.sqlite"
    t.cli(f"submit {offline} {answer} --budget 5", masks=REPORT_IDS)
    t.cli("budget --state device.sqlite")
    t.cli("budget --state device.sqlite --json")
    t.cli(f"submit {offline} {answer}")
    t.cli(
        f"submit {offline} --survey wellbeing-2026 --question smoking_by_exercise "
        "--answer 'yes|daily' --json",
        masks=REPORT_IDS,
    )
    t.cli(f"submit {offline} --survey wellbeing-2026 --question transport --index 9")
    t.cli("budget --state device.sqlite")
    t.cli(f"flush {offline}")
    t.cli(f"flush {offline} --json")
    t.cli(f"submit --server 127.0.0.1:1 --insecure --state missing.sqlite {answer}")
    t.cli(f"submit --server nope --insecure --state device.sqlite {answer}")
    t.cli("simulate --server 127.0.0.1:1 --insecure --survey wellbeing-2026 --devices 0")
    t.cli("simulate --server 127.0.0.1:99999 --insecure --survey wellbeing-2026 --devices 10")
    t.cli("simulate --server 127.0.0.1:1 --insecure --survey wellbeing-2026 --devices 10")
    t.cli("--version")


def registries(t: Transcript) -> None:
    """The device registry (enroll, devices, revoke) with a fixed key, and analyst tokens."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.from_private_bytes(DEVICE_KEY_SEED).public_key()
    pem = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    t.write("device.pem", pem.decode())
    t.write("bad.pem", "not a key\n")
    registry = "--devices registry.sqlite"
    t.agg(f"devices {registry}")
    t.agg(f"enroll {registry} --public-key device.pem")
    t.agg(f"enroll {registry} --public-key device.pem")
    t.agg(f"enroll {registry} --public-key bad.pem")
    t.agg(f"enroll {registry} --public-key device.pem --device-id wrong")
    listed = t.agg(f"devices {registry} --json")
    t.agg(f"devices {registry}")
    ids = re.findall(r'"device_id": "([^"]+)"', listed.stdout) or ["?"]
    t.agg(f"revoke {registry} --device-id {ids[0]}")
    t.agg(f"revoke {registry} --device-id nope")
    t.agg(f"devices {registry}")
    t.agg(f"enroll {registry} --public-key device.pem")
    t.agg("analyst-token list --tokens tokens")
    t.agg("analyst-token add alice --tokens tokens", masks=TOKENS)
    t.agg("analyst-token add alice --tokens tokens", masks=TOKENS)
    t.agg("analyst-token add bob --tokens tokens", masks=TOKENS)
    t.agg("analyst-token list --tokens tokens")
    t.agg("analyst-token list --tokens tokens --json")
    t.agg("analyst-token revoke alice --tokens tokens")
    t.agg("analyst-token revoke alice --tokens tokens")
    t.agg("analyst-token list --tokens tokens")


#: (title, the store its folder copies, "config" for the demo survey file alone, or None for an
#: empty folder, the scenario). Long ones first: they run two at a time.
SCENARIOS: list[tuple[str, str | None, Callable[[Transcript], None]]] = [
    ("demo store: user mistakes", "demo", mistakes),
    ("group store", "groups", groups),
    ("design store", "design", designs),
    ("demo store: writes (import, rebuild, backup, restore, Beam job)", "demo", demo_writes),
    ("split store: preregister and confirm", "split", split_confirm),
    ("demo store: reads", "demo", demo_reads),
    ("planning", None, plans),
    ("demo store: over the Analyst service", "demo", remote),
    ("device commands", "config", device),
    ("device registry and analyst tokens", None, registries),
    ("demo store: reports and export", "demo", demo_reports),
    ("split store: reusable holdout", "split", split_holdout),
    ("help: ldp-aggregator", None, help_scenario(AGG)),
    ("help: ldp-client", None, help_scenario(CLI)),
]


#: Where the packages the CLIs run load from (this checkout, or the run is refused).
ORIGIN = "import aggregator, client; print(aggregator.__file__, client.__file__)"


def run_all(stores: Path, out: Path, workers: int, show_timings: int = 0) -> None:
    stores = stores.resolve()
    if not all((stores / name / "store.sqlite").exists() for name in STORES):
        sys.exit(f"{stores} does not hold the stores: build them with make-stores first")
    origin = subprocess.run(
        [sys.executable, "-c", ORIGIN],
        env=environment(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not all(Path(path).resolve().is_relative_to(REPO) for path in origin):
        sys.exit(f"the packages load from {origin}, not from {REPO}: check PYTHONPATH and the venv")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cli-transcript-") as tmp:
        root = Path(tmp)
        literals = {tmp: "<TMP>", str(stores): "<STORES>", str(REPO): "<REPO>"}
        mask = Masker({**literals, sys.executable: "<PYTHON>"})

        def one(index: int) -> tuple[str, int]:
            title, store, scenario = SCENARIOS[index]
            work = root / f"{index:02d}"
            if store is None or store == "config":
                work.mkdir()
                if store == "config":
                    shutil.copy(stores / "demo" / "survey.toml", work)
            else:
                shutil.copytree(stores / store, work)
            transcript = Transcript(f"{title} (in <TMP>/{index:02d})", work, mask)
            started = time.monotonic()
            scenario(transcript)
            timings.extend(transcript.timings)
            timings.append((time.monotonic() - started, f"scenario: {title}"))
            return transcript.text(), transcript.count

        timings: list[tuple[float, str]] = []
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(one, range(len(SCENARIOS))))
    if show_timings:
        for seconds, what in sorted(timings, reverse=True)[:show_timings]:
            print(f"{seconds:6.1f} s  {mask(what)[:150]}", file=sys.stderr)
    total = sum(count for _, count in results)
    header = f"# CLI transcript (scripts/cli_transcript.py): {total} commands\n\n"
    out.write_text(header + "".join(text for text, _ in results))
    print(f"{total} commands in {time.monotonic() - started:.0f} s: {out}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("make-stores", help="build the fixed stores once, into a new folder")
    make.add_argument("dir", type=Path)
    run = sub.add_parser("run", help="write the transcript of the commands on copies of DIR")
    run.add_argument("dir", type=Path)
    run.add_argument("out", type=Path)
    run.add_argument("--workers", type=int, default=2, help="scenarios run at once")
    run.add_argument(
        "--timings", type=int, default=0, metavar="N", help="print the N slowest commands"
    )
    args = parser.parse_args(argv)
    if args.command == "make-stores":
        make_stores(args.dir)
    else:
        run_all(args.dir, args.out, args.workers, args.timings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
