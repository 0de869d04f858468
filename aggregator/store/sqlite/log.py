"""The report log of a store file (SQLite), appended in ``seq`` order: where new reports go
(random places within the current block of BLOCK numbers), the INSERT of a group commit's
reports, the flags of reports whose ids the log may hold already, and which ids it holds."""

from __future__ import annotations

import itertools
import operator
import os
import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import numpy as np

from aggregator.store.model import CONFLICT, DUPLICATE, STORED, ReportBatch
from aggregator.store.sqlite.connection import read_only

_IN_CHUNK = 999  # bound parameters per "IN (...)" query: SQLite's lowest historical limit

#: The log's order follows arrival in blocks of this many reports only (docs/threat-model.md).
BLOCK = 4096


@dataclass(frozen=True, slots=True)
class Blocks:
    """Where the next reports go in the log: a new report takes a random free ``seq`` of the
    current block of BLOCK numbers, and the next block opens once it is full. So the log's
    order follows arrival in blocks of BLOCK reports only: within a block, one upload's reports
    sit at random places among those of the BLOCK reports around them, even when nobody else
    uploads at the time, and each report is written once, into pages of the current block
    (hot in the page cache: the writes stay local however large the log)."""

    start: int  # the current block's first seq
    free: np.ndarray  # its free seqs (int64), in random order; the next ones taken from the end

    @classmethod
    def read(cls, conn: sqlite3.Connection) -> Blocks:
        """The block of the log's last seq and its free places (the next block if full)."""
        last = max(conn.execute("SELECT max(seq) FROM reports").fetchone()[0] or 0, 0)
        start = (last - 1) // BLOCK * BLOCK + 1 if last else 1
        taken = [row[0] for row in conn.execute("SELECT seq FROM reports WHERE seq >= ?", (start,))]
        free = np.setdiff1d(np.arange(start, start + BLOCK, dtype=np.int64), taken)
        if not len(free):
            return cls(start + BLOCK, _shuffled(np.arange(BLOCK, dtype=np.int64) + start + BLOCK))
        return cls(start, _shuffled(free))

    def take(self, m: int) -> tuple[Blocks, np.ndarray]:
        """``m`` seqs for new reports, and the state after them (this one is left as it was,
        for a transaction that rolls back)."""
        parts, start, free = [], self.start, self.free
        while m:
            if not len(free):
                start += BLOCK
                free = _shuffled(np.arange(start, start + BLOCK, dtype=np.int64))
            n = min(m, len(free))
            parts.append(free[len(free) - n :])
            free, m = free[: len(free) - n], m - n
        taken = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        return Blocks(start, free), taken


def _shuffled(seqs: np.ndarray) -> np.ndarray:
    """``seqs`` in an order drawn afresh from the system's randomness."""
    return np.random.default_rng(int.from_bytes(os.urandom(16), "little")).permutation(seqs)


#: A text value the log's INSERT may carry as a literal: the survey file's id characters only
#: (client/survey.py), so quoting it cannot go wrong; any other value is bound.
_LITERAL_TEXT = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def log_rows(
    batches: list[ReportBatch],
    ids: list[bytes],
    now: int,
    positions: np.ndarray,
    seqs: np.ndarray,
) -> tuple[str, Iterator[tuple]]:
    """The INSERT into the log and its parameter rows for the reports at ``positions`` of the
    batches (in order; ``ids`` their report ids), report ``positions[i]`` at ``seqs[i]``, in
    ``seq`` order. Each column is permuted at once (``itemgetter``) and zipped, with no Python
    step per report. A column that is one value for the whole group commit (the arrival day
    always; survey, question, side and group usually) is a literal of the statement when it is
    an integer or plain id text, not bound per row: each bound value costs SQLite's
    executemany about 0.1 µs a report (2.9 against 2.5 µs a row with survey and question bound
    or literal)."""
    order = np.argsort(seqs)
    picked = positions[order].tolist()
    if len(picked) > 1:
        pick: Callable[[list[Any]], Iterable[Any]] = operator.itemgetter(*picked)
    else:
        pick = lambda column: [column[i] for i in picked]  # noqa: E731
    names = ["report_id", "payload", "seq", "received_at"]
    marks = ["?", "?", "?", str(operator.index(now))]
    columns = [
        pick(ids),
        pick(list(itertools.chain.from_iterable(b.payloads for b in batches))),
        seqs[order].tolist(),
    ]
    for name, values in (
        ("survey_id", [b.survey_id for b in batches]),
        ("question_id", [b.question_id for b in batches]),
        ("side", [b.side for b in batches]),
        ("group_value", [b.group for b in batches]),
    ):
        names.append(name)
        one = set(values)
        value = one.pop() if len(one) == 1 else None
        if isinstance(value, int):
            marks.append(str(operator.index(value)))
        elif isinstance(value, str) and (not value or _LITERAL_TEXT.fullmatch(value)):
            marks.append(f"'{value}'")
        else:
            marks.append("?")
            each = (itertools.repeat(v, len(b)) for v, b in zip(values, batches, strict=True))
            columns.append(pick(list(itertools.chain.from_iterable(each))))
    sql = f"INSERT INTO reports ({', '.join(names)}) VALUES ({', '.join(marks)})"
    return sql, zip(*columns, strict=True)


