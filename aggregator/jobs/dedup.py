"""Count every report id once when shards may overlap (exports of several aggregators, or the same
export read twice).

Reports are routed by a hash partition of their id, so all copies of an id meet in the same
partition whichever shards they came from; each partition is then deduplicated in memory with
one sort. Among copies of an id the job keeps the one with the smallest (question, payload
digest), a choice that does not depend on shard order, so reruns give identical results. Copies
that differ in question or payload are counted as conflicts, which the results report.
"""

from __future__ import annotations

import numpy as np

from aggregator.jobs.records import QuestionKey, QuestionRecords

_MIX = np.uint64(0x9E3779B97F4A7C15)  # an odd 64-bit constant (golden ratio) for the digest


def partition_of(ids: np.ndarray, partitions: int) -> np.ndarray:
    """Partition index of each id (m, 16); uses bytes 8..15, independent of the export's shard
    choice (bytes 0..7), so every partition receives reports from every shard."""
    tail = np.ascontiguousarray(ids[:, 8:16]).view("<u8").reshape(-1)
    return (tail % np.uint64(partitions)).astype(np.int64)


def split_by_partition(
    records: list[QuestionRecords], partitions: int
) -> dict[int, list[QuestionRecords]]:
    """The records of each non-empty partition."""
    out: dict[int, list[QuestionRecords]] = {}
    for part in records:
        index = partition_of(part.ids, partitions)
        for p in np.unique(index):
            chosen = index == p
            out.setdefault(int(p), []).append(
                QuestionRecords(part.key, part.ids[chosen], part.payloads[chosen])
            )
    return out


def deduplicate(
    records: list[QuestionRecords],
) -> tuple[list[QuestionRecords], dict[QuestionKey, tuple[int, int]]]:
    """Keep one copy of every id. Returns the kept records per question and, per question of the
    kept copy, (extra copies dropped, ids with differing copies)."""
    records = [r for r in records if len(r)]
    if not records:
        return [], {}
    keys = sorted({r.key for r in records})
    question = np.concatenate([np.full(len(r), keys.index(r.key)) for r in records])
    digest = np.concatenate([_digest(r.payloads) for r in records])
    ids = np.ascontiguousarray(np.concatenate([r.ids for r in records])).view("<u8")
    order = np.lexsort((digest, question, ids[:, 1], ids[:, 0]))
    sorted_ids = ids[order]
    first = np.ones(order.size, dtype=bool)
    first[1:] = (sorted_ids[1:] != sorted_ids[:-1]).any(axis=1)
    differs = np.zeros(order.size, dtype=bool)
    differs[1:] = (question[order][1:] != question[order][:-1]) | (
        digest[order][1:] != digest[order][:-1]
    )
    group_starts = np.flatnonzero(first)
    copies = np.diff(np.append(group_starts, order.size))
    conflicted = np.add.reduceat((differs & ~first).astype(np.int64), group_starts) > 0
    kept_question = question[order[group_starts]]
    keep = np.zeros(order.size, dtype=bool)
    keep[order[group_starts]] = True

    counts: dict[QuestionKey, tuple[int, int]] = {}
    for index, key in enumerate(keys):
        mine = kept_question == index
        counts[key] = (int((copies[mine] - 1).sum()), int(conflicted[mine].sum()))
    kept: list[QuestionRecords] = []
    offset = 0
    for r in records:
        mask = keep[offset : offset + len(r)]
        offset += len(r)
        kept.append(QuestionRecords(r.key, r.ids[mask], r.payloads[mask]))
    return kept, counts


def _digest(payloads: np.ndarray) -> np.ndarray:
    """A 64-bit digest per payload row (equal rows, equal digests)."""
    width = -(-payloads.shape[1] // 8) * 8
    padded = np.zeros((payloads.shape[0], width), dtype=np.uint8)
    padded[:, : payloads.shape[1]] = payloads
    words = padded.view("<u8")
    digest = np.full(payloads.shape[0], np.uint64(payloads.shape[1]), dtype=np.uint64)
    for column in words.T:
        digest = (digest ^ column) * _MIX
        digest ^= digest >> np.uint64(29)
    return digest
