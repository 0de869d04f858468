"""Estimates, local chi-square tests and study planning, computed from sufficient statistics only.

May import ``aggregator.histogram``, ``aggregator.errors``, ``client.mechanisms`` and scipy; never
``aggregator.service``, ``aggregator.store`` or ``aggregator.jobs``.
"""

from aggregator.stats.anytime import (
    ConfidenceSequence,
    SequentialResult,
    difference_sequence,
    frequency_sequence,
    mean_score_sequence,
    sequential_goodness_of_fit,
    sequential_homogeneity,
    sequential_independence,
)
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
    "ConfidenceSequence",
    "Estimate",
    "FunctionModel",
    "HolmResult",
    "IndependenceModel",
    "ParametricModel",
    "SequentialResult",
    "TestResult",
    "advise",
    "composite",
    "difference_sequence",
    "estimate",
    "frequency_sequence",
    "goodness_of_fit",
    "holm",
    "independence",
    "k_sample",
    "k_sample_power",
    "mean_score_sequence",
    "noncentrality",
    "power",
    "sample_size",
    "sequential_goodness_of_fit",
    "sequential_homogeneity",
    "sequential_independence",
    "two_sample",
    "two_sample_power",
]
