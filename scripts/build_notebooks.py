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
    python scripts/build_notebooks.py --restamp  # prose changed, code did not: keep the outputs; restamp the docs
    python scripts/build_notebooks.py --slides build/slides   # export static HTML slides (reveal.js)

Stamped from the sources, never written by hand:
- the header: study time (:func:`study_minutes`), the Colab badge and prev/next links;
- slide metadata on every cell (:func:`slide_types`): every ``#``/``##``/``###`` heading starts a slide,
  a slide that grows taller than the screen is split, and ``# %% [markdown] slide="notes"`` (or any of
  :data:`SLIDE_TYPES`) in a source overrides the rule for that cell. RISE (jupyterlab-rise) and nbconvert's
  slides read it;
- with ``--execute``, each cell's run time and this machine (:func:`machine_record`: CPU, cores, AVX-512-bf16 and
  AMX, OS, torch, date) into ``notebooks/cell_times.json``;
- from ``notebooks/cell_times.json`` (with ``--execute``, ``--restamp`` and a plain build; ``--check`` fails when
  they drifted): README.md's run-time sentence and INSTRUCTORS.md's cell-time table, each between its markers.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import jupytext
import nbformat
from machine_info import describe_machine, machine_record
from notebook_layout import SETUP_TITLE, SLIDE_TYPES, export_slides, stamp_slides, study_minutes, study_time, time_line

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




#: The first code cell of every notebook, as a real Python file (ruff checks it); the build fills in its values.
SETUP_TEMPLATE = Path(__file__).with_name("setup_cell.py")


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
        text, count = re.subn(rf"(?m)^{name} = [^#\n]*?(\s*#.*)?$", lambda m, n=name, v=value: f"{n} = {v}{m.group(1) or ''}",
                              text)
        if count != 1:
            raise RuntimeError(f"{SETUP_TEMPLATE.name} must set {name} on one line of its own")
    if not text.startswith(SETUP_TITLE + "\n"):
        raise RuntimeError(f"{SETUP_TEMPLATE.name} must start with {SETUP_TITLE!r}")
    return text.rstrip("\n")


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


#: The setup cell's metadata: not compared (versions and hardware differ), and collapsed to its title line in
#: JupyterLab (``jupyter.source_hidden``) and on Colab (a ``#@title`` form, ``cellView: "form"``).
SETUP_CELL_METADATA = {"tags": ["nbval-ignore-output"], "nbval_reason": "versions and hardware differ from machine "
                       "to machine", "cellView": "form", "jupyter": {"source_hidden": True}}


def parse_source(text: str) -> list[nbformat.NotebookNode]:
    """Split a percent-format source into notebook cells, read by jupytext.

    Code cells keep only their ``tags`` and ``nbval_reason`` (why nbval does not compare the cell: a test
    requires it wherever a tag excludes one); markdown cells keep no metadata; blank lines at either end of a cell
    are dropped (jupytext would keep a stray one). ``# %% [setup] extras=[...]`` is ours: jupytext reads it as a
    code cell titled ``[setup]``, which becomes :func:`setup_cell_source`.
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
                raise SystemExit(f"slide marker must be one of {', '.join(SLIDE_TYPES)}; got {meta['slide']!r} "
                                 f"in the cell starting {source[:60]!r}")
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


def build(stem: str, executed: nbformat.NotebookNode | None = None) -> nbformat.NotebookNode:
    """The notebook for source ``notebooks/src/<stem>.py``, stamped; without outputs unless ``executed`` is given.

    With ``executed`` (the committed notebook), its outputs are carried over when every code cell's source and
    tags are unchanged (else :class:`CodeChanged`), so prose and slide markers can change without a re-run.
    """
    names = [nb.filename for nb in about.NOTEBOOKS]
    filename = f"{stem}.ipynb"
    if filename not in names:
        raise SystemExit(f"{filename} is not listed in course_utils/about.py NOTEBOOKS")
    cells = parse_source((SRC / f"{stem}.py").read_text(encoding="utf-8"))
    first_md = next(c for c in cells if c.cell_type == "markdown")
    first_md.source = (first_md.source + "\n\n" + time_line(*study_minutes(cells)) + "\n\n"
                       + stamp_header(names.index(filename)))
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


class CodeChanged(Exception):
    """A code cell's source or tags differ from the executed notebook: its outputs would be stale."""


