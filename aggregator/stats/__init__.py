"""Estimates, local chi-square tests and study planning, computed from sufficient statistics only.

May import ``aggregator.histogram``, ``aggregator.errors``, ``client.mechanisms`` and scipy; never
``aggregator.service``, ``aggregator.store`` or ``aggregator.jobs``.
"""

from aggregator.stats.composite import composite, independence
from aggregator.stats.design import Design, design_cells
from aggregator.stats.design_calibration import PostStratified, post_stratified_estimate
from aggregator.stats.design_estimate import DesignEstimate, design_estimate
from aggregator.stats.design_tests import (
    DesignTestResult,
    design_goodness_of_fit,
    design_independence,
    design_k_sample,
)
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
    "Design",
    "DesignEstimate",
    "DesignTestResult",
    "Estimate",
    "FunctionModel",
    "HolmResult",
    "IndependenceModel",
    "ParametricModel",
    "PostStratified",
    "TestResult",
    "advise",
    "composite",
    "design_cells",
    "design_estimate",
    "design_goodness_of_fit",
    "design_independence",
    "design_k_sample",
    "estimate",
    "goodness_of_fit",
    "holm",
    "independence",
    "k_sample",
    "k_sample_power",
    "noncentrality",
    "post_stratified_estimate",
    "power",
    "sample_size",
    "two_sample",
    "two_sample_power",
]
