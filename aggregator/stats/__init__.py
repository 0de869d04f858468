"""Estimates, local chi-square tests and study planning, computed from sufficient statistics only.

May import ``aggregator.histogram``, ``aggregator.errors``, ``aggregator.presentation``,
``client.mechanisms`` and scipy; never a store, the service, the survey file layer or anything
else above it.

The public names load on first use (PEP 562): importing one module of the package (the command
line's ``estimate`` imports ``stats.estimate``) does not load scipy.stats through the tests, which
keeps ``ldp-aggregator estimate`` starting in under a second (docs/performance.md). ``preload()``
imports everything, for a worker that should pay the import before its first task.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from aggregator.stats.lazy import lazy_attributes

if TYPE_CHECKING:
    from aggregator.stats.anytime import (
        ConfidenceSequence as ConfidenceSequence,
    )
    from aggregator.stats.anytime import (
        SequentialResult as SequentialResult,
    )
    from aggregator.stats.anytime import (
        difference_sequence as difference_sequence,
    )
    from aggregator.stats.anytime import (
        frequency_sequence as frequency_sequence,
    )
    from aggregator.stats.anytime import (
        mean_score_sequence as mean_score_sequence,
    )
    from aggregator.stats.anytime import (
        sequential_goodness_of_fit as sequential_goodness_of_fit,
    )
    from aggregator.stats.anytime import (
        sequential_homogeneity as sequential_homogeneity,
    )
    from aggregator.stats.anytime import (
        sequential_independence as sequential_independence,
    )
    from aggregator.stats.composite import (
        composite as composite,
    )
    from aggregator.stats.composite import (
        independence as independence,
    )
    from aggregator.stats.design.calibration import (
        PostStratified as PostStratified,
    )
    from aggregator.stats.design.calibration import (
        post_stratified_estimate as post_stratified_estimate,
    )
    from aggregator.stats.design.cells import (
        Design as Design,
    )
    from aggregator.stats.design.cells import (
        design_cells as design_cells,
    )
    from aggregator.stats.design.estimate import (
        DesignEstimate as DesignEstimate,
    )
    from aggregator.stats.design.estimate import (
        design_estimate as design_estimate,
    )
    from aggregator.stats.design.power import (
        DesignEffect as DesignEffect,
    )
    from aggregator.stats.design.raking import (
        Raked as Raked,
    )
    from aggregator.stats.design.raking import (
        raked_estimate as raked_estimate,
    )
    from aggregator.stats.design.rao_scott import (
        DesignTestResult as DesignTestResult,
    )
    from aggregator.stats.design.rao_scott import (
        design_goodness_of_fit as design_goodness_of_fit,
    )
    from aggregator.stats.design.rao_scott import (
        design_independence as design_independence,
    )
    from aggregator.stats.design.rao_scott import (
        design_k_sample as design_k_sample,
    )
    from aggregator.stats.estimate import (
        Estimate as Estimate,
    )
    from aggregator.stats.estimate import (
        estimate as estimate,
    )
    from aggregator.stats.gof import (
        goodness_of_fit as goodness_of_fit,
    )
    from aggregator.stats.k_sample import (
        k_sample as k_sample,
    )
    from aggregator.stats.k_sample import (
        k_sample_power as k_sample_power,
    )
    from aggregator.stats.models import (
        FunctionModel as FunctionModel,
    )
    from aggregator.stats.models import (
        IndependenceModel as IndependenceModel,
    )
    from aggregator.stats.models import (
        ParametricModel as ParametricModel,
    )
    from aggregator.stats.multiple import (
        HolmResult as HolmResult,
    )
    from aggregator.stats.multiple import (
        holm as holm,
    )
    from aggregator.stats.power import (
        Advice as Advice,
    )
    from aggregator.stats.power import (
        advise as advise,
    )
    from aggregator.stats.power import (
        noncentrality as noncentrality,
    )
    from aggregator.stats.power import (
        power as power,
    )
    from aggregator.stats.power import (
        sample_size as sample_size,
    )
    from aggregator.stats.result import (
        TestResult as TestResult,
    )
    from aggregator.stats.two_sample import (
        two_sample as two_sample,
    )
    from aggregator.stats.two_sample import (
        two_sample_power as two_sample_power,
    )

#: Each public name and the module that defines it.
_HOMES = {
    "ConfidenceSequence": "anytime",
    "SequentialResult": "anytime",
    "difference_sequence": "anytime",
    "frequency_sequence": "anytime",
    "mean_score_sequence": "anytime",
    "sequential_goodness_of_fit": "anytime",
    "sequential_homogeneity": "anytime",
    "sequential_independence": "anytime",
    "Advice": "power",
    "Design": "design.cells",
    "DesignEffect": "design.power",
    "DesignEstimate": "design.estimate",
    "DesignTestResult": "design.rao_scott",
    "Estimate": "estimate",
    "FunctionModel": "models",
    "HolmResult": "multiple",
    "IndependenceModel": "models",
    "ParametricModel": "models",
    "PostStratified": "design.calibration",
    "Raked": "design.raking",
    "TestResult": "result",
    "advise": "power",
    "composite": "composite",
    "design_cells": "design.cells",
    "design_estimate": "design.estimate",
    "design_goodness_of_fit": "design.rao_scott",
    "design_independence": "design.rao_scott",
    "design_k_sample": "design.rao_scott",
    "estimate": "estimate",
    "goodness_of_fit": "gof",
    "holm": "multiple",
    "independence": "composite",
    "k_sample": "k_sample",
    "k_sample_power": "k_sample",
    "noncentrality": "power",
    "post_stratified_estimate": "design.calibration",
    "power": "power",
    "raked_estimate": "design.raking",
    "sample_size": "power",
    "two_sample": "two_sample",
    "two_sample_power": "two_sample",
}

__all__ = sorted(_HOMES)


__getattr__ = lazy_attributes(__name__, _HOMES)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(ModuleType):
    """The package's module type: six public functions share their module's name (estimate,
    composite, power, two_sample, k_sample, design_estimate), and the import system binds a
    submodule to the package once it is loaded; the public name keeps meaning the function, as
    with eager imports."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _HOMES and isinstance(value, ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def preload() -> None:
    """Import every public name now (SciPy included)."""
    for name in __all__:
        __getattr__(name)
