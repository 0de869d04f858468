"""Anytime-valid monitoring: confidence sequences and sequential tests (e-processes) whose
guarantees hold at every n at once, computed from the sufficient statistics at each look
(survey-design-and-monitoring spec S; docs/monitoring.md).

The public names load on first use (PEP 562), as in ``aggregator.stats``: the service and the
command line import ``anytime.names`` at start without loading SciPy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aggregator.stats.lazy import lazy_attributes

if TYPE_CHECKING:
    from aggregator.stats.anytime.eprocess import (
        EProcess as EProcess,
    )
    from aggregator.stats.anytime.eprocess import (
        SequentialResult as SequentialResult,
    )
    from aggregator.stats.anytime.monitor import (
        expected_stopping_time as expected_stopping_time,
    )
    from aggregator.stats.anytime.monitor import (
        frequency_path as frequency_path,
    )
    from aggregator.stats.anytime.monitor import (
        looks_from_sums as looks_from_sums,
    )
    from aggregator.stats.anytime.monitor import (
        sequential_goodness_of_fit as sequential_goodness_of_fit,
    )
    from aggregator.stats.anytime.monitor import (
        sequential_homogeneity as sequential_homogeneity,
    )
    from aggregator.stats.anytime.monitor import (
        sequential_independence as sequential_independence,
    )
    from aggregator.stats.anytime.sequences import (
        ConfidenceSequence as ConfidenceSequence,
    )
    from aggregator.stats.anytime.sequences import (
        DifferenceSequence as DifferenceSequence,
    )
    from aggregator.stats.anytime.sequences import (
        MeanScoreSequence as MeanScoreSequence,
    )
    from aggregator.stats.anytime.sequences import (
        difference_sequence as difference_sequence,
    )
    from aggregator.stats.anytime.sequences import (
        frequency_sequence as frequency_sequence,
    )
    from aggregator.stats.anytime.sequences import (
        mean_score_sequence as mean_score_sequence,
    )
    from aggregator.stats.anytime.stopping import (
        SimulatedStopping as SimulatedStopping,
    )
    from aggregator.stats.anytime.stopping import (
        StoppingForecast as StoppingForecast,
    )
    from aggregator.stats.anytime.stopping import (
        forecast_stopping as forecast_stopping,
    )
    from aggregator.stats.anytime.stopping import (
        simulate_stopping as simulate_stopping,
    )

_HOMES = {
    "ConfidenceSequence": "sequences",
    "DifferenceSequence": "sequences",
    "EProcess": "eprocess",
    "MeanScoreSequence": "sequences",
    "SequentialResult": "eprocess",
    "SimulatedStopping": "stopping",
    "StoppingForecast": "stopping",
    "difference_sequence": "sequences",
    "expected_stopping_time": "monitor",
    "forecast_stopping": "stopping",
    "frequency_path": "monitor",
    "frequency_sequence": "sequences",
    "looks_from_sums": "monitor",
    "mean_score_sequence": "sequences",
    "sequential_goodness_of_fit": "monitor",
    "sequential_homogeneity": "monitor",
    "sequential_independence": "monitor",
    "simulate_stopping": "stopping",
}

__all__ = sorted(_HOMES)


__getattr__ = lazy_attributes(__name__, _HOMES)
