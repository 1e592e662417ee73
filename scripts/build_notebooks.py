#!/usr/bin/env python3
"""Build the course notebooks from their sources, stamp them, and (re-)execute them.

Sources live in ``notebooks/src/NN_name.py`` in the "percent" format, read with jupytext:

    # %% [markdown]
    # # A title
    # Some prose.

    # %% tags=["nbval-ignore-output"]
    print("a code cell whose output nbval will not compare")

    # %% [setup] extras=["peft"]
    (the standard setup cell is generated here; extras are installed on Colab only if missing)

The first markdown cell gets the Colab badge and the prev/next links stamped under it, from
``course_utils.about`` (the one place that names the repository).

Usage (from the repo root, with the course environment):

    python scripts/build_notebooks.py --execute  # build and execute top to bottom on CPU, save outputs
    python scripts/build_notebooks.py            # build without outputs: only where no executed notebook exists
    python scripts/build_notebooks.py --no-outputs 02_mixed_precision   # overwrite an executed one, outputs dropped
    python scripts/build_notebooks.py --execute 02_mixed_precision   # one notebook
    python scripts/build_notebooks.py --check    # exit 1 if a committed notebook drifted from its source
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "notebooks" / "src"
OUT = ROOT / "notebooks"
sys.path.insert(0, str(ROOT))

from course_utils import about  # noqa: E402 - after the path line above

#: How jupytext reads the sources. Magics stay as written: ``# %env`` in a code cell is a comment, not ``%env``.
PERCENT = {"extension": ".py", "format_name": "percent", "comment_magics": False}

#: Environment for executing notebooks: CPU only, offline, fixed hashing, quiet progress bars.
EXEC_ENV = {
    "CUDA_VISIBLE_DEVICES": "",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONHASHSEED": "0",
    "PYTHONWARNINGS": "ignore::DeprecationWarning",
}


def setup_cell_source(extras: list[str]) -> str:
    """The standard first code cell: install on Colab only, then print versions, hardware and version notes.

    Its logic is unit-tested by executing this text with a fake pip (tests/test_setup_cell.py).
    """
    needs = {name: about.SUPPORTED[name][0] for name in about.COLAB_INSTALLS}
    needs.update({name: "0" for name in extras if name not in needs})
    needs_text = ", ".join(f"{name!r}: {floor!r}" for name, floor in needs.items())
    return f'''# Setup. nbval-ignore-output: versions and hardware differ from machine to machine.
# On Colab: install the course helpers at the version this notebook was built with, plus {", ".join(needs)}
# where missing or too old. Never torch or transformers: Colab's own builds stay. To install the helpers from
# a fork or a mirror, set {about.SOURCE_ENV} first, e.g. %env {about.SOURCE_ENV}=git+https://github.com/YOU/FORK@main
import importlib.metadata, os, subprocess, sys

HELPERS = os.environ.get("{about.SOURCE_ENV}") or "{about.install_spec()}"
NEEDS = {{{needs_text}}}  # package: oldest version the course works with


class SetupFailed(Exception):
    def _render_traceback_(self):  # Jupyter shows this one message instead of a traceback
        return [f"Setup failed: {{self}}"]


def on_colab():
    return any(k.startswith("COLAB_") for k in os.environ) or "google.colab" in sys.modules


def too_old(name, floor):
    try:
        have = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return True
    as_ints = lambda v: [int(p) for p in v.split("+")[0].split(".")[:3] if p.isdigit()]
    return as_ints(have) < as_ints(floor)


def pip_install(*args, what):
    keep = os.path.join(os.path.expanduser("~"), ".course-keep.txt")  # pip may not touch these two
    with open(keep, "w") as f:
        f.writelines(f"{{n}}=={{importlib.metadata.version(n)}}\\n" for n in ("torch", "transformers") if not too_old(n, "0"))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-c", keep, *args],
                          capture_output=True, text=True)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise SetupFailed(f"pip could not install {{what}} ({{why}}). Check that the runtime has internet; to "
                          f"use a fork or a mirror, set {about.SOURCE_ENV} (see the comment above) and run this cell again.")


if on_colab():
    pip_install("--no-deps", HELPERS, what=f"the course helpers from {{HELPERS}}")
    missing = [f"{{name}}>={{floor}}" for name, floor in NEEDS.items() if too_old(name, floor)]
    if missing:
        pip_install(*missing, what=", ".join(missing))

from course_utils.hardware import setup_report
print(setup_report())'''


def stamp_header(index: int) -> str:
    """Badge and prev/next links for notebook number ``index`` in :data:`about.NOTEBOOKS`."""
    nbs = about.NOTEBOOKS
    me = nbs[index]
    badge = (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
             f"({about.colab_url(me.filename)})")
    prev_link = (f"← Previous: [{nbs[index - 1].title}]({nbs[index - 1].filename})" if index > 0
                 else "← Start of the module")
    next_link = (f"Next: [{nbs[index + 1].title}]({nbs[index + 1].filename}) →" if index + 1 < len(nbs)
                 else "End of the module →")
    return f"{badge}\n\n{prev_link} · {next_link}"


def parse_source(text: str) -> list[nbformat.NotebookNode]:
    """Split a percent-format source into notebook cells, read by jupytext.

    Code cells keep only their ``tags``; markdown cells keep no metadata; blank lines at either end of a cell
    are dropped (jupytext would keep a stray one). ``# %% [setup] extras=[...]`` is ours: jupytext reads it as a
    code cell titled ``[setup]``, which becomes :func:`setup_cell_source`.
    """
    cells: list[nbformat.NotebookNode] = []
    for cell in jupytext.reads(text, fmt=PERCENT).cells:
        meta, source = cell.metadata, cell.source.strip("\n")
        if cell.cell_type == "markdown":
            cells.append(nbformat.v4.new_markdown_cell(source))
        elif cell.cell_type == "raw":
            cells.append(nbformat.v4.new_raw_cell(source))
        elif str(meta.get("title", "")).startswith("[setup]"):
            cells.append(nbformat.v4.new_code_cell(setup_cell_source(list(meta.get("extras", [])))))
            cells[-1].metadata["tags"] = ["nbval-ignore-output"]
        else:
            cells.append(nbformat.v4.new_code_cell(source))
            if "tags" in meta:
                cells[-1].metadata["tags"] = list(meta["tags"])
    return cells


def build(stem: str) -> nbformat.NotebookNode:
    """The notebook for source ``notebooks/src/<stem>.py``, stamped, without outputs."""
    names = [nb.filename for nb in about.NOTEBOOKS]
    filename = f"{stem}.ipynb"
    if filename not in names:
        raise SystemExit(f"{filename} is not listed in course_utils/about.py NOTEBOOKS")
    cells = parse_source((SRC / f"{stem}.py").read_text(encoding="utf-8"))
    first_md = next(c for c in cells if c.cell_type == "markdown")
    first_md.source = first_md.source + "\n\n" + stamp_header(names.index(filename))
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "colab": {"provenance": []},
        "accelerator": "GPU",
    }
    for i, cell in enumerate(nb.cells):  # stable ids keep diffs small
        cell["id"] = f"{stem[:2]}-{i:03d}"
    return nb


def sources_of(nb: nbformat.NotebookNode) -> list[tuple[str, str, list[str]]]:
    """What must not drift: each cell's type, source and tags."""
    return [(c.cell_type, c.source, list(c.get("metadata", {}).get("tags", []))) for c in nb.cells]