def _code_key(cell: dict) -> tuple[str, list[str]]:
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


def sources_of(nb: nbformat.NotebookNode) -> list[tuple[str, str, list[str], str]]:
    """What must not drift: each cell's type, source, tags and slide type."""
    return [(c.cell_type, c.source, list(c.get("metadata", {}).get("tags", [])),
             c.get("metadata", {}).get("slideshow", {}).get("slide_type", "")) for c in nb.cells]


def has_outputs(path: Path) -> bool:
    """True when the notebook at ``path`` holds any executed code cell."""
    nb = nbformat.read(path, as_version=4)
    return any(c.cell_type == "code" and (c.get("outputs") or c.get("execution_count")) for c in nb.cells)


def execute(nb: nbformat.NotebookNode, timeout: int) -> dict[str, float]:
    """Run ``nb`` top to bottom in a fresh kernel of this Python, on CPU, offline; return each code cell's seconds.

    The seconds are measured by the kernel (from the cell's start to its reply) and kept out of the notebook.
    """
    from nbclient import NotebookClient

    os.environ.update(EXEC_ENV)
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(OUT)}}, store_widget_state=True,
                            record_timing=True)
    client.execute()
    seconds = {}
    for cell in nb.cells:
        stamps = cell.metadata.pop("execution", None)
        if cell.cell_type == "code" and stamps:
            start = datetime.fromisoformat(stamps["iopub.execute_input"].replace("Z", "+00:00"))
            end = datetime.fromisoformat(stamps["shell.execute_reply"].replace("Z", "+00:00"))
            seconds[cell["id"]] = round((end - start).total_seconds(), 1)
    return seconds


# ------------------------------------------------------------------------------------- cell times and guide
TIMES = OUT / "cell_times.json"
GUIDE = ROOT / "INSTRUCTORS.md"
TIMES_START, TIMES_END = "<!-- cell-times:start -->", "<!-- cell-times:end -->"
#: Cells at least this slow are listed in the instructor guide's table.
SLOW_CELL_S = 2.0


def load_times() -> dict[str, dict]:
    """``notebooks/cell_times.json``: per notebook stem, its machine, date, total seconds and cell seconds."""
    return json.loads(TIMES.read_text(encoding="utf-8")) if TIMES.exists() else {}


