"""Per design key sufficient statistics of a survey with a sampling design (docs/designs.md).

For each (survey, question, side, group, design key) the store keeps the number of reports, the
int64 sums of their statistic rows (as the histogram does) and the float64 sums of the rows'
squares, updated in the ingest transaction that stores the reports. With the sampling frame
(stratum, PSU and weight per key) these give every design-based estimate and test: a key's
weight is constant, so its weighted sums are the weight times these sums. The engines keep
them with their own statements (sqlite/design_statistics.py, postgres/design.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class KeyStatistics:
    """One design key's reports of one question (and group): their number, the int64 sums of
    their statistic rows and the float64 sums of the rows' squares, coordinate by coordinate."""

    group: str
    key: str
    n: int
    sums: np.ndarray
    squares: np.ndarray


#: New reports of one (survey, question, side, group): their design keys and statistic rows.
Keyed = tuple[tuple[str, str, int, str], Sequence[str], np.ndarray]
