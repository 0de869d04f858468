"""The aggregator: it receives randomized reports, stores them durably, and turns them into
estimates and local chi-square tests.

``service/`` (gRPC) and ``store/`` (durable log, validation, shards) feed ``histogram.py``;
``stats/`` reads only histograms; ``jobs/`` (Beam) reuses store and stats. Imports point one way:
aggregator -> client -> protos; ``service`` never imports ``jobs``; ``stats`` never imports
``service``, ``store`` or ``jobs``. See docs/architecture.md.
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
    design: bool = False,
) -> SurveyData:
    """Per question of a survey, its histogram and labels, read only from a report store:
    ``aggregator.open_survey("surveys.toml", "reports.sqlite")["mood"].histogram``; a split
    survey on one ``side``, a survey with a group label for one ``group`` (ConfigError for an
    unknown one). As on the command line, nothing is released below min_batch_size: such a
    question's ``histogram`` raises InsufficientDataError. With ``design`` (a survey with a
    sampling design) each question's ``design`` gives its design cells (docs/designs.md). See
    :func:`aggregator.analysis.survey_data.open_survey`."""
    from aggregator.analysis.survey_data import (
        open_survey as load,  # lazily: keeps `import aggregator` light
    )

    return load(config, db, survey, side, group, withhold=True, design=design)
