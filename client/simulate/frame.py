"""The sampling frame ``ldp-client simulate --design-keys`` gives simulated devices their keys from:
a CSV with a ``key`` column (a survey file's frame: ``key,stratum,psu,weight,...``), or one key
per line.

Besides the keys, the frame says which keys share a PSU (its ``stratum`` and ``psu`` columns),
so that ``--icc`` can cluster answers by PSU, and which group a key implies when the survey has a
group label: a column named after the label (``region``) gives each key's group, and a frame
whose strata are all group values (strata ``north``, ``south`` for a label with those values)
puts each key in its stratum's group. A simulated device then gets a key of its own group.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from client.survey import GroupLabel


class FrameError(ValueError):
    """A --design-keys file that cannot give simulated devices their keys."""


@dataclass(frozen=True)
class SimulationFrame:
    """The keys in file order; per key its PSU (stratum-qualified; None without a ``psu``
    column) and the group it implies (None when the frame implies no groups)."""

    keys: list[str]
    psus: list[tuple[str, str]] | None = None
    groups: list[str] | None = None

    def psu_index(self, keys: list[str]) -> list[int]:
        """Per given key the index of its PSU (PSUs numbered in order of first appearance)."""
        if self.psus is None:
            raise FrameError("the frame has no psu column")
        number: dict[tuple[str, str], int] = {}
        of_key = {
            key: number.setdefault(psu, len(number))
            for key, psu in zip(self.keys, self.psus, strict=True)
        }
        return [of_key[key] for key in keys]

    def draw(self, rng: np.random.Generator, groups: np.ndarray, values: list[str]) -> list[str]:
        """A key per device, uniform over the frame, or over the keys of the device's group
        (``values[groups[device]]``) when the frame implies groups."""
        if self.groups is None:
            return rng.choice(self.keys, size=groups.size).tolist()
        keys = np.empty(groups.size, dtype=object)
        for g, value in enumerate(values):
            members = np.flatnonzero(groups == g)
            pool = [key for key, of in zip(self.keys, self.groups, strict=True) if of == value]
            if members.size and not pool:
                raise FrameError(
                    f"no key of the --design-keys frame lies in group {value!r}: give it no "
                    "share (--group-share) or keys in the frame"
                )
            if members.size:
                keys[members] = rng.choice(pool, size=members.size)
        return [str(key) for key in keys]


def read_frame(path: Path, label: GroupLabel | None) -> SimulationFrame:
    """The frame at ``path``; ``label`` is the survey's group label (None: no groups)."""
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise FrameError(f"cannot read --design-keys {path}: {exc}") from None
    rows = list(csv.reader(line for line in lines if line.strip()))
    header = [cell.strip() for cell in rows[0]] if rows else []
    if "key" not in header:  # one key per line (or a CSV whose first column is the key)
        keys = [row[0].strip() for row in rows if row and row[0].strip()]
        if not keys:
            raise FrameError(f"--design-keys {path} lists no keys")
        return SimulationFrame(keys)
    column = header.index("key")
    rows = [row for row in rows[1:] if len(row) > column and row[column].strip()]
    if not rows:
        raise FrameError(f"--design-keys {path} lists no keys")
    keys = [_cell(row, header, "key") for row in rows]
    psus = (
        [(_cell(row, header, "stratum"), _cell(row, header, "psu")) for row in rows]
        if "psu" in header
        else None
    )
    return SimulationFrame(keys, psus, _groups(path, header, rows, label))


def _cell(row: list[str], header: list[str], column: str) -> str:
    """The row's value in ``column`` ('' when the frame has no such column or the row is short)."""
    if column not in header or header.index(column) >= len(row):
        return ""
    return row[header.index(column)].strip()


def _groups(
    path: Path, header: list[str], rows: list[list[str]], label: GroupLabel | None
) -> list[str] | None:
    """Per key the group the frame implies: from a column named after the group label, or the
    key's stratum when every stratum is a group value; None when the frame implies none."""
    if label is None:
        return None
    if label.name in header:
        groups = [_cell(row, header, label.name) for row in rows]
        for row, group in zip(rows, groups, strict=True):
            if group not in label.values:
                raise FrameError(
                    f"--design-keys {path}, key {_cell(row, header, 'key')!r}: {label.name} "
                    f"{group!r} is not one of the survey's ({', '.join(label.values)})"
                )
        return groups
    strata = [_cell(row, header, "stratum") for row in rows]
    if "stratum" in header and set(strata) <= set(label.values):
        return strata
    return None
