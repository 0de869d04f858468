"""Which report ids the report log holds, in memory: the duplicate check of the writer, kept apart
from the log so that the log's writes stay sequential (docs/performance.md, "As the report log
grows").

Each stored report is one entry: a 64-bit keyed hash of its 16-byte id and the log row (``seq``)
that holds it. A hit is only a candidate: the writer confirms it against the log row by comparing
the whole id, so answers stay exact whatever the hash does, and no id is ever missed (every
stored id has an entry). The hash is keyed with a secret drawn at start, so a device that
chooses its ids cannot make them collide on purpose and turn each check into many row reads.

The entries live in one open-addressing table of buckets of 16 slots (linear probing over
the buckets, no wrap-around: a short spare tail past the last home bucket), whose home bucket
for a hash is its top bits: a lookup reads one bucket (two cache lines), now and then the next, an
insert writes one, whatever the table's size, so the cost per report stays flat as the log grows
(sorted runs searched by bisection cost a cache miss per level, and more levels and runs as the
log grew). A commit's ids are looked up and inserted vectorized (numpy), one bucket step for all
of them at a time. The table doubles when it is more than 80 % full: its entries, taken in slot
order, are almost sorted by hash and are placed again in one pass. Readers on other threads
probe a snapshot: a bucket's slots fill in order and its fill count is raised after them, and a
grown table replaces the old one in one assignment.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

ID_BYTES = 16
_U64 = np.dtype(np.uint64)
_KEY_WORDS = 5
SECRET_BYTES = 8 * 2 * _KEY_WORDS
_WIDTH = 16  # slots per bucket
_MIN_BITS = 9  # home buckets of the smallest table: 2^9 buckets, 4,096 slots
_SPARE = 64  # buckets past the last home bucket, so that probing never wraps around
_LOAD = 0.8  # the table doubles past this share of taken home slots
_SLOTS = np.arange(_WIDTH)
_FEW = 16  # a probe that still runs for fewer entries than this goes on one entry at a time
_NO_KEYS, _NO_ROWS = np.empty(0, _U64), np.empty(0, np.int64)
_NARROW = np.dtype(np.uint32)  # log rows below 2^32 take 4 bytes a slot (12 with the hash)
_NARROW_MAX = 2**32 - 1


@dataclass(frozen=True)
class _Table:
    """Buckets of _WIDTH slots: hashes, log rows, and how many slots of each bucket are taken
    (they fill from the first); ``bits``: home buckets are the top ``bits`` bits of a hash."""

    bits: int
    keys: np.ndarray  # (buckets, _WIDTH) uint64
    rows: np.ndarray  # (buckets, _WIDTH) uint32 while every row fits, else int64
    fill: np.ndarray  # (buckets,) int64

    @classmethod
    def empty(cls, bits: int, buckets: int, last_row: int = 0) -> _Table:
        return cls(
            bits,
            np.zeros((buckets, _WIDTH), dtype=_U64),
            np.zeros((buckets, _WIDTH), dtype=_NARROW if last_row <= _NARROW_MAX else np.int64),
            np.zeros(buckets, dtype=np.int64),
        )

    def home(self, keys: np.ndarray) -> np.ndarray:
        return _home(keys, self.bits)

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """The taken slots' (hashes, rows), in slot order."""
        taken = self.fill[:, None] > _SLOTS
        return self.keys[taken], self.rows[taken]


