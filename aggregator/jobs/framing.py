"""Split the bytes of a report shard into records, a block at a time, without a Python loop per
record in the common case.

A shard body is ``varint length | record`` repeated (docs/shard-format.md). Record boundaries are
inherently sequential, so the fast path guesses them and then proves the guess: every canonical
``ldp.v1.Report`` starts with the report-id field (tag ``0x0a``, length ``0x10``), so candidate
starts are the positions holding a one-byte length followed by those two bytes. Candidates that
no other candidate points to are dropped, and the survivors are accepted only if they form one
unbroken chain from the start of the block, which is exactly what a sequential parse would find.
Anything else (long records, other encoders, a random id that happens to look like a header)
falls back to the sequential parse, so the result never depends on the guess.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from aggregator.store.shards import (
    HEADER,
    ShardFormatError,
    check_header,
    decode_length,
)

REPORT_ID_TAG = 0x0A
REPORT_ID_LENGTH = 0x10
DEFAULT_BLOCK_BYTES = 16 << 20


class ByteReader(Protocol):
    """What ``iter_blocks`` reads from: a binary file, or a wrapper of one (the pipeline's
    hashing reader)."""

    def read(self, size: int, /) -> bytes: ...


@dataclass(frozen=True)
class Block:
    """Complete records of a block: ``data[starts[i] : starts[i] + lengths[i]]`` is record i."""

    data: np.ndarray  # uint8
    starts: np.ndarray  # int64
    lengths: np.ndarray  # int64

    def __len__(self) -> int:
        return int(self.starts.size)


def iter_blocks(
    file: ByteReader, name: str, block_bytes: int = DEFAULT_BLOCK_BYTES
) -> Iterator[Block]:
    """Read a shard file (header included) as blocks of whole records."""
    check_header(file.read(len(HEADER)), name)
    carry = b""
    while True:
        chunk = file.read(block_bytes)
        if not chunk:
            break
        block, carry = split_records(carry + chunk, name)
        if len(block):
            yield block
    if carry:
        raise ShardFormatError(f"{name}: truncated record at the end of the shard")


def split_records(buffer: bytes, name: str) -> tuple[Block, bytes]:
    """The complete records at the start of ``buffer`` and the unfinished tail after them."""
    data = np.frombuffer(buffer, dtype=np.uint8)
    framed = _split_fast(data)
    if framed is None:
        framed = _split_sequential(buffer, name)
    starts, lengths, tail = framed
    return Block(data, starts, lengths), buffer[tail:]


def _split_fast(data: np.ndarray) -> tuple[np.ndarray, np.ndarray, int] | None:
    """Vectorized framing of canonical records, or None when it cannot be proven right."""
    size = data.size
    if size < 3:
        return None
    candidates = np.flatnonzero(
        (data[:-2] < 0x80) & (data[1:-1] == REPORT_ID_TAG) & (data[2:] == REPORT_ID_LENGTH)
    )
    if candidates.size == 0 or candidates[0] != 0:
        return None
    following = candidates + 1 + data[candidates].astype(np.int64)
    target = np.zeros(size + 0x80, dtype=bool)  # a one-byte length reaches at most 128 ahead
    target[following] = True
    pointed_to = target[candidates]
    pointed_to[0] = True
    starts = candidates[pointed_to]
    ends = following[pointed_to]
    if not np.array_equal(ends[:-1], starts[1:]):
        return None
    last_end = int(ends[-1])
    if last_end > size:  # the last record continues in the next block
        tail = int(starts[-1])
        starts, ends = starts[:-1], ends[:-1]
    elif size - last_end <= 2:  # too short to show a candidate: a partial length prefix at most
        tail = last_end
    else:
        return None
    return starts + 1, ends - starts - 1, tail


def _split_sequential(buffer: bytes, name: str) -> tuple[np.ndarray, np.ndarray, int]:
    """Record-by-record framing of any valid shard body (the fallback)."""
    starts: list[int] = []
    lengths: list[int] = []
    position, size = 0, len(buffer)
    while position < size:
        prefix = decode_length(buffer, position, name)
        if prefix is None:
            return _arrays(starts, lengths, position)
        length, cursor = prefix
        if cursor + length > size:
            return _arrays(starts, lengths, position)
        starts.append(cursor)
        lengths.append(length)
        position = cursor + length
    return _arrays(starts, lengths, position)


def _arrays(starts: list[int], lengths: list[int], tail: int) -> tuple[np.ndarray, np.ndarray, int]:
    return np.array(starts, dtype=np.int64), np.array(lengths, dtype=np.int64), tail
