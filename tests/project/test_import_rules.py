"""The import rules of docs/architecture.md, enforced.

Two checks: a static one reads every module's imports (top-level and lazy ones inside functions)
and holds them against the package rules; a dynamic one runs the device's workload in a fresh
interpreter and lists the heavy modules it actually loaded (the client must stay light).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("client", "aggregator", "protos")

#: Every part of the aggregator above its core types (histogram, errors) and presentation.
ABOVE_THE_CORE = (
    "aggregator.survey_file",
    "aggregator.service",
    "aggregator.store",
    "aggregator.stats",
    "aggregator.analysis",
    "aggregator.planning",
    "aggregator.jobs",
    "aggregator.cli",
    "aggregator.report",
    "aggregator.confirm",
    "aggregator.remote",
)
#: The engines of the report store, each beside the other under ``aggregator.store``.
ENGINES = ("aggregator.store.sqlite", "aggregator.store.postgres")
#: The three rooms of the service; what they share sits in ``aggregator.service`` itself.
ROOMS = ("aggregator.service.server", "aggregator.service.collector", "aggregator.service.analyst")


class Rule(NamedTuple):
    """Modules under ``subjects`` (but not under ``exempt``) never import under ``forbidden``."""

    subjects: tuple[str, ...]
    forbidden: tuple[str, ...]
    why: str
    exempt: tuple[str, ...] = ()


RULES: list[Rule] = [
    Rule(
        ("client",),
        (
            "aggregator",
            "scipy",
            "apache_beam",
            "matplotlib",
            "pandas",
            "grpc_health",
            "grpc_reflection",
        ),
        "the device side installs little (no aggregator extra) and never depends on the aggregator",
    ),
    Rule(
        ("client.mechanisms",),
        ("client.device", "client.cli", "client.simulate", "client.survey", "grpc", "protos"),
        "randomizers are pure numpy: no runtime, no wire",
    ),
    Rule(
        ("client.device",),
        ("client.cli", "client.simulate"),
        "a device's runtime needs neither its command line nor the population simulator",
    ),
    Rule(("protos",), ("client", "aggregator"), "the wire contract depends on nothing of ours"),
    Rule(
        ("aggregator.service",),
        ("aggregator.jobs", "aggregator.cli", "aggregator.remote", "apache_beam"),
        "the service never needs Beam, the command line or the client of another server",
    ),
    Rule(
        ("aggregator.service",),
        ROOMS,
        "what the rooms share sits below them and knows none of them",
        exempt=ROOMS,
    ),
    Rule(
        ("aggregator.service.collector",),
        ("aggregator.service.analyst", "aggregator.service.server"),
        "the devices' room knows neither the analysts' room nor the server that composes both",
    ),
    Rule(
        ("aggregator.service.collector",),
        ("aggregator.stats", "aggregator.analysis", "aggregator.confirm"),
        "nothing on the upload path analyses",
    ),
    Rule(
        ("aggregator.service.analyst",),
        ("aggregator.service.collector", "aggregator.service.server"),
        "the analysts' room knows neither the devices' room nor the server that composes both",
    ),
    Rule(
        ("aggregator.store",),
        (
            "aggregator.service",
            "aggregator.stats",
            "aggregator.analysis",
            "aggregator.planning",
            "aggregator.report",
            "aggregator.confirm",
            "aggregator.remote",
            "aggregator.jobs",
            "aggregator.cli",
            "grpc",
        ),
        "the store knows reports and statistics' inputs, not who serves or analyses them, nor "
        "over which transport (validation gives reasons; the service maps them to status codes)",
    ),
    Rule(
        ("aggregator.store",),
        (*ENGINES, "sqlite3", "psycopg"),
        "the store's contract, model, errors and rules hold for every engine",
        exempt=ENGINES,
    ),
    Rule(
        ("aggregator.store.sqlite",),
        ("aggregator.store.postgres", "psycopg"),
        "one engine never imports the other",
    ),
    Rule(
        ("aggregator.store.postgres",),
        ("aggregator.store.sqlite", "sqlite3"),
        "one engine never imports the other",
    ),
    Rule(
        ("aggregator.stats",),
        (
            "aggregator.service",
            "aggregator.store",
            "aggregator.analysis",
            "aggregator.planning",
            "aggregator.report",
            "aggregator.confirm",
            "aggregator.remote",
            "aggregator.jobs",
            "aggregator.cli",
            "aggregator.survey_file",
            "grpc",
        ),
        "statistics read histograms only",
    ),
    Rule(
        ("aggregator.histogram", "aggregator.errors"),
        ABOVE_THE_CORE,
        "the core types sit below every other part of the aggregator",
    ),
    Rule(
        ("aggregator.presentation",),
        ("client", "numpy", "scipy", *ABOVE_THE_CORE),
        "formatting takes plain values, so every part can print through it",
    ),
    Rule(
        ("aggregator.survey_file",),
        tuple(name for name in ABOVE_THE_CORE if name != "aggregator.survey_file"),
        "the survey file layer sits below every part that reads a survey file",
    ),
    Rule(
        ("aggregator.analysis",),
        (
            "aggregator.service",
            "aggregator.remote",
            "aggregator.jobs",
            "aggregator.cli",
            "grpc",
            "protos",
        ),
        "reading and analysing a survey is the same for the command line, the service and the "
        "report: a local read builds no wire message",
    ),
    Rule(
        ("aggregator.jobs",),
        ("aggregator.service", "aggregator.remote", "aggregator.cli", "grpc"),
        "jobs run without a server (and so without gRPC)",
    ),
    Rule(
        ("aggregator.report",),
        (
            "aggregator.service",
            "aggregator.store",
            "aggregator.remote",
            "aggregator.jobs",
            "aggregator.cli",
            "grpc",
        ),
        "a report renders what its caller read",
    ),
    Rule(
        ("aggregator.confirm",),
        ("aggregator.service", "aggregator.store", "aggregator.jobs", "aggregator.cli"),
        "confirmation logic works on histograms its caller loaded",
    ),
    Rule(
        ("aggregator.remote",),
        ("aggregator.service", "aggregator.store", "aggregator.jobs", "aggregator.cli"),
        "a running server's analyst client knows the wire, not the server's insides",
    ),
    Rule(
        ("aggregator.planning",),
        (
            "aggregator.service",
            "aggregator.store",
            "aggregator.analysis",
            "aggregator.remote",
            "aggregator.jobs",
            "aggregator.cli",
        ),
        "planning needs no data",
    ),
    Rule(
        (
            *(name for name in ABOVE_THE_CORE if name != "aggregator.cli"),
            "aggregator.histogram",
            "aggregator.errors",
            "aggregator.presentation",
        ),
        ("aggregator.cli",),
        "the command line sits on top: nothing else imports it",
    ),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str) -> set[str]:
    """Every module named by an import statement anywhere in ``source`` (lazy imports too)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                base = module.split(".")[: -node.level]
                prefix = ".".join([*base, node.module] if node.module else base)
            else:
                prefix = node.module or ""
            found.add(prefix)
            found.update(f"{prefix}.{alias.name}" for alias in node.names)
    return found


