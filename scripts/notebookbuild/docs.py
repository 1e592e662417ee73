"""What the build stamps into README.md and INSTRUCTORS.md between their markers, or checks there (``--check``):
the README's notebook table and run-time sentence, and the guide's table of slow cells, from
``course_utils/about.py``, ``notebooks/cell_times.json`` and the notebooks' headers."""

from __future__ import annotations

import nbformat
from machine_info import describe_machine
from notebook_layout import study_time

from course_utils import about

from . import paths
from .notebook import COLAB_BADGE
from .times import timed_notebooks

TABLE_START, TABLE_END = "<!-- notebooks:start -->", "<!-- notebooks:end -->"
RUN_TIMES_START, RUN_TIMES_END = "<!-- run-times:start -->", "<!-- run-times:end -->"
TIMES_START, TIMES_END = "<!-- cell-times:start -->", "<!-- cell-times:end -->"
#: Cells at least this slow are listed in the instructor guide's table.
SLOW_CELL_S = 2.0


def stamp_between(text: str, start: str, end: str, body: str) -> str:
    """``text`` with what lies between the markers ``start`` and ``end`` replaced by ``body``."""
    if start not in text or end not in text:
        return text
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def readme_table() -> str:
    """The README's notebook table, with an Open-in-Colab link for each notebook."""
    rows = ["| # | Notebook | Open |", "| --- | --- | --- |"]
    for nb in about.NOTEBOOKS:
        number = nb.filename.split("_")[0]
        link = f"{COLAB_BADGE}({about.colab_url(nb.filename)})"
        rows.append(f"| {number} | [{nb.title}](notebooks/{nb.filename}) | {link} |")
    return "\n".join(rows)


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
    run = (
        f"Each notebook's cells, run top to bottom, took {'; '.join(parts) or '(not measured yet)'}: the sum of "
        f"their times as `scripts/build_notebooks.py --execute` measured them (`notebooks/cell_times.json`)."
    )
    minutes = [study_time(paths.OUT / info.filename) for info in about.NOTEBOOKS]
    minutes = [m for m in minutes if m is not None]
    if not minutes:
        return run
    return f"{run} Study time of each core path, from the notebooks' headers: {min(minutes)}–{max(minutes)} minutes."


def section_of(nb: nbformat.NotebookNode, index: int) -> str:
    """The nearest heading above cell ``index``."""
    for cell in reversed(nb.cells[: index + 1]):
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("# ").strip()
    return ""


def first_code_line(source: str) -> str:
    """A cell's first line that is not a comment (its first line if all are), ready for a Markdown table."""
    lines = source.splitlines()
    code = [line for line in lines if line.strip() and not line.startswith("#")] or lines or [""]
    return code[0].strip().replace("|", "\\|")[:60]


def times_table() -> str:
    """The guide's table: each notebook's total and its cells slower than :data:`SLOW_CELL_S`."""
    lines = []
    for stem, entry in timed_notebooks():
        nb = nbformat.read(paths.notebook(stem), as_version=4)
        ids = {c["id"]: i for i, c in enumerate(nb.cells)}
        machine = describe_machine(entry["machine"])
        lines += [
            f"**{stem}** — {entry['total_s']:.0f} s of cells in all ({machine}, {entry['date']}).",
            "",
            "| cell | section | first line | seconds |",
            "| --- | --- | --- | --- |",
        ]
        for cell_id, sec in entry["cells"].items():
            if sec >= SLOW_CELL_S and cell_id in ids:
                first = first_code_line(nb.cells[ids[cell_id]].source)
                lines.append(f"| {cell_id} | {section_of(nb, ids[cell_id])} | `{first}` | {sec:.1f} |")
        lines.append("")
    return "\n".join(lines).rstrip()


def stamp_readme(text: str) -> str:
    """``text`` with the README's notebook table and run-time sentence stamped between their markers."""
    text = stamp_between(text, TABLE_START, TABLE_END, readme_table())
    return stamp_between(text, RUN_TIMES_START, RUN_TIMES_END, run_time_sentence())


def stamp_guide(text: str) -> str:
    """``text`` with INSTRUCTORS.md's cell-time table stamped between its markers."""
    return stamp_between(text, TIMES_START, TIMES_END, times_table())


def stamp_or_check_docs(check: bool) -> int:
    """Stamp README.md and INSTRUCTORS.md (:func:`stamp_readme`, :func:`stamp_guide`), or (``check``) return 1
    when either drifted from course_utils/about.py, notebooks/cell_times.json or the notebooks."""
    status = 0
    for path, stamp in ((paths.README, stamp_readme), (paths.GUIDE, stamp_guide)):
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8")
        stamped = stamp(text)
        if stamped == text:
            continue
        if check:
            print(
                f"DRIFT: {path.name}'s stamped parts differ from course_utils/about.py, notebooks/cell_times.json "
                f"or the notebooks; run scripts/build_notebooks.py --restamp"
            )
            status = 1
        else:
            path.write_text(stamped, encoding="utf-8")
            print(f"stamped {path.name}")
    return status
