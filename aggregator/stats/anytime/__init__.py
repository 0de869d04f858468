"""Anytime-valid monitoring: confidence sequences and sequential tests (e-processes) whose
guarantees hold at every n at once, computed from the sufficient statistics at each look
(survey-design-and-monitoring spec S; docs/monitoring.md)."""

from aggregator.stats.anytime.eprocess import EProcess, SequentialResult
from aggregator.stats.anytime.monitor import (
    expected_stopping_time,
    frequency_path,
    looks_from_sums,
    sequential_goodness_of_fit,
    sequential_homogeneity,
    sequential_independence,
)
from aggregator.stats.anytime.sequences import (
    ConfidenceSequence,
    DifferenceSequence,
    MeanScoreSequence,
    difference_sequence,
    frequency_sequence,
    mean_score_sequence,
)
from aggregator.stats.anytime.stopping import (
    SimulatedStopping,
    StoppingForecast,
    forecast_stopping,
    simulate_stopping,
)

__all__ = [
    "ConfidenceSequence",
    "DifferenceSequence",
    "EProcess",
    "MeanScoreSequence",
    "SequentialResult",
    "SimulatedStopping",
    "StoppingForecast",
    "difference_sequence",
    "expected_stopping_time",
    "forecast_stopping",
    "frequency_path",
    "frequency_sequence",
    "looks_from_sums",
    "mean_score_sequence",
    "sequential_goodness_of_fit",
    "sequential_homogeneity",
    "sequential_independence",
    "simulate_stopping",
]
