"""What has been released of each cell of statistics, and the rule that moves it
(docs/threat-model.md, "What is released").

A cell is one (survey, question, side, group) statistic; group '' is the whole question of a
survey without a group label. Its released snapshot is an (n, sums) the cell once held. The
first snapshot is taken once the cell holds at least ``step`` reports (the survey's
``min_batch_size``); it is replaced by the cell's current statistic only once the cell has
grown by at least ``step`` reports since; every read releases the snapshot. A cell's reports
only ever grow, so the releases of one cell are nested sets of reports, each at least ``step``
reports larger than the one before: no difference of releases isolates fewer. Every snapshot
moved is also appended to the cell's history of releases (the looks of monitoring), and its per
design key rows are copied with it.

Each engine keeps the rule with its own statements (sqlite/releases.py, postgres/analysis.py).
"""

from __future__ import annotations

#: (survey_id, question_id, side, group value or '').
Cell = tuple[str, str, int, str]
#: A released (n, sums).
Snapshot = tuple[int, list[int]]