def content_rows(batches: list[ReportBatch]) -> list[tuple[bytes, str, str, bytes]]:
    """(report_id, survey_id, question_id, payload) of every report of the batches, in order."""
    return [
        row
        for b in batches
        for row in zip(
            b.report_ids,
            itertools.repeat(b.survey_id),
            itertools.repeat(b.question_id),
            b.payloads,
            strict=False,  # equal lengths: ReportStore._check; the rest repeat
        )
    ]


def outcomes(
    conn: sqlite3.Connection, rows: list[tuple], candidates: dict[int, list[int]]
) -> list[int]:
    """Per report row (report_id, survey_id, question_id, payload, ...): STORED if its id is
    neither in the log nor earlier in ``rows``; else DUPLICATE if that report has the same
    survey, question and payload, CONFLICT if not. ``candidates``: the log rows (``seq``) that
    may hold the id of row i (IdIndex.candidates); an id with none is not in the log."""
    wanted = {rows[i][0] for i in candidates}
    seqs = sorted({seq for found in candidates.values() for seq in found})
    seen = {
        report_id: content
        for report_id, content in contents_at(conn, seqs).items()
        if report_id in wanted
    }
    flags = []
    for report_id, survey_id, question_id, payload, *_ in rows:
        content = (survey_id, question_id, payload)
        known = seen.setdefault(report_id, content)
        if known is content:
            flags.append(STORED)
        else:
            flags.append(DUPLICATE if known == content else CONFLICT)
    return flags


def contents_at(
    conn: sqlite3.Connection, seqs: Sequence[int]
) -> dict[bytes, tuple[str, str, bytes]]:
    """report_id -> (survey_id, question_id, payload) of the log rows ``seqs``."""
    found: dict[bytes, tuple[str, str, bytes]] = {}
    for start in range(0, len(seqs), _IN_CHUNK):
        chunk = list(seqs[start : start + _IN_CHUNK])
        marks = ",".join("?" * len(chunk))
        sql = (
            f"SELECT report_id, survey_id, question_id, payload FROM reports WHERE seq IN ({marks})"
        )
        found.update((row[0], (row[1], row[2], row[3])) for row in conn.execute(sql, chunk))
    return found


def read_stored_ids(path: str | os.PathLike[str], report_ids: Sequence[bytes]) -> set[bytes]:
    """Which of ``report_ids`` the log in ``path`` holds (committed), from any process: one scan
    of the log per 999 ids (the id index lives in the writer's memory)."""
    with closing(read_only(os.fspath(path))) as conn:
        return _stored_ids(conn, report_ids)


def _stored_ids(conn: sqlite3.Connection, report_ids: Sequence[bytes]) -> set[bytes]:
    found: set[bytes] = set()
    for start in range(0, len(report_ids), _IN_CHUNK):
        chunk = list(report_ids[start : start + _IN_CHUNK])
        marks = ",".join("?" * len(chunk))
        sql = f"SELECT report_id FROM reports WHERE report_id IN ({marks})"
        found.update(row[0] for row in conn.execute(sql, chunk))
    return found
