"""Estimates and local chi-square tests computed from sufficient statistics only."""

from aggregator.stats.composite import composite, independence
from aggregator.stats.estimate import Estimate, estimate
from aggregator.stats.gof import goodness_of_fit
from aggregator.stats.models import FunctionModel, IndependenceModel, ParametricModel
from aggregator.stats.multiple import HolmResult, holm
from aggregator.stats.power import Advice, advise, noncentrality, power, sample_size
from aggregator.stats.result import TestResult

__all__ = [
    "Advice",
    "Estimate",
    "FunctionModel",
    "HolmResult",
    "IndependenceModel",
    "ParametricModel",
    "TestResult",
    "advise",
    "composite",
    "estimate",
    "goodness_of_fit",
    "holm",
    "independence",
    "noncentrality",
    "power",
    "sample_size",
]
