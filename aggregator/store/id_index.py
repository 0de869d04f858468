"""Which report ids the report log holds, in memory: the duplicate check of the writer, kept apart
from the log so that the log's writes stay sequential (docs/performance.md, "As the report log
grows").

Each stored report is one entry: a 64-bit keyed hash of its 16-byte id and the log row (``seq``)
that holds it, 16 bytes a report. A hit is only a candidate: the writer confirms it against the
log row by comparing the whole id, so answers stay exact whatever the hash does, and no id is
ever missed (every stored id has an entry). The hash is keyed with a secret drawn at start, so a
device that chooses its ids cannot make them collide on purpose and turn each check into many
row reads.

The entries are kept as a few sorted runs (numpy arrays, never changed once built), like the
levels of an LSM tree: a commit adds one small run, and runs of similar size are merged (a merge
of two sorted runs is one linear pass of numpy's stable sort), so there are about log2(n / m)
runs for n entries added m at a time, and a lookup of a commit's ids is one ``searchsorted`` per
run. Readers on other threads look up a snapshot of the run list: runs are immutable.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

import numpy as np

ID_BYTES = 16
_U64 = np.dtype(np.uint64)
_KEY_WORDS = 5
SECRET_BYTES = 8 * 2 * _KEY_WORDS
#: Runs stop growing here (32 MiB of entries), so a merge never holds more than two such runs
#: and their copy: lookups cost one ``searchsorted`` more per 2^21 entries past it.
MAX_RUN = 2**21


class IdIndex:
    """Keyed 64-bit hashes of report ids -> log row numbers, exact on confirmation."""

    def __init__(self, key: bytes | None = None) -> None:
        secret = os.urandom(SECRET_BYTES) if key is None else key
        if len(secret) != SECRET_BYTES:
            raise ValueError(f"the key is {SECRET_BYTES} bytes")
        self.secret = secret
        words = np.frombuffer(secret, dtype="<u8").astype(_U64)
        self._a, self._b = words[:_KEY_WORDS], words[_KEY_WORDS:]
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []
        self._lock = threading.Lock()  # one adder at a time; lookups read a snapshot
        self.high_water = 0  # the largest log row number ever added

    def __len__(self) -> int:
        return sum(len(keys) for keys, _ in self._runs)

    @property
    def nbytes(self) -> int:
        """Memory held by the entries."""
        return sum(keys.nbytes + rows.nbytes for keys, rows in self._runs)

    @property
    def runs(self) -> int:
        return len(self._runs)

    def keys(self, report_ids: Iterable[bytes]) -> np.ndarray:
        """The keyed hashes (uint64) of 16-byte ids, vectorized: two independent
        pair-multiply-shift hashes over the id's four 32-bit words (Thorup, "High speed hashing
        for integers and strings", 2-universal: two given ids collide with probability about
        2^-62 over the secret), high halves concatenated."""
        return self.keys_of_joined(b"".join(report_ids))

    def keys_of_joined(self, raw: bytes) -> np.ndarray:
        """:meth:`keys` of ids given as one string of 16-byte ids."""
        if len(raw) % ID_BYTES:
            raise ValueError(f"report ids must be {ID_BYTES} bytes")
        words = np.frombuffer(raw, dtype="<u4").reshape(-1, 4).astype(_U64)
        return (self._half(words, self._a) & np.uint64(0xFFFFFFFF00000000)) | (
            self._half(words, self._b) >> np.uint64(32)
        )

    @staticmethod
    def _half(words: np.ndarray, a: np.ndarray) -> np.ndarray:
        x1, x2, x3, x4 = words[:, 0], words[:, 1], words[:, 2], words[:, 3]
        with np.errstate(over="ignore"):
            return (a[0] + x2) * (a[1] + x1) + (a[2] + x4) * (a[3] + x3) + a[4]

    def candidates(self, keys: np.ndarray) -> dict[int, list[int]]:
        """For each position i of ``keys`` whose key is indexed, the log rows holding that key
        (almost always one row: the id itself; another id only on a hash collision)."""
        found: dict[int, list[int]] = {}
        if not len(keys):
            return found
        order = np.argsort(keys, kind="stable")  # sorted needles: numpy's search then walks each
        ordered = keys[order]  # run forward (half the cache misses of a random order)
        for run_keys, run_rows in list(self._runs):
            right = np.searchsorted(run_keys, ordered, side="right")
            before = np.maximum(right - 1, 0)
            hit = (right > 0) & (run_keys[before] == ordered)
            for j in np.flatnonzero(hit).tolist():
                end = int(right[j])
                start = int(np.searchsorted(run_keys, ordered[j], side="left"))
                found.setdefault(int(order[j]), []).extend(run_rows[start:end].tolist())
        return found

    def export(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The sorted runs (hashes, rows), to save; :meth:`load` takes them back."""
        return list(self._runs)

    def entries_between(self, after: int, through: int) -> tuple[np.ndarray, np.ndarray]:
        """The entries of log rows ``after < row <= through``, sorted by hash (one run)."""
        picked = [
            (keys[mask], rows[mask])
            for keys, rows in list(self._runs)
            for mask in [(rows > after) & (rows <= through)]
        ]
        keys = np.concatenate([k for k, _ in picked] or [np.empty(0, _U64)])
        rows = np.concatenate([r for _, r in picked] or [np.empty(0, np.int64)])
        order = np.argsort(keys, kind="stable")
        return keys[order], rows[order]

    def load(self, runs: list[tuple[np.ndarray, np.ndarray]], high_water: int) -> None:
        """Start from saved runs (each sorted by hash), made with this index's key."""
        with self._lock:
            self._runs = [(np.asarray(k, dtype=_U64), np.asarray(r, np.int64)) for k, r in runs]
            self.high_water = high_water

    def add(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Index log rows ``rows`` (int64) holding the ids of hashes ``keys``."""
        if not len(keys):
            return
        keys = np.asarray(keys, dtype=_U64)
        rows = np.asarray(rows, dtype=np.int64)
        order = np.argsort(keys, kind="stable")
        with self._lock:
            runs = list(self._runs)
            runs.append((keys[order], rows[order]))
            while (
                len(runs) > 1
                and len(runs[-2][0]) <= 2 * len(runs[-1][0])
                and len(runs[-2][0]) + len(runs[-1][0]) <= MAX_RUN
            ):
                runs[-2:] = [_merge(runs[-2], runs[-1])]
            self._runs = runs  # one assignment: readers see the old list or the new one
            self.high_water = max(self.high_water, int(rows.max()))


def _merge(
    first: tuple[np.ndarray, np.ndarray], second: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Two sorted runs as one, in one linear pass (no sort, no index array of the whole)."""
    (k1, r1), (k2, r2) = first, second
    size = len(k1) + len(k2)
    at = np.searchsorted(k1, k2, side="right") + np.arange(len(k2))  # where k2's entries go
    from_second = np.zeros(size, dtype=bool)
    from_second[at] = True
    keys = np.empty(size, dtype=_U64)
    rows = np.empty(size, dtype=np.int64)
    keys[at], rows[at] = k2, r2
    keys[~from_second], rows[~from_second] = k1, r1
    return keys, rows
