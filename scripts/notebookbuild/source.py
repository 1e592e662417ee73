"""A notebook's source read into cells: markdown split at headings, tags and slide markers kept, the setup cell
generated.

Sources live in ``notebooks/src/NN_name.py`` in jupytext's "percent" format:

    # %% [markdown]
    # # A title
    # Some prose.

    # %% tags=["nbval-ignore-output"] nbval_reason="timings differ from machine to machine"
    print("a code cell whose output nbval will not compare")

    # %% [setup] extras=["peft"]
    (the standard setup cell is generated here; extras are installed on Colab only if missing)
"""

from __future__ import annotations

import re
from pathlib import Path

import jupytext
import nbformat
from notebook_layout import SETUP_TITLE, SLIDE_TYPES

from course_utils import about

#: How jupytext reads the sources. Magics stay as written: ``# %env`` in a code cell is a comment, not ``%env``.
PERCENT = {"extension": ".py", "format_name": "percent", "comment_magics": False}

#: The first code cell of every notebook, as a real Python file (ruff checks it); the build fills in its values.
SETUP_TEMPLATE = Path(__file__).resolve().parents[1] / "setup_cell.py"

#: The setup cell's metadata: not compared (versions and hardware differ), and collapsed to its title line in
#: JupyterLab (``jupyter.source_hidden``) and on Colab (a ``# @title`` form, ``cellView: "form"``).
SETUP_CELL_METADATA = {
    "tags": ["nbval-ignore-output"],
    "nbval_reason": "versions and hardware differ from machine to machine",
    "cellView": "form",
    "jupyter": {"source_hidden": True},
}


def setup_cell_source(extras: list[str]) -> str:
    """The standard first code cell: one GPU, installs on Colab or Kaggle only, then versions, hardware and notes.

    :data:`SETUP_TEMPLATE` with this version's values written into its capitalised settings lines, and the
    template's own note to maintainers left out. Its logic is unit-tested by executing this text with a fake pip
    and a simulated Colab (tests/test_setup_cell.py, and the device profiles in tests/test_gpu_paths.py).
    """
    needs = {name: about.SUPPORTED[name][0] for name in about.COLAB_INSTALLS}
    needs.update({name: "0" for name in extras if name not in needs})
    values = {
        "SOURCE_ENV": repr(about.SOURCE_ENV),
        "RELEASE": repr(about.release_tag()),
        "REPO_URL": repr(about.repo_url()),
        "HELPERS": f"os.environ.get(SOURCE_ENV) or {about.install_spec()!r}",
        "MAIN": repr(about.install_spec(about.BRANCH)),
        "NEEDS": repr(needs),
        "CAPS": repr({name: about.SUPPORTED[name][1] for name in about.COLAB_CAPPED}),
    }
    text = SETUP_TEMPLATE.read_text(encoding="utf-8")
    text = re.sub(r"(?ms)^# \(This file is the template.*?\)\n", "", text)
    for name, value in values.items():
        pattern = rf"(?m)^{name} = [^#\n]*?(\s*#.*)?$"  # the settings line, its comment kept
        text, count = re.subn(pattern, lambda m, n=name, v=value: f"{n} = {v}{m.group(1) or ''}", text)
        if count != 1:
            raise RuntimeError(f"{SETUP_TEMPLATE.name} must set {name} on one line of its own")
    if not text.startswith(SETUP_TITLE + "\n"):
        raise RuntimeError(f"{SETUP_TEMPLATE.name} must start with {SETUP_TITLE!r}")
    return text.rstrip("\n")


def parse_source(text: str) -> list[nbformat.NotebookNode]:
    """Split a percent-format source into notebook cells, read by jupytext.

    Code cells keep only their ``tags`` and ``nbval_reason`` (why nbval does not compare the cell: a test
    requires it wherever a tag excludes one); markdown cells keep no metadata; blank lines at either end of a cell
    are dropped (jupytext would keep a stray one). ``# %% [setup] extras=[...]`` is ours: jupytext reads it as a
    code cell titled ``[setup]``, which becomes :func:`setup_cell_source`. A ``slide="..."`` marker (one of
    :data:`SLIDE_TYPES`) sets the cell's slide type.
    """
    cells: list[nbformat.NotebookNode] = []
    for cell in jupytext.reads(text, fmt=PERCENT).cells:
        meta, source = cell.metadata, cell.source.strip("\n")
        if cell.cell_type == "markdown":
            cells.extend(nbformat.v4.new_markdown_cell(part) for part in split_at_headings(source))
        elif cell.cell_type == "raw":
            cells.append(nbformat.v4.new_raw_cell(source))
        elif str(meta.get("title", "")).startswith("[setup]"):
            cells.append(nbformat.v4.new_code_cell(setup_cell_source(list(meta.get("extras", [])))))
            cells[-1].metadata.update(SETUP_CELL_METADATA)
        else:
            cells.append(nbformat.v4.new_code_cell(source))
            if "tags" in meta:
                cells[-1].metadata["tags"] = list(meta["tags"])
            if "nbval_reason" in meta:
                cells[-1].metadata["nbval_reason"] = str(meta["nbval_reason"])
        if "slide" in meta:
            if meta["slide"] not in SLIDE_TYPES:
                raise SystemExit(
                    f"slide marker must be one of {', '.join(SLIDE_TYPES)}; got {meta['slide']!r} "
                    f"in the cell starting {source[:60]!r}"
                )
            cells[-1].metadata["slideshow"] = {"slide_type": meta["slide"]}
    return cells


def split_at_headings(source: str) -> list[str]:
    """Split a markdown cell before each heading after its first line, so each section starts a slide.

    Lines inside code fences (where ``#`` starts a comment) and inside ``<details>`` blocks never split.
    """
    parts: list[list[str]] = [[]]
    fenced = hidden = False
    for line in source.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        hidden = (hidden or "<details>" in line) and "</details>" not in line
        if line.startswith("#") and not fenced and not hidden and any(x.strip() for x in parts[-1]):
            parts.append([])
        parts[-1].append(line)
    return ["\n".join(part).strip("\n") for part in parts if any(x.strip() for x in part)]
