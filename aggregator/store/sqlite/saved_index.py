"""The report id index kept in the store file (SQLite), so a start need not index the whole
log: the index saved at a clean close (or periodically) read back with the log's rows after
it, or built from the log; the index saved whole, or its new entries appended.
(The index itself: aggregator/store/sqlite/id_index.py.)"""

from __future__ import annotations

import sqlite3

import numpy as np

from aggregator.store.errors import StoreError
from aggregator.store.model import REPORT_ID_BYTES
from aggregator.store.sqlite.connection import transaction
from aggregator.store.sqlite.id_index import SECRET_BYTES, IdIndex
from aggregator.store.sqlite.schema import ID_INDEX


def open_index(conn: sqlite3.Connection) -> tuple[IdIndex, int]:
    """The id index of the log and the last ``seq`` its saved part covers: the index saved at
    the last clean close or periodic save (``id_index``: part 0 its key and the last ``seq`` it
    covers, parts 1... its runs), plus the log's rows appended after it; else built from the
    whole log (covering nothing saved yet)."""
    header = None
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'id_index'").fetchone():
        header = conn.execute("SELECT secret, high_water FROM id_index WHERE part = 0").fetchone()
    last = max(conn.execute("SELECT max(seq) FROM reports").fetchone()[0] or 0, 0)
    if header is None or len(header[0] or b"") != SECRET_BYTES or header[1] > last:
        index = IdIndex()
        index_log(conn, index)
        return index, 0
    index = IdIndex(header[0])
    parts = conn.execute("SELECT hashes, seqs FROM id_index WHERE part > 0 ORDER BY part")
    runs = [(np.frombuffer(h, dtype="<u8"), np.frombuffer(s, dtype="<i8")) for h, s in parts]
    index.load(runs, header[1])
    index_log(conn, index, header[1])
    return index, header[1]


def save_index(conn: sqlite3.Connection, index: IdIndex, covered: int) -> None:
    """Keep ``index``'s entries of the log rows up to ``seq`` ``covered`` (the blocks before the
    current one, which no longer change) for the next start (on a clean close), which reads
    them and indexes the log's rows after them."""
    with transaction(conn):
        conn.execute(ID_INDEX)
        conn.execute("DELETE FROM id_index")
        conn.execute(
            "INSERT INTO id_index (part, secret, high_water) VALUES (0, ?, ?)",
            (index.secret, covered),
        )
        conn.executemany(
            "INSERT INTO id_index (part, hashes, seqs) VALUES (?, ?, ?)",
            (
                (
                    part,
                    hashes[seqs <= covered].astype("<u8").tobytes(),
                    seqs[seqs <= covered].astype("<i8").tobytes(),
                )
                for part, (hashes, seqs) in enumerate(index.export(), start=1)
            ),
        )


def save_index_entries(conn: sqlite3.Connection, index: IdIndex, saved: int, covered: int) -> None:
    """Append ``index``'s entries of the log rows ``saved < seq <= covered`` to the saved index
    as one more sorted part (the saved parts cover ``seq <= saved``), in one transaction."""
    hashes, seqs = index.entries_between(saved, covered)
    with transaction(conn):
        conn.execute(ID_INDEX)
        if saved == 0:  # nothing saved yet, or a save from an older start: begin afresh
            conn.execute("DELETE FROM id_index")
            conn.execute(
                "INSERT INTO id_index (part, secret, high_water) VALUES (0, ?, 0)", (index.secret,)
            )
        conn.execute(
            "INSERT INTO id_index (part, hashes, seqs) "
            "SELECT coalesce(max(part), 0) + 1, ?, ? FROM id_index",
            (hashes.astype("<u8").tobytes(), seqs.astype("<i8").tobytes()),
        )
        conn.execute("UPDATE id_index SET high_water = ? WHERE part = 0", (covered,))


def index_log(conn: sqlite3.Connection, index: IdIndex, after: int = 0) -> None:
    """Add the log's rows past ``seq`` ``after`` to ``index`` (at start: all of them), 65,536 at
    a time, each chunk's ids and seqs concatenated by SQLite (no Python object per row)."""
    factory, conn.text_factory = conn.text_factory, bytes
    try:
        while True:
            ids, seqs, count, last = conn.execute(_ID_CHUNK, (after, 1 << 16)).fetchone()
            if not count:
                return
            if len(ids) != REPORT_ID_BYTES * count:
                raise StoreError(f"the log holds a report id that is not {REPORT_ID_BYTES} bytes")
            numbers = np.frombuffer(bytes.fromhex(seqs.decode()), dtype=">i8").astype(np.int64)
            index.add(index.keys_of_joined(ids), numbers)
            after = last
    finally:
        conn.text_factory = factory


_ID_CHUNK = (
    "SELECT group_concat(report_id, ''), group_concat(printf('%016x', seq), ''), count(*),"
    " max(seq) FROM (SELECT seq, report_id FROM reports WHERE seq > ? ORDER BY seq LIMIT ?)"
)
