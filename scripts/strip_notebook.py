"""Strip a notebook's outputs, execution counts and run metadata, so that git holds only its
source (docs/examples/*.ipynb are executed by tests/project/test_notebook.py, never committed run).

Usage: python scripts/strip_notebook.py NOTEBOOK...       strip in place
       python scripts/strip_notebook.py --check NOTEBOOK  exit 1 if any is not stripped
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

RUN_METADATA = ("execution", "collapsed", "scrolled")  # per cell, written by a run or a viewer
NOTEBOOK_RUN_METADATA = ("widgets", "varInspector")


def strip(notebook: nbformat.NotebookNode) -> bool:
    """Strip ``notebook`` in place; True if anything was removed."""
    changed = False
    for key in NOTEBOOK_RUN_METADATA:
        changed |= notebook.metadata.pop(key, None) is not None
    for cell in notebook.cells:
        for key in RUN_METADATA:
            changed |= cell.metadata.pop(key, None) is not None
        if cell.cell_type != "code":
            continue
        if cell.outputs or cell.execution_count is not None:
            cell.outputs, cell.execution_count = [], None
            changed = True
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="only report unstripped notebooks")
    args = parser.parse_args()
    dirty = []
    for path in args.notebooks:
        notebook = nbformat.read(path, as_version=nbformat.NO_CONVERT)
        if strip(notebook):
            dirty.append(path)
            if not args.check:
                nbformat.write(notebook, path)
    verb = "not stripped" if args.check else "stripped"
    for path in dirty:
        print(f"{verb}: {path}", file=sys.stderr if args.check else sys.stdout)
    return 1 if args.check and dirty else 0


if __name__ == "__main__":
    sys.exit(main())