def has_outputs(path: Path) -> bool:
    """True when the notebook at ``path`` holds any executed code cell."""
    nb = nbformat.read(path, as_version=4)
    return any(c.cell_type == "code" and (c.get("outputs") or c.get("execution_count")) for c in nb.cells)


def execute(nb: nbformat.NotebookNode, timeout: int) -> nbformat.NotebookNode:
    """Run ``nb`` top to bottom in a fresh kernel of this Python, on CPU, offline."""
    from nbclient import NotebookClient

    os.environ.update(EXEC_ENV)
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(OUT)}}, store_widget_state=True,
                            record_timing=False)
    client.execute()
    return nb


README = ROOT / "README.md"
TABLE_START, TABLE_END = "<!-- notebooks:start -->", "<!-- notebooks:end -->"


def readme_table() -> str:
    """The README's notebook table, with an Open-in-Colab link for each notebook."""
    rows = ["| # | Notebook | Open |", "| --- | --- | --- |"]
    for nb in about.NOTEBOOKS:
        number = nb.filename.split("_")[0]
        badge = "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        rows.append(f"| {number} | [{nb.title}](notebooks/{nb.filename}) | {badge}({about.colab_url(nb.filename)}) |")
    return "\n".join(rows)


def stamp_readme(text: str) -> str:
    """``text`` with the notebook table between the README markers replaced by :func:`readme_table`."""
    if TABLE_START not in text or TABLE_END not in text:
        return text
    head, rest = text.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    return f"{head}{TABLE_START}\n{readme_table()}\n{TABLE_END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="notebook stems, e.g. 01_quantization (default: all)")
    parser.add_argument("--execute", action="store_true", help="execute and save outputs")
    parser.add_argument("--check", action="store_true", help="fail if a notebook drifted from its source")
    parser.add_argument("--no-outputs", action="store_true",
                        help="write notebooks without outputs even over executed ones (nbval will then fail)")
    parser.add_argument("--timeout", type=int, default=600, help="per-cell timeout in seconds")
    args = parser.parse_args(argv)

    stems = args.names or [Path(nb.filename).stem for nb in about.NOTEBOOKS
                           if (SRC / (Path(nb.filename).stem + ".py")).exists()]
    status = 0
    readme = README.read_text(encoding="utf-8")
    if args.check and stamp_readme(readme) != readme:
        print("DRIFT: README.md's notebook table differs from course_utils/about.py; rebuild it")
        status = 1
    elif not args.check and stamp_readme(readme) != readme:
        README.write_text(stamp_readme(readme), encoding="utf-8")
        print("stamped README.md notebook table")
    for stem in stems:
        stem = Path(stem).stem
        fresh = build(stem)
        target = OUT / f"{stem}.ipynb"
        if args.check:
            if not target.exists() or sources_of(nbformat.read(target, as_version=4)) != sources_of(fresh):
                print(f"DRIFT: {target.relative_to(ROOT)} differs from notebooks/src/{stem}.py; rebuild it")
                status = 1
            continue
        if not args.execute and not args.no_outputs and target.exists() and has_outputs(target):
            print(f"kept {target.relative_to(ROOT)}: it holds executed outputs, which nbval compares. "
                  f"Use --execute to rebuild it with fresh outputs (or --no-outputs to drop them)")
            status = max(status, 1)
            continue
        if args.execute and len(stems) > 1:
            # One process per notebook: a second NotebookClient in the same process was seen to stall for
            # the whole cell timeout after the first one finished.
            done = subprocess.run([sys.executable, __file__, "--execute", "--timeout", str(args.timeout), stem])
            status = max(status, done.returncode)
            continue
        if args.execute:
            start = time.perf_counter()
            execute(fresh, args.timeout)
            print(f"executed {target.name} in {time.perf_counter() - start:.1f} s")
        nbformat.write(fresh, target)
        print(f"wrote {target.relative_to(ROOT)}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
