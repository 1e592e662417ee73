"""One notebook built from its source: the header stamped (study time, Colab badge, prev/next links), stable cell
ids, slide types, and the outputs of an executed copy carried over while its code is unchanged."""

from __future__ import annotations

from pathlib import Path

import nbformat
from notebook_layout import stamp_slides, study_minutes, time_line

from course_utils import about

from . import paths
from .source import parse_source

COLAB_BADGE = "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"


class CodeChanged(Exception):
    """A code cell's source or tags differ from the executed notebook: its outputs would be stale."""


def stamp_header(index: int) -> str:
    """Badge and prev/next links for notebook number ``index`` in :data:`about.NOTEBOOKS`."""
    nbs = about.NOTEBOOKS
    badge = f"{COLAB_BADGE}({about.colab_url(nbs[index].filename)})"
    if index > 0:
        prev_link = f"← Previous: [{nbs[index - 1].title}]({nbs[index - 1].filename})"
    else:
        prev_link = "← Start of the module"
    if index + 1 < len(nbs):
        next_link = f"Next: [{nbs[index + 1].title}]({nbs[index + 1].filename}) →"
    else:
        next_link = "End of the module →"
    return f"{badge}\n\n{prev_link} · {next_link}"


def build(stem: str, executed: nbformat.NotebookNode | None = None) -> nbformat.NotebookNode:
    """The notebook for source ``notebooks/src/<stem>.py``, stamped; without outputs unless ``executed`` is given.

    With ``executed`` (the committed notebook), its outputs are carried over when every code cell's source and
    tags are unchanged (else :class:`CodeChanged`), so prose and slide markers can change without a re-run.
    """
    names = [nb.filename for nb in about.NOTEBOOKS]
    filename = f"{stem}.ipynb"
    if filename not in names:
        raise SystemExit(f"{filename} is not listed in course_utils/about.py NOTEBOOKS")
    cells = parse_source((paths.SRC / f"{stem}.py").read_text(encoding="utf-8"))
    first_md = next(c for c in cells if c.cell_type == "markdown")
    study = time_line(*study_minutes(cells))
    first_md.source = f"{first_md.source}\n\n{study}\n\n{stamp_header(names.index(filename))}"
    if executed is not None:
        carry_outputs(executed, cells)
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "colab": {"provenance": []},
        "accelerator": "GPU",
    }
    if executed is not None and "widgets" in executed.metadata:  # the saved widget views go with the outputs
        nb.metadata["widgets"] = executed.metadata["widgets"]
    for i, cell in enumerate(nb.cells):  # stable ids keep diffs small
        cell["id"] = f"{stem.split('_')[0]}-{i:03d}"
    stamp_slides(nb)
    return nb


def _code_key(cell: dict) -> tuple[str, list[str]]:
    """What a code cell's outputs depend on: its source and its tags."""
    return cell["source"], list(cell.get("metadata", {}).get("tags", []))


def carry_outputs(executed: nbformat.NotebookNode, cells: list[nbformat.NotebookNode]) -> None:
    """Copy outputs and execution counts from ``executed`` into the matching code ``cells`` (same order)."""
    old = [c for c in executed.cells if c.cell_type == "code"]
    new = [c for c in cells if c.cell_type == "code"]
    if [_code_key(c) for c in old] != [_code_key(c) for c in new]:
        raise CodeChanged("a code cell changed since the notebook was executed")
    for before, after in zip(old, new):
        after.outputs = before.get("outputs", [])
        after.execution_count = before.get("execution_count")


def has_outputs(path: Path) -> bool:
    """True when the notebook at ``path`` holds any executed code cell."""
    nb = nbformat.read(path, as_version=4)
    return any(c.cell_type == "code" and (c.get("outputs") or c.get("execution_count")) for c in nb.cells)


def committed_and_rebuilt(stem: str) -> tuple[nbformat.NotebookNode | None, nbformat.NotebookNode | None]:
    """The committed notebook, and the one its source builds now with the committed outputs carried over.

    Either is None when the notebook is missing; the rebuilt one is None when a code cell changed since it ran.
    """
    target = paths.notebook(stem)
    if not target.exists():
        return None, None
    committed = nbformat.read(target, as_version=4)
    try:
        return committed, build(stem, executed=committed)
    except CodeChanged:
        return committed, None
