"""The aggregator: it receives randomized reports, stores them durably, and turns them into
estimates and local chi-square tests.

``service/`` (gRPC: ``server/`` composing the ``collector/`` and ``analyst/`` rooms) and
``store/`` (an engine-neutral contract and rules, the ``sqlite/`` and ``postgres/`` engines beside
each other) feed ``histogram.py``; ``stats/`` reads only histograms; ``analysis/`` reads and
analyses a survey for the command line, the service and the report alike; ``planning/`` needs no
data; ``jobs/`` (Beam) reuses store and stats; ``cli/`` sits on top. Imports point one way:
aggregator -> client -> protos, with no circle (docs/architecture.md, "Import rules").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aggregator.analysis.survey_data import SurveyData

__all__ = ["open_survey"]


def open_survey(
    config,
    db,
    survey: str | None = None,
    side: str | None = None,
    group: str | None = None,
    *,
    design: bool | None = None,
) -> SurveyData:
    """Per question of a survey, its histogram and labels, read only from a report store:
    ``aggregator.open_survey("surveys.toml", "reports.sqlite")["mood"].histogram``; a split
    survey on one ``side``, a survey with a group label for one ``group`` (ConfigError for an
    unknown one). As on the command line, nothing is released below min_batch_size: such a
    question's ``histogram`` raises InsufficientDataError. A survey with a sampling design is
    read design-based unless ``design=False``: each question's ``design`` gives its design
    cells, and its ``estimate``, ``goodness_of_fit`` and ``independence`` are design-based
    (docs/designs.md). See
    :func:`aggregator.analysis.survey_data.open_survey`."""
    from aggregator.analysis.survey_data import (
        open_survey as load,  # lazily: keeps `import aggregator` light
    )

    return load(config, db, survey, side, group, withhold=True, design=design)