class IdIndex:
    """Keyed 64-bit hashes of report ids -> log row numbers, exact on confirmation."""

    def __init__(self, key: bytes | None = None) -> None:
        secret = os.urandom(SECRET_BYTES) if key is None else key
        if len(secret) != SECRET_BYTES:
            raise ValueError(f"the key is {SECRET_BYTES} bytes")
        self.secret = secret
        words = np.frombuffer(secret, dtype="<u8").astype(_U64)
        self._a, self._b = words[:_KEY_WORDS], words[_KEY_WORDS:]
        self._table = _Table.empty(_MIN_BITS, (1 << _MIN_BITS) + _SPARE)
        self._count = 0
        self._recent: list[tuple[np.ndarray, np.ndarray]] = []  # added since the last drain
        self._lock = threading.Lock()  # one adder at a time; lookups read a snapshot
        self.high_water = 0  # the largest log row number ever added

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        """Memory held by the table: 12 bytes a slot (20 past 2^32 log rows), 1.25 to 2.5
        slots an entry once past the smallest table."""
        table = self._table
        return table.keys.nbytes + table.rows.nbytes + table.fill.nbytes

    @property
    def runs(self) -> int:
        """Sorted runs to search (one table: kept for the figures of the growth benchmark)."""
        return 1

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
        keys = np.asarray(keys, dtype=_U64)
        table = self._table  # a snapshot: a grown table is a new object
        active = np.arange(len(keys))
        where = table.home(keys)
        while len(active) >= _FEW:
            fill = table.fill.take(where)  # take: several times faster than fancy indexing
            match = table.keys.take(where, axis=0) == keys[active, None]
            if match.any():
                at, slot = np.nonzero(match)
                taken = slot < fill[at]  # a free slot holds hash 0
                at, slot = at[taken], slot[taken]
                rows = table.rows.reshape(-1).take(where[at] * _WIDTH + slot)
                for i, row in zip(active[at].tolist(), rows.tolist(), strict=True):
                    found.setdefault(i, []).append(row)
            full = fill == _WIDTH  # an entry of this home may sit in the next bucket
            active, where = active[full], where[full] + 1
        for i, bucket in zip(active.tolist(), where.tolist(), strict=True):  # the last few
            key = int(keys[i])
            while True:
                taken_slots = int(table.fill[bucket])
                for j in range(taken_slots):
                    if int(table.keys[bucket, j]) == key:
                        found.setdefault(i, []).append(int(table.rows[bucket, j]))
                if taken_slots < _WIDTH:
                    break
                bucket += 1
        return found

    def export(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The entries (hashes, rows) as one run sorted by hash, to save (the saved form of
        the sorted runs before this table: stores stay readable both ways); :meth:`load` takes
        them back. Slot order is almost hash order already, so the sort is one quick pass."""
        keys, rows = self._table.entries()
        order = np.argsort(keys, kind="stable")
        return [(keys[order], rows[order].astype(np.int64))]

    def entries_between(self, after: int, through: int) -> tuple[np.ndarray, np.ndarray]:
        """The entries of log rows ``after < row <= through`` among those added since the last
        :meth:`forget_through` (all of them, if never), sorted by hash: one part to save."""
        with self._lock:
            recent = list(self._recent)
        keys = np.concatenate([k for k, _ in recent] or [np.empty(0, _U64)])
        rows = np.concatenate([r for _, r in recent] or [np.empty(0, np.int64)])
        picked = (rows > after) & (rows <= through)
        keys, rows = keys[picked], rows[picked]
        order = np.argsort(keys, kind="stable")
        return keys[order], rows[order]

    def forget_through(self, through: int) -> None:
        """The entries of log rows up to ``through`` are saved: keep only the later ones for
        :meth:`entries_between` (so a save never scans the whole table)."""
        with self._lock:
            kept = [(k[r > through], r[r > through]) for k, r in self._recent]
            self._recent = [(k, r) for k, r in kept if len(k)]

    def load(self, runs: list[tuple[np.ndarray, np.ndarray]], high_water: int) -> None:
        """Start from saved entries (parts of hashes and rows), made with this index's key."""
        if len(runs) == 1:  # the save of a clean close: no copy
            keys, rows = np.asarray(runs[0][0], dtype=_U64), np.asarray(runs[0][1], np.int64)
        else:
            keys = np.concatenate([np.asarray(k, dtype=_U64) for k, _ in runs] or [_NO_KEYS])
            rows = np.concatenate([np.asarray(r, dtype=np.int64) for _, r in runs] or [_NO_ROWS])
        with self._lock:
            self._rebuild(keys, rows, len(keys))
            self.high_water = high_water

    def add(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Index log rows ``rows`` (int64, >= 0) holding the ids of hashes ``keys``."""
        if not len(keys):
            return
        keys = np.asarray(keys, dtype=_U64)
        rows = np.asarray(rows, dtype=np.int64)
        with self._lock:
            self._recent.append((keys, rows))
            count = self._count + len(keys)
            table = self._table
            rest = np.arange(len(keys))  # all of them go into a bigger (or wider) table
            fits = table.rows.dtype != _NARROW or int(rows.max()) <= _NARROW_MAX
            if fits and count <= _LOAD * _WIDTH * (1 << table.bits):  # else the ones that would
                rest = _insert(table, keys, rows)  # run past the spare tail (almost surely none)
            if len(rest):
                old_keys, old_rows = table.entries()
                self._rebuild(
                    np.concatenate((old_keys, keys[rest])),
                    np.concatenate((old_rows, rows[rest])),
                    count,
                )
            self._count = count
            self.high_water = max(self.high_water, int(rows.max()))

    def _rebuild(self, keys: np.ndarray, rows: np.ndarray, count: int) -> None:
        """A new table for these entries: the smallest at most _LOAD full, filled in one pass
        over the entries sorted by hash (each goes to the first slot at or after its home
        bucket's first that the entries before it left free). Replaces the table in one
        assignment."""
        bits = _MIN_BITS
        while count > _LOAD * _WIDTH * (1 << bits):
            bits += 1
        if len(keys) > 1 and not np.all(keys[:-1] <= keys[1:]):  # one saved run is sorted
            order = np.argsort(keys, kind="stable")  # almost sorted: taken in slot order
            keys, rows = keys[order], rows[order]
            del order
        slots = _home(keys, bits)  # in place from here: 10^7 entries are 80 MB an array
        slots *= _WIDTH
        steps = np.arange(len(keys), dtype=np.int64)
        slots -= steps
        np.maximum.accumulate(slots, out=slots)
        slots += steps
        del steps
        used = int(slots[-1]) // _WIDTH + 1 if len(slots) else 0
        buckets = max(1 << bits, used) + _SPARE
        table = _Table.empty(bits, buckets, int(rows.max()) if len(rows) else 0)
        table.keys.reshape(-1).put(slots, keys)
        table.rows.reshape(-1).put(slots, rows)
        slots //= _WIDTH
        table.fill[:] = np.bincount(slots, minlength=buckets)
        self._table, self._count = table, count


def _home(keys: np.ndarray, bits: int) -> np.ndarray:
    """The home bucket of each hash: its top ``bits`` bits (bucket order is hash order)."""
    return (keys >> np.uint64(64 - bits)).astype(np.int64)


def _insert(table: _Table, keys: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Put the entries into the first free slot of their home bucket or, if it is full, of the
    next buckets, all of them one bucket step at a time (several for one bucket take its free
    slots in order). Returns the positions of the entries not placed: none, unless one would
    run past the spare tail (the caller then rebuilds with them)."""
    pending = np.arange(len(keys))
    where = table.home(keys)
    end = len(table.fill)
    while len(pending) >= _FEW:
        order = np.argsort(where)  # groups by bucket (a stable sort is three times slower)
        pending, where = pending[order], where[order]
        if int(where[-1]) >= end:
            return pending
        steps = np.arange(len(pending))
        first = np.ones(len(pending), dtype=bool)
        first[1:] = where[1:] != where[:-1]
        rank = steps - np.maximum.accumulate(np.where(first, steps, 0))  # place in its group
        slot = table.fill.take(where) + rank
        fits = slot < _WIDTH
        at = where[fits] * _WIDTH + slot[fits]  # flat slot numbers: put is several times faster
        table.keys.reshape(-1).put(at, keys[pending[fits]])  # than 2-d fancy assignment
        table.rows.reshape(-1).put(at, rows[pending[fits]])
        last = np.ones(len(pending), dtype=bool)  # the last of each bucket's group
        last[:-1] = first[1:]
        table.fill[where[last]] = np.minimum(slot[last] + 1, _WIDTH)  # after the slots
        pending, where = pending[~fits], where[~fits] + 1
    fill, flat_keys, flat_rows = table.fill, table.keys.reshape(-1), table.rows.reshape(-1)
    for n, (i, bucket) in enumerate(zip(pending.tolist(), where.tolist(), strict=True)):
        while bucket < end and fill[bucket] == _WIDTH:  # the last few, one at a time
            bucket += 1
        if bucket == end:
            return pending[n:]
        flat_keys[bucket * _WIDTH + fill[bucket]] = keys[i]
        flat_rows[bucket * _WIDTH + fill[bucket]] = rows[i]
        fill[bucket] += 1
    return pending[:0]
