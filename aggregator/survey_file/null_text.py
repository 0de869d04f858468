"""A goodness-of-fit null as users write it, turned into one probability per category.

A question with hundreds of categories (occupations, places, apps) makes "one number per
category, comma-separated, in order" impractical and error-prone, so every place that takes a
null (``--p0`` in the CLI, ``p0`` in a survey file's analyses or a confirmatory plan) accepts:

* ``uniform``: 1/k for each category;
* numbers in category order (a list, or comma-separated text);
* a mapping from category label to probability, every label exactly once (``{great = 0.4, ...}``
  in TOML);
* on the command line, ``@path``: a text file with one ``label,probability`` line per category
  (any order; a tab or the last space also separates; ``#`` comments, blank lines and a header
  line allowed) or one probability per line in category order.

The result is checked here (length, labels, finite, non-negative, summing to 1 within
``TOLERANCE``), so a mistake is one message naming what is wrong, never a silently reordered null.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

TOLERANCE = 1e-9  # how far a written null may be from summing to 1


class NullTextError(ValueError):
    """A null that does not describe a distribution over the question's categories."""


def parse_null(value: object, labels: Sequence[str], name: str = "p0") -> tuple[float, ...]:
    """``value`` (``"uniform"``, a list of numbers, comma-separated text, a label mapping or
    ``"@path"``) as one probability per label, in the order of ``labels``."""
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == "uniform":
            return tuple(1.0 / len(labels) for _ in labels)
        if text.startswith("@"):
            return _from_file(Path(text[1:]), labels, name)
        return _checked(_numbers(text.split(","), name), labels, name)
    if isinstance(value, Mapping):
        return _checked(_by_label(dict(value), labels, name), labels, name)
    if isinstance(value, list | tuple):
        return _checked(_numbers(value, name), labels, name)
    raise NullTextError(
        f"{name} must be 'uniform', a list of probabilities or a table of label = probability"
    )


def _number(value: object, name: str) -> float:
    if isinstance(value, bool):
        raise NullTextError(f"{name}: {value!r} is not a probability")
    try:
        return float(value.strip() if isinstance(value, str) else value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise NullTextError(f"{name}: {value!r} is not a number") from None


def _numbers(values: Sequence[object], name: str) -> list[float]:
    return [_number(value, name) for value in values]


def _by_label(mapping: dict[object, object], labels: Sequence[str], name: str) -> list[float]:
    unknown = [str(label) for label in mapping if label not in labels]
    if unknown:
        raise NullTextError(f"{name}: no category named {', '.join(map(repr, unknown[:5]))}")
    missing = [label for label in labels if label not in mapping]
    if missing:
        shown = ", ".join(map(repr, missing[:5])) + (" ..." if len(missing) > 5 else "")
        raise NullTextError(f"{name}: no probability for {len(missing)} categories: {shown}")
    return [_number(mapping[label], f"{name} ({label})") for label in labels]


def _from_file(path: Path, labels: Sequence[str], name: str) -> tuple[float, ...]:
    where = f"{name} file {path}"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise NullTextError(f"{where}: cannot be read ({exc})") from None
    rows = [line.split("#", 1)[0].strip() for line in lines]
    rows = [row for row in rows if row]
    if not rows:
        raise NullTextError(f"{where}: holds no probabilities")
    split = [[token for token in re.split(r"[,\s]+", row) if token] for row in rows]
    labelled = len(rows) > 1 and all(len(tokens) == 2 for tokens in split)
    if not labelled and all(_is_number(token) for tokens in split for token in tokens):
        # numbers only: category order. Two fields on every line are a label and its
        # probability, even when the labels look like numbers (Likert "1" .. "5").
        return _checked(_numbers([t for tokens in split for t in tokens], where), labels, where)
    pairs = [_split_pair(row) for row in rows]
    if pairs[0][0] is not None and not _is_number(pairs[0][1]):
        pairs = pairs[1:]  # a header line such as "category,p0"
    mapping: dict[object, object] = {}
    for number, (label, value) in enumerate(pairs, start=1):
        if label is None:
            raise NullTextError(f"{where}: line {number} has no label ({value!r})")
        if label in mapping:
            raise NullTextError(f"{where}: category {label!r} is listed twice")
        mapping[label] = value
    return _checked(_by_label(mapping, labels, where), labels, where)


def _split_pair(row: str) -> tuple[str | None, str]:
    """``label,value`` (or tab / last whitespace): (label, value); a bare value: (None, row)."""
    for separator in (",", "\t"):
        if separator in row:
            label, value = row.rsplit(separator, 1)
            return label.strip(), value.strip()
    if _is_number(row):
        return None, row
    label, _, value = row.rpartition(" ")
    return (label.strip() or None), value.strip()


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _checked(values: list[float], labels: Sequence[str], name: str) -> tuple[float, ...]:
    if len(values) != len(labels):
        raise NullTextError(
            f"{name} has {len(values)} probabilities; the question has {len(labels)} categories"
        )
    if not all(math.isfinite(x) and x >= 0 for x in values):
        raise NullTextError(f"{name} must contain finite non-negative numbers")
    total = math.fsum(values)
    if abs(total - 1.0) > TOLERANCE:
        raise NullTextError(f"{name} must sum to 1 (within {TOLERANCE:g}), sums to {total:.12g}")
    return tuple(values)