def violations(module: str, imports: set[str]) -> list[str]:
    def under(name: str, prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    broken = []
    for subjects, forbidden, why, exempt in RULES:
        if not any(under(module, subject) for subject in subjects):
            continue
        if any(under(module, name) for name in exempt):
            continue
        for name in sorted(imports):
            for prefix in forbidden:
                if under(name, prefix):
                    broken.append(f"{module} imports {name} ({why})")
    return broken


def our_modules() -> list[Path]:
    return sorted(
        path
        for package in PACKAGES
        for path in (REPO / package).rglob("*.py")
        if "_pb2" not in path.name
    )


def test_every_module_keeps_the_import_rules():
    broken = []
    for path in our_modules():
        module = module_name(path)
        broken += violations(module, imported_modules(path.read_text(), module))
    assert broken == []


#: Every package of the layout (docs/architecture.md); each ``__init__`` says what it may import.
PACKAGES_OF_THE_LAYOUT = (
    "client/mechanisms",
    "client/device",
    "client/cli",
    "client/simulate",
    "aggregator/service",
    "aggregator/service/server",
    "aggregator/service/collector",
    "aggregator/service/analyst",
    "aggregator/store",
    "aggregator/store/sqlite",
    "aggregator/store/postgres",
    "aggregator/stats",
    "aggregator/stats/design",
    "aggregator/stats/anytime",
    "aggregator/analysis",
    "aggregator/planning",
    "aggregator/jobs",
    "aggregator/report",
    "aggregator/confirm",
    "aggregator/remote",
    "aggregator/survey_file",
    "aggregator/presentation",
    "aggregator/cli",
)

#: The only modules beside the packages at the top of each distribution: the core types every
#: part shares and the entry point.
TOP_LEVEL_MODULES = {
    "client": {"__init__", "survey", "budgeting"},
    "aggregator": {"__init__", "entry", "errors", "histogram"},
}


def test_the_layout_has_the_documented_packages():
    for package in PACKAGES_OF_THE_LAYOUT:
        init = REPO / package / "__init__.py"
        assert init.is_file(), package
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "import" in doc, f"{package}/__init__.py must say what it may import"


def test_no_loose_modules_at_the_top():
    for package, allowed in TOP_LEVEL_MODULES.items():
        found = {path.stem for path in (REPO / package).glob("*.py")}
        assert found == allowed, f"{package}/: {sorted(found - allowed)} belong in a package"


def import_graph() -> dict[str, set[str]]:
    """Each of our modules and the modules of ours it imports (lazy imports too); ``from p import
    m`` names the module ``p.m`` where ``m`` is one."""
    modules = {module_name(path): path for path in our_modules()}
    graph = {}
    for module, path in modules.items():
        named = imported_modules(path.read_text(), module)
        graph[module] = {name for name in named if name in modules and name != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles():
    """No module reaches itself through imports, lazy ones included: every room sits on the
    rooms below it (docs/architecture.md, "Import rules")."""
    graph = import_graph()
    # a package's __init__ importing its own modules is how a package exports names, not a circle
    for module in graph:
        graph[module] = {name for name in graph[module] if not module.startswith(name + ".")}
    assert circles(graph) == []


def test_the_circle_check_sees_one():
    """Control: a circle through three modules, and one through a lazy import, are found."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = {"x": imported_modules("def f():\n    import y\n", "x") & {"y"}, "y": {"x"}}
    assert circles(graph) == [["x", "y"]]


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("aggregator.stats.gof", "from aggregator.store import ingest\n", "aggregator.store"),
        (
            "aggregator.service.analyst.servicer",
            "def f():\n    import aggregator.jobs.pipeline\n",
            "jobs",
        ),
        ("client.device.outbox", "from aggregator.histogram import Histogram\n", "aggregator"),
        ("client.mechanisms.base", "from ..device import ledger\n", "client.device"),
        (
            "aggregator.store.shards",
            "from aggregator.service.collector.limits import x\n",
            "service",
        ),
        ("aggregator.store.ingest", "import grpc\n", "grpc"),
        ("aggregator.presentation.tables", "from ..stats import result\n", "aggregator.stats"),
        ("aggregator.errors", "from aggregator.survey_file import config\n", "survey_file"),
    ],
)
def test_the_static_check_sees_a_broken_rule(module, source, expected):
    """Control: a forbidden import, top-level, lazy or relative, is reported."""
    broken = violations(module, imported_modules(source, module))
    assert broken and all(expected in line for line in broken), broken


# --- mechanisms own their knowledge: no type switch on them elsewhere --------------------------

#: Modules still allowed a type switch on mechanism classes, and why (issue 23).
MECHANISM_SWITCH_EXEMPT = {
    "client.survey": "the survey definition's parameters per mechanism (not yet on the classes)",
}


def mechanism_classes() -> set[str]:
    """Names of the mechanism classes ``client.mechanisms`` exports (not the base ``Mechanism``:
    ``isinstance(x, Mechanism)`` checks an argument, it does not switch on the kind)."""
    import inspect

    import client.mechanisms as mechanisms

    return {
        name
        for name, value in vars(mechanisms).items()
        if inspect.isclass(value)
        and issubclass(value, mechanisms.Mechanism)
        and value is not mechanisms.Mechanism
    }


def mechanism_switches(source: str, classes: set[str]) -> list[str]:
    """Every ``isinstance``/``issubclass`` call in ``source`` whose class argument names a
    mechanism class imported from ``client.mechanisms`` (by name, alias or module attribute)."""
    tree = ast.parse(source)
    local: set[str] = set()  # names bound to a mechanism class
    modules: set[str] = set()  # names bound to client.mechanisms or one of its modules
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("client.mechanisms"):
            for alias in node.names:  # a class, or a module of the package
                (local if alias.name in classes else modules).add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module == "client":
            modules.update(a.asname or a.name for a in node.names if a.name == "mechanisms")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("client.mechanisms"):
                    modules.add(alias.asname or alias.name)

    def names_a_class(node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in local
        if isinstance(node, ast.Attribute):
            return node.attr in classes and ast.unparse(node.value) in modules
        if isinstance(node, ast.Tuple):
            return any(names_a_class(e) for e in node.elts)
        if isinstance(node, ast.BinOp):  # A | B
            return names_a_class(node.left) or names_a_class(node.right)
        return False

    return [
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("isinstance", "issubclass")
        and len(node.args) == 2
        and names_a_class(node.args[1])
    ]


def test_no_type_switch_on_mechanisms_outside_them():
    """Decoding, statistic rows and sums, accepted ranges and how the statistics read a
    mechanism are properties and methods of the mechanism classes (docs/architecture.md)."""
    classes = mechanism_classes()
    found = []
    for path in our_modules():
        module = module_name(path)
        if module.startswith("client.mechanisms") or module in MECHANISM_SWITCH_EXEMPT:
            continue
        found += [f"{module} {hit}" for hit in mechanism_switches(path.read_text(), classes)]
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        "from client.mechanisms import LaplaceNoise\nif isinstance(m, LaplaceNoise): pass\n",
        "from client.mechanisms import PublicCoinBit as P\ndef f(m):\n    return isinstance(m, P)",
        "from client.mechanisms import A, FlipComponents\nisinstance(m, A | FlipComponents)\n",
        "from client import mechanisms\nisinstance(m, (int, mechanisms.SupportMechanism))\n",
        "import client.mechanisms.unary as u\nissubclass(c, u.OptimizedUnaryEncoding)\n",
    ],
)
def test_the_switch_check_sees_one(source):
    """Control: a type test on a mechanism class, however it is imported, is reported; a type
    test on another class is not."""
    classes = mechanism_classes()
    assert len(mechanism_switches(source, classes)) == 1
    harmless = "from client.mechanisms import Mechanism\nisinstance(m, Mechanism)\n"
    assert mechanism_switches(harmless, classes) == []


#: Not loaded by a device: the aggregator, scipy and tqdm (only its extra installs them), Beam and
#: matplotlib. The gRPC plug-ins (grpc_health, grpc_reflection) cannot be checked here: where they
#: are installed, ``import grpc`` itself imports them, which is one reason a device must not
#: install them; scripts/check_device_install.sh checks a real device install has none of them.
#: ``client.simulate`` (the population load generator) loads only for ``ldp-client simulate``.
FORBIDDEN = (
    "scipy",
    "aggregator",
    "apache_beam",
    "matplotlib",
    "tqdm",
    "client.simulate",
)

CLIENT_WORKLOAD = """
import client, client.mechanisms, client.device.ledger, client.device.outbox
import numpy as np
from client.mechanisms import FlipComponents, GaussianNoise, LaplaceNoise, RandomizedResponse

for mech in (RandomizedResponse(4, 1.0), FlipComponents(4, 1.0), GaussianNoise(4, 0.5),
             LaplaceNoise(4, 1.0)):
    report = mech.randomize(2)
    mech.decode(mech.encode(report))
    mech.cost, mech.describe()
    mech.simulate(np.array([0, 1, 2, 3]), np.random.default_rng(0))
RandomizedResponse(4, 1.0).realized_epsilon, FlipComponents(4, 1.0).realized_epsilon
GaussianNoise(4, 8.0, granularity_bits=0).noise_variance
import client.device.reporter, client.cli.main, client.cli.progress
client.cli.main.build_parser().parse_args(["submit", "--server", "h:1", "--state", "s",
                                           "--survey", "s", "--question", "q", "--index", "0"])
client.cli.progress.bar(3, "x").close()
"""

REPORT = """
import json, sys
forbidden = {forbidden!r}
print(json.dumps(sorted(
    name for name in sys.modules if any(name == f or name.startswith(f + ".") for f in forbidden)
)))
"""


def loaded_forbidden_modules(workload: str) -> list[str]:
    """Run ``workload`` in a fresh interpreter and list the forbidden modules it loaded."""
    code = workload + REPORT.format(forbidden=FORBIDDEN)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_client_imports_nothing_heavy():
    assert loaded_forbidden_modules(CLIENT_WORKLOAD) == []


def test_the_check_sees_a_forbidden_import():
    """Control: the same probe does report the aggregator and scipy once they are imported."""
    loaded = loaded_forbidden_modules(
        CLIENT_WORKLOAD + "import aggregator.histogram, scipy.stats, tqdm\n"
    )
    assert "aggregator" in loaded and "aggregator.histogram" in loaded
    assert "scipy" in loaded and "tqdm" in loaded
