"""Public names of a package that load on first use (PEP 562): ``aggregator.stats`` and
``aggregator.stats.anytime`` list where each name lives, so importing one of their modules
does not load SciPy through all the others (docs/performance.md)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_attributes(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: ``name`` imported from its submodule
    ``homes[name]`` on first use, then kept in the package so later lookups skip this."""

    def attribute(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{home}"), name)
        vars(sys.modules[package])[name] = value
        return value

    return attribute
