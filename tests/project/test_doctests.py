"""The examples in the public API's docstrings run, and every source a docstring cites exists.

Doctests: each module below must hold examples, each public object listed for it must have its
own, and every example must pass (``ELLIPSIS | NORMALIZE_WHITESPACE``).

Citations: a ``[Key]`` (author and year, e.g. ``[Rogers2017]``) anywhere in the code or the docs
must be defined in docs/references.md, and a docstring or comment of the packages that says
"spec" must say which one (``privacy-accounting spec §D.3``), by a name listed there.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCES = ROOT / "docs" / "references.md"
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

#: module -> the public objects in it whose docstrings must carry examples.
DOCTESTED = {
    "aggregator.stats.gof": ("goodness_of_fit",),
    "aggregator.stats.composite": ("independence", "composite"),
    "aggregator.stats.estimate": ("estimate",),
    "aggregator.stats.power": ("power", "sample_size", "advise", "noncentrality"),
    "aggregator.stats.two_sample": ("two_sample", "two_sample_power"),
    "aggregator.stats.multiple": ("holm",),
    "aggregator.histogram": ("Histogram",),
    "client.mechanisms.randomized_response": ("RandomizedResponse",),
    "client.mechanisms.flip_components": ("FlipComponents",),
    "client.mechanisms.additive": ("GaussianNoise", "LaplaceNoise"),
}

#: Where citations are looked for.
CITING = ("aggregator", "client", "scripts", "tests", "docs")
CITATION = re.compile(r"\[([A-Z][A-Za-z]+(?:19|20)\d\d[A-Za-z]*)\]")
DEFINITION = re.compile(r"^- \*\*\[([A-Za-z0-9]+)\]\*\*", re.MULTILINE)
SPEC_ROW = re.compile(r"^\| ([a-z-]+) \| `/work/shared/spec/\1\.md` \|", re.MULTILINE)


def _module(name: str):
    # importlib, not ``import a.b as m``: aggregator.stats re-exports functions named like some
    # of its modules (estimate), which would shadow them.
    return importlib.import_module(name)


def _doctests(name: str) -> list[doctest.DocTest]:
    module = _module(name)
    tests = doctest.DocTestFinder(exclude_empty=True).find(module, name)
    return [t for t in tests if t.examples]


def _run(test: doctest.DocTest) -> tuple[int, str]:
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    result = runner.run(test, out=out.write)
    return result.failed, out.getvalue()


@pytest.mark.parametrize("name", sorted(DOCTESTED))
def test_module_examples_pass(name: str) -> None:
    tests = _doctests(name)
    assert tests, f"{name} has no doctest examples"
    named = {t.name.removeprefix(name + ".").split(".")[0] for t in tests}
    missing = [obj for obj in DOCTESTED[name] if obj not in named]
    assert not missing, f"{name}: no examples in the docstring of {missing}"
    for test in tests:
        failed, report = _run(test)
        assert failed == 0, f"{test.name}: {failed} example(s) failed\n{report}"


def test_a_wrong_example_fails() -> None:
    """The runner above does catch a wrong output (a guard against a vacuous check)."""
    test = doctest.DocTestParser().get_doctest(">>> 1 + 1\n3\n", {}, "wrong", "wrong.py", 0)
    failed, report = _run(test)
    assert failed == 1 and "Expected" in report


def _defined_keys() -> set[str]:
    keys = DEFINITION.findall(REFERENCES.read_text(encoding="utf-8"))
    assert len(keys) == len(set(keys)), "a key is defined twice in docs/references.md"
    return set(keys)


def _spec_names() -> set[str]:
    names = set(SPEC_ROW.findall(REFERENCES.read_text(encoding="utf-8")))
    assert names, "docs/references.md lists no project specs"
    return names | {"large-domain"}  # the short name the docs use for the large-domain spec


def _files(suffixes: tuple[str, ...]) -> list[Path]:
    return sorted(
        path
        for top in CITING
        for path in (ROOT / top).rglob("*")
        if path.suffix in suffixes and path.is_file() and path != REFERENCES
    )


def test_every_cited_key_is_defined() -> None:
    defined = _defined_keys()
    cited: dict[str, list[str]] = {}
    for path in _files((".py", ".md")):
        for key in CITATION.findall(path.read_text(encoding="utf-8")):
            cited.setdefault(key, []).append(str(path.relative_to(ROOT)))
    assert "Rogers2017" in cited, "the scan found no citations at all"
    undefined = {key: where for key, where in cited.items() if key not in defined}
    assert not undefined, f"cited but not defined in docs/references.md: {undefined}"


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every docstring and comment of a Python file."""
    source = path.read_text(encoding="utf-8")
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                found.append((node.body[0].lineno, docstring))
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
    return found


def test_every_spec_citation_names_its_spec() -> None:
    names = sorted(_spec_names(), key=len, reverse=True)
    named = re.compile(r"(?:" + "|".join(map(re.escape, names)) + r") spec\b")
    vague = []
    for top in ("aggregator", "client"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if not re.search(r"\bspec\b", path.read_text(encoding="utf-8")):
                continue
            for line, text in _prose(path):
                text = re.sub(r"\s+", " ", text)
                bare = len(re.findall(r"\bspec\b", text)) - len(named.findall(text))
                if bare:
                    vague.append(f"{path.relative_to(ROOT)}:{line}")
    assert not vague, f"'spec' without the spec's name (see docs/references.md): {vague}"
