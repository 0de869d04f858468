"""A question's design data: the store's per design key statistics joined to the survey's
sampling frame, as the design cells every design-based estimate and test reads
(docs/designs.md)."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from aggregator.errors import InvalidInputError
from aggregator.stats.design.cells import DesignCells, contributions_from_counts
from aggregator.stats.design.keys import keyed_cells
from aggregator.store.design_statistics import KeyStatistics
from aggregator.store.sqlite import design_statistics
from aggregator.survey_file.design import SamplingFrame
from client.survey import QuestionSpec, SurveySpec


@dataclass(frozen=True)
class DesignData:
    """One question's per key statistics (of one group, or of all) and the frame they join."""

    question: QuestionSpec
    frame: SamplingFrame
    keys: tuple[KeyStatistics, ...]
    groups: tuple[str, ...] = ()  # the survey's group values: domains of ``cells(by_group)``

    @property
    def n(self) -> int:
        return sum(stat.n for stat in self.keys)

    @property
    def post_strata(self) -> tuple[str, ...]:
        """The frame's post-strata in order (empty: no post-stratification)."""
        return tuple(self.frame.population)

    def population(self) -> np.ndarray:
        """The known population count of each post-stratum, in ``post_strata`` order."""
        return np.array(list(self.frame.population.values()), dtype=float)

    @property
    def raking(self) -> tuple[str, ...]:
        """The frame's raking variables in order (empty: no raking)."""
        return tuple(self.frame.margins)

    def margins(self) -> list[np.ndarray]:
        """The known population margins, one array per raking variable in ``raking`` order,
        its categories in the order the survey file lists them."""
        return [np.array(list(m.values()), dtype=float) for m in self.frame.margins.values()]

    def raking_cells(self) -> DesignCells:
        """The design cells with the joint raking categories as domains (row-major over the
        margins), for ``raked_estimate`` (design_raking.raking_cells on the keys with reports)."""
        from aggregator.stats.design.raking import FrameKeys, raking_cells

        frame = self._frame_rows()
        margins = list(self.frame.margins.values())
        categories = np.array(
            [[list(m).index(c) for m, c in zip(margins, row.raking, strict=True)] for row in frame],
            dtype=np.int64,
        ).reshape(len(frame), len(margins))
        fpc = [row.fpc for row in frame]
        keys = FrameKeys(
            np.array([row.stratum for row in frame], dtype=str),
            np.array([row.psu for row in frame], dtype=str),
            np.array([row.weight for row in frame]),
            categories,
            None if not frame or fpc[0] is None else np.array(fpc, dtype=float),
        )
        count, total, square = self._sums()
        return raking_cells(keys, [len(m) for m in margins], count, total, square)

    def _frame_rows(self) -> list:
        """Each key's frame row; InvalidInputError for a key with reports the frame no longer
        lists."""
        rows = self.frame.rows
        missing = sorted({stat.key for stat in self.keys} - set(rows))
        if missing:
            raise InvalidInputError(
                f"design key {missing[0]!r} has reports but is not in the sampling frame "
                f"{self.frame.table} ({len(missing)} such keys): restore the frame's rows"
            )
        return [rows[stat.key] for stat in self.keys]

    def _sums(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per key: the report count and the sums of contributions and of their squares."""
        k = self.question.statistic_size
        mechanism = self.question.mechanism
        sums = [contributions_from_counts(mechanism, s.n, s.sums, s.squares) for s in self.keys]
        return (
            np.array([stat.n for stat in self.keys]),
            np.array([total for total, _ in sums]).reshape(-1, k),
            np.array([square for _, square in sums]).reshape(-1, k),
        )

    def cells(self, by_group: bool = False, by_post_stratum: bool = False) -> DesignCells:
        """The design cells: one domain, or one per group value (``by_group``), or one per
        post-stratum (``by_post_stratum``, for ``post_stratified_estimate``).
        InvalidInputError for a key with reports that the frame no longer lists."""
        if by_group and by_post_stratum:
            raise InvalidInputError("domains are either the groups or the post-strata")
        frame = self._frame_rows()
        count, total, square = self._sums()
        fpc = [row.fpc for row in frame]
        domains, n_domains = None, 1
        if by_group:
            domains = np.array([self.groups.index(stat.group) for stat in self.keys], dtype=int)
            n_domains = len(self.groups)
        elif by_post_stratum:
            strata = self.post_strata
            domains = np.array([strata.index(row.post_stratum) for row in frame], dtype=int)
            n_domains = len(strata)
        return keyed_cells(
            np.array([row.stratum for row in frame], dtype=str),
            np.array([row.psu for row in frame], dtype=str),
            np.array([row.weight for row in frame]),
            None if not frame or fpc[0] is None else np.array(fpc, dtype=float),
            count,
            total,
            square,
            domains,
            n_domains,
        )

    def description(self) -> str:
        """Which design the results rest on, e.g. 'stratified cluster design: 12 strata, 240
        PSUs, weights' (strata and PSUs with reports)."""
        rows = [self.frame.rows[stat.key] for stat in self.keys if stat.key in self.frame.rows]
        strata = len({row.stratum for row in rows})
        psus = len({(row.stratum, row.psu) for row in rows})
        kind = ("stratified " if strata > 1 else "") + "cluster design"
        extras = ["weights"] if len({row.weight for row in rows}) > 1 else ["equal weights"]
        if rows and rows[0].fpc is not None:
            extras.append("fpc")
        if self.post_strata:
            extras.append(f"post-stratified to {len(self.post_strata)} post-strata")
        if self.raking:
            extras.append(f"raked to the margins of {', '.join(self.raking)}")
        return f"{kind}: {strata} strata, {psus} PSUs, {', '.join(extras)}"


def read_design_data(
    conn: sqlite3.Connection, survey: SurveySpec, question: QuestionSpec, side: int, group: str
) -> DesignData:
    """The question's design data on ``side``, of ``group`` ('': every group, each kept apart
    for ``cells(by_group=True)``)."""
    return design_data_of(
        survey, question, design_statistics.read(conn, survey.id, question.id, side), group
    )


def design_data_of(
    survey: SurveySpec, question: QuestionSpec, stats: Sequence[KeyStatistics], group: str
) -> DesignData:
    """The question's design data from its keys' statistics as a store read them (SQLite's, or
    the shared PostgreSQL store's), of ``group`` ('': every group)."""
    if not isinstance(survey.design, SamplingFrame):
        raise InvalidInputError(f"survey {survey.id!r} has no sampling design")
    if group:
        stats = [stat for stat in stats if stat.group == group]
    groups = survey.group_label.values if survey.group_label else ("",)
    return DesignData(question, survey.design, tuple(stats), tuple(groups))


def side_design_data(
    survey: SurveySpec, stats: Mapping[str, Sequence[KeyStatistics]]
) -> dict[str, DesignData]:
    """Every question's design data (all groups kept apart) from the per key statistics a
    store read of one side (a confirmation snapshot's ``designs``); {} without a design."""
    if not isinstance(survey.design, SamplingFrame):
        return {}
    return {
        question_id: design_data_of(survey, survey.question(question_id), rows, "")
        for question_id, rows in stats.items()
    }
