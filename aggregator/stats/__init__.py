"""Estimates, local chi-square tests and study planning, computed from sufficient statistics only.

May import ``aggregator.histogram``, ``aggregator.errors``, ``client.mechanisms`` and scipy; never
``aggregator.service``, ``aggregator.store`` or ``aggregator.jobs``.
"""

from aggregator.stats.composite import composite, independence
from aggregator.stats.estimate import Estimate, estimate
from aggregator.stats.gof import goodness_of_fit
from aggregator.stats.k_sample import k_sample, k_sample_power
from aggregator.stats.models import FunctionModel, IndependenceModel, ParametricModel
from aggregator.stats.multiple import HolmResult, holm
from aggregator.stats.power import Advice, advise, noncentrality, power, sample_size
from aggregator.stats.result import TestResult
from aggregator.stats.two_sample import two_sample, two_sample_power

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
    "k_sample",
    "k_sample_power",
    "noncentrality",
    "power",
    "sample_size",
    "two_sample",
    "two_sample_power",
]
