"""Results of validation rows kept in a JSON file, so that a long grid can be run a few rows at
a time (each row with its own seed) and its generated doc section rebuilt from every row."""

from __future__ import annotations

import json
from pathlib import Path


def merge_rows(path: Path, rows: dict[str, dict]) -> dict[str, dict]:
    """Store ``rows`` (key -> result) in ``path`` over the rows of the same keys, and return
    every stored row."""
    stored = json.loads(path.read_text()) if path.exists() else {}
    stored.update(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    return stored
