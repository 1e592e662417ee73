"""``--check``: does a committed notebook still match its source (nbdev's rule: the two never drift)?"""

from __future__ import annotations

import nbformat

from . import paths
from .notebook import committed_and_rebuilt


def sources_of(nb: nbformat.NotebookNode) -> list[tuple[str, str, list[str], str]]:
    """What must not drift: each cell's type, source, tags and slide type."""
    rows = []
    for cell in nb.cells:
        meta = cell.get("metadata", {})
        slide_type = meta.get("slideshow", {}).get("slide_type", "")
        rows.append((cell.cell_type, cell.source, list(meta.get("tags", [])), slide_type))
    return rows


def check(stem: str) -> int:
    """1 (and a DRIFT line) when the committed notebook is missing, or differs from what its source builds now."""
    committed, rebuilt = committed_and_rebuilt(stem)
    if rebuilt is None or sources_of(committed) != sources_of(rebuilt):
        print(f"DRIFT: {paths.shown(paths.notebook(stem))} differs from notebooks/src/{stem}.py; rebuild it")
        return 1
    return 0
