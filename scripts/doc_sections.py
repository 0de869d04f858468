"""Generated tables in docs/*.md live between ``<!-- name:start -->`` and ``<!-- name:end -->``:
a script rewrites its own section and leaves every other one alone."""

from __future__ import annotations

import re
from pathlib import Path

SECTION = re.compile(r"<!-- ([\w-]+):start -->.*?<!-- \1:end -->", re.DOTALL)


def write_section(path: Path, section: str) -> None:
    """Put ``section`` (its first line ``<!-- name:start -->``) in place of the section of the
    same name in ``path``, or append it."""
    match = SECTION.match(section)
    if match is None:
        raise ValueError("a section starts with <!-- name:start --> and ends with its end mark")
    name = match.group(1)
    text = path.read_text() if path.exists() else ""
    mark = re.escape(name)  # searched by name: a section may sit inside another one
    old = re.search(rf"<!-- {mark}:start -->.*?<!-- {mark}:end -->", text, re.DOTALL)
    if old is None:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    else:
        text = text[: old.start()] + section + text[old.end() :]
    path.write_text(text)


def kept_sections(path: Path) -> list[str]:
    """Every marked section of ``path`` (for a script that rewrites the rest of the file)."""
    text = path.read_text() if path.exists() else ""
    return [m.group(0) for m in SECTION.finditer(text)]
