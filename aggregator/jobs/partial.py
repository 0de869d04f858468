"""The job's per-question sufficient statistic: a mergeable (n, int64 sums) plus deduplication
counts, built from whole matrices of payloads with the service's own decoding."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aggregator.store.ingest import decode_payloads, sum_decoded
from client.survey import QuestionSpec

_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Partial:
    """``n`` reports counted once each with int64 ``sums`` (the store's statistic), plus
    ``duplicates`` (extra copies dropped) and ``conflicts`` (ids whose copies differed)."""

    n: int
    sums: np.ndarray
    duplicates: int = 0
    conflicts: int = 0

    @classmethod
    def zero(cls, k: int) -> Partial:
        return cls(0, np.zeros(k, dtype=np.int64))

    @classmethod
    def of_payloads(
        cls, question: QuestionSpec, payloads: np.ndarray, duplicates: int = 0, conflicts: int = 0
    ) -> Partial:
        """Validate and sum a (m, payload_size) matrix of one question's payloads."""
        decoded = decode_payloads(question, payloads)
        return cls(len(payloads), sum_decoded(question, decoded), duplicates, conflicts)

    def __add__(self, other: Partial) -> Partial:
        if self.sums.shape != other.sums.shape:
            raise ValueError("cannot merge statistics of questions with different k")
        total = [int(a) + int(b) for a, b in zip(self.sums, other.sums, strict=True)]
        if any(abs(x) > _INT64_MAX for x in total):
            raise OverflowError("question sums overflow int64")
        return Partial(
            self.n + other.n,
            np.array(total, dtype=np.int64),
            self.duplicates + other.duplicates,
            self.conflicts + other.conflicts,
        )