def record_times(stem: str, seconds: dict[str, float]) -> None:
    """Store one notebook's cell times and this machine in ``notebooks/cell_times.json`` (other entries stay)."""
    times = load_times()
    times[stem] = {"machine": machine_record(), "date": datetime.now().date().isoformat(),
                   "total_s": round(sum(seconds.values()), 1), "cells": seconds}
    TIMES.write_text(json.dumps(times, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def timed_notebooks() -> list[tuple[str, dict]]:
    """(stem, entry) of :func:`load_times` in teaching order, for every notebook that exists and has times."""
    times = load_times()
    stems = [Path(info.filename).stem for info in about.NOTEBOOKS]
    return [(stem, times[stem]) for stem in stems if stem in times and (OUT / f"{stem}.ipynb").exists()]


def section_of(nb: nbformat.NotebookNode, index: int) -> str:
    """The nearest heading above cell ``index``."""
    for cell in reversed(nb.cells[:index + 1]):
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("# ").strip()
    return ""


def times_table() -> str:
    """The guide's table: each notebook's total and its cells slower than :data:`SLOW_CELL_S`."""
    lines = []
    for stem, entry in timed_notebooks():
        nb = nbformat.read(OUT / f"{stem}.ipynb", as_version=4)
        ids = {c["id"]: i for i, c in enumerate(nb.cells)}
        machine = describe_machine(entry["machine"])
        lines += [f"**{stem}** — {entry['total_s']:.0f} s of cells in all ({machine}, {entry['date']}).", "",
                  "| cell | section | first line | seconds |", "| --- | --- | --- | --- |"]
        for cell_id, sec in entry["cells"].items():
            if sec >= SLOW_CELL_S and cell_id in ids:
                source = nb.cells[ids[cell_id]].source.splitlines()
                code = [ln for ln in source if ln.strip() and not ln.startswith("#")] or source or [""]
                first = code[0].strip().replace("|", "\\|")[:60]
                lines.append(f"| {cell_id} | {section_of(nb, ids[cell_id])} | `{first}` | {sec:.1f} |")
        lines.append("")
    return "\n".join(lines).rstrip()


#: The core path's minutes in a notebook's header, as :func:`time_line` writes them.
def run_time_sentence() -> str:
    """The README's run-time and study-time sentences, from ``notebooks/cell_times.json`` and the notebooks' headers.

    Notebooks timed on the same machine are listed together, with that machine and the dates of their runs.
    """
    groups: dict[str, list[tuple[str, dict]]] = {}
    for stem, entry in timed_notebooks():
        groups.setdefault(describe_machine(entry["machine"]), []).append((stem, entry))
    parts = []
    for machine, entries in groups.items():
        dates = sorted({entry["date"] for _, entry in entries})
        when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
        totals = ", ".join(f"{stem.split('_')[0]} {entry['total_s']:.0f} s" for stem, entry in entries)
        parts.append(f"{totals} on a {machine} ({when})")
    run = (f"Each notebook's cells, run top to bottom, took {'; '.join(parts) or '(not measured yet)'}: the sum of "
           f"their times as `scripts/build_notebooks.py --execute` measured them (`notebooks/cell_times.json`).")
    minutes = [m for m in (study_time(OUT / info.filename) for info in about.NOTEBOOKS) if m is not None]
    if not minutes:
        return run
    return f"{run} Study time of each core path, from the notebooks' headers: {min(minutes)}–{max(minutes)} minutes."


def stamp_between(text: str, start: str, end: str, body: str) -> str:
    """``text`` with what lies between the markers ``start`` and ``end`` replaced by ``body``."""
    if start not in text or end not in text:
        return text
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


README = ROOT / "README.md"
TABLE_START, TABLE_END = "<!-- notebooks:start -->", "<!-- notebooks:end -->"
RUN_TIMES_START, RUN_TIMES_END = "<!-- run-times:start -->", "<!-- run-times:end -->"


def readme_table() -> str:
    """The README's notebook table, with an Open-in-Colab link for each notebook."""
    rows = ["| # | Notebook | Open |", "| --- | --- | --- |"]
    for nb in about.NOTEBOOKS:
        number = nb.filename.split("_")[0]
        badge = "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        rows.append(f"| {number} | [{nb.title}](notebooks/{nb.filename}) | {badge}({about.colab_url(nb.filename)}) |")
    return "\n".join(rows)


def stamp_readme(text: str) -> str:
    """``text`` with the README's notebook table and run-time sentence stamped between their markers."""
    text = stamp_between(text, TABLE_START, TABLE_END, readme_table())
    return stamp_between(text, RUN_TIMES_START, RUN_TIMES_END, run_time_sentence())


def stamp_guide(text: str) -> str:
    """``text`` with INSTRUCTORS.md's cell-time table stamped between its markers."""
    return stamp_between(text, TIMES_START, TIMES_END, times_table())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="notebook stems, e.g. 01_quantization (default: all)")
    parser.add_argument("--execute", action="store_true", help="execute and save outputs")
    parser.add_argument("--check", action="store_true", help="fail if a notebook drifted from its source")
    parser.add_argument("--no-outputs", action="store_true",
                        help="write notebooks without outputs even over executed ones (nbval will then fail)")
    parser.add_argument("--restamp", action="store_true",
                        help="rebuild prose, header and slide metadata, keeping the outputs (code must be unchanged)")
    parser.add_argument("--slides", metavar="DIR", type=Path,
                        help="export static HTML slides of the committed notebooks into DIR")
    parser.add_argument("--reveal-prefix", help="with --slides: where reveal.js is (default: a CDN)")
    parser.add_argument("--timeout", type=int, default=600, help="per-cell timeout in seconds")
    return parser.parse_args(argv)


def stamp_or_check_docs(check: bool) -> int:
    """Stamp README.md and INSTRUCTORS.md (:func:`stamp_readme`, :func:`stamp_guide`), or (``check``) return 1
    when either drifted from course_utils/about.py, notebooks/cell_times.json or the notebooks."""
    status = 0
    for path, stamp in ((README, stamp_readme), (GUIDE, stamp_guide)):
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8")
        stamped = stamp(text)
        if stamped == text:
            continue
        if check:
            print(f"DRIFT: {path.name}'s stamped parts differ from course_utils/about.py, notebooks/cell_times.json "
                  f"or the notebooks; run scripts/build_notebooks.py --restamp")
            status = 1
        else:
            path.write_text(stamped, encoding="utf-8")
            print(f"stamped {path.name}")
    return status


def check_or_restamp(stem: str, restamp: bool) -> int:
    """``--check``: 1 when the committed notebook drifted from its source. ``--restamp``: rebuild keeping outputs."""
    target = OUT / f"{stem}.ipynb"
    committed = nbformat.read(target, as_version=4) if target.exists() else None
    try:
        fresh = build(stem, executed=committed) if committed is not None else None
    except CodeChanged:
        fresh = None
    if not restamp:
        if fresh is None or sources_of(committed) != sources_of(fresh):
            print(f"DRIFT: {target.relative_to(ROOT)} differs from notebooks/src/{stem}.py; rebuild it")
            return 1
        return 0
    if fresh is None:
        print(f"not restamped {target.relative_to(ROOT)}: a code cell changed; use --execute")
        return 1
    nbformat.write(fresh, target)
    print(f"restamped {target.relative_to(ROOT)} (outputs kept)")
    return 0


def write_unexecuted(stem: str, no_outputs: bool) -> int:
    """Build without executing; never over an executed notebook unless ``no_outputs``."""
    target = OUT / f"{stem}.ipynb"
    if not no_outputs and target.exists() and has_outputs(target):
        print(f"kept {target.relative_to(ROOT)}: it holds executed outputs, which nbval compares. "
              f"Use --execute to rebuild it with fresh outputs (or --no-outputs to drop them)")
        return 1
    nbformat.write(build(stem), target)
    print(f"wrote {target.relative_to(ROOT)}")
    return 0


def execute_one(stem: str, timeout: int) -> int:
    """Build, execute top to bottom, record the cell times, write; stamp the README and the instructor guide."""
    target = OUT / f"{stem}.ipynb"
    fresh = build(stem)
    start = time.perf_counter()
    seconds = execute(fresh, timeout)
    fresh = build(stem, executed=fresh)  # slides again from the source, now that outputs have heights
    print(f"executed {target.name} in {time.perf_counter() - start:.1f} s")
    record_times(stem, seconds)
    nbformat.write(fresh, target)
    print(f"wrote {target.relative_to(ROOT)}")
    return stamp_or_check_docs(check=False)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stems = args.names or [Path(nb.filename).stem for nb in about.NOTEBOOKS
                           if (SRC / (Path(nb.filename).stem + ".py")).exists()]
    stems = [Path(stem).stem for stem in stems]
    if args.slides:
        export_slides([OUT / f"{stem}.ipynb" for stem in stems], args.slides, args.reveal_prefix)
        return 0
    status = 0
    for stem in stems:
        if args.check or args.restamp:
            status = max(status, check_or_restamp(stem, args.restamp))
        elif not args.execute:
            status = max(status, write_unexecuted(stem, args.no_outputs))
        elif len(stems) > 1:
            # One process per notebook: a second NotebookClient in the same process was seen to stall for
            # the whole cell timeout after the first one finished.
            done = subprocess.run([sys.executable, __file__, "--execute", "--timeout", str(args.timeout), stem])
            status = max(status, done.returncode)
        else:
            status = max(status, execute_one(stem, args.timeout))
    return max(status, stamp_or_check_docs(args.check))


if __name__ == "__main__":
    raise SystemExit(main())
