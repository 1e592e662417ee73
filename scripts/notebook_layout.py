"""How a built notebook reads: its slides (which cell starts one, from its estimated height on a projector) and
its study time (the core path's words, code cells and exercises, and the optional part after "Going deeper").
Used by ``build_notebooks.py``, which stamps both into every notebook, and by the tests that hold the core path to
its limits.
"""

from __future__ import annotations

import base64
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import nbformat

#: The setup cell's first line: a Colab form title (with ``cellView: "form"`` the code stays folded under it).
SETUP_TITLE = "# @title Setup: the course helpers, versions and hardware (run me first)"


# ---------------------------------------------------------------------------------------------------- slides
#: The slide types RISE and nbconvert's reveal.js slides understand ("-": continue the current slide).
SLIDE_TYPES = ("slide", "subslide", "fragment", "-", "skip", "notes")
#: One slide's height budget in estimated pixels: a 1280 x 800 projector, less reveal.js' margins.
SLIDE_BUDGET_PX = 700
#: Estimated pixels: a line of prose, of code, of printed output; a widget view; a table row.
PROSE_LINE_PX, CODE_LINE_PX, OUTPUT_LINE_PX, WIDGET_PX, ROW_PX = 26, 19, 18, 320, 34
#: Characters in one line before it wraps: prose and code/output.
PROSE_WRAP, CODE_WRAP = 105, 115


def _wrapped_lines(text: str, width: int) -> int:
    """Screen lines of ``text`` where each line wraps at ``width`` characters."""
    return sum(max(1, math.ceil(len(line) / width)) for line in text.splitlines()) if text else 0


def markdown_height(source: str) -> int:
    """Estimated pixels of a rendered markdown cell; a closed ``<details>`` shows only its summary line."""
    source = re.sub(r"<details>.*?</details>", "<details>", source, flags=re.S)
    height = 16
    for line in source.splitlines():
        if line.startswith("# "):
            height += 64
        elif line.startswith("## "):
            height += 52
        elif line.startswith("### "):
            height += 40
        elif line.startswith("|"):
            height += ROW_PX
        elif not line.strip():
            height += 10
        else:
            height += PROSE_LINE_PX * _wrapped_lines(line, PROSE_WRAP)
    return height


def _png_height(data: str) -> int:
    """Displayed height of a base64 PNG: its pixel height, scaled down when wider than the slide."""
    raw = base64.b64decode(data[:64])
    width, height = struct.unpack(">II", raw[16:24])
    return int(height * min(1.0, 1150 / max(width, 1)))


def output_height(output: dict) -> int:
    """Estimated pixels of one cell output."""
    if output.get("output_type") == "stream":
        return OUTPUT_LINE_PX * _wrapped_lines(str(output.get("text", "")), CODE_WRAP)
    data = output.get("data", {})
    if "image/png" in data:
        return _png_height(data["image/png"])
    if "application/vnd.jupyter.widget-view+json" in data:
        return WIDGET_PX
    if "text/html" in data:
        return 20 + ROW_PX * max(1, str(data["text/html"]).count("<tr"))
    if "text/markdown" in data:
        return markdown_height(str(data["text/markdown"]))
    return OUTPUT_LINE_PX * _wrapped_lines(str(data.get("text/plain", "")), CODE_WRAP)


def cell_height(cell: dict) -> int:
    """Estimated pixels of a cell on a slide: its rendered markdown, or its code and outputs."""
    if cell["cell_type"] == "markdown":
        return markdown_height(cell["source"])
    code = 24 + CODE_LINE_PX * _wrapped_lines(cell["source"], CODE_WRAP)
    return code + sum(output_height(o) for o in cell.get("outputs", []))


def is_setup_cell(cell: dict) -> bool:
    """True for the generated setup cell (its first line is :data:`SETUP_TITLE`)."""
    return cell["cell_type"] == "code" and "".join(cell["source"]).startswith(SETUP_TITLE)


def slide_types(cells: list[dict]) -> list[str]:
    """The slide type of each cell, from its marker or the rules (see the module docstring).

    Explicit markers win. Otherwise: the first cell and ``#``/``##``/``###`` headings start a slide, the
    generated setup cell is skipped (it is run before presenting, not shown), and any other cell continues the
    slide it follows, unless that would make the slide taller than :data:`SLIDE_BUDGET_PX`: then it starts a
    new slide. Heights count the executed outputs where the notebook holds them. The rules make no sub-slides:
    reveal.js stacks those vertically, and a presenter pressing Space walks through slides in one line anyway
    (a marker may still ask for one).
    """
    types: list[str] = []
    used = 0
    for i, cell in enumerate(cells):
        marker = cell.get("metadata", {}).get("slideshow", {}).get("slide_type")
        first = cell["source"].lstrip().split("\n", 1)[0] if cell["cell_type"] == "markdown" else ""
        height = cell_height(cell)
        if marker:
            kind = marker
        elif i == 0 or first.startswith(("# ", "## ", "### ")):
            kind = "slide"
        elif is_setup_cell(cell):
            kind = "skip"
        elif used and used + height > SLIDE_BUDGET_PX:
            kind = "slide"
        else:
            kind = "-"
        if kind in ("slide", "subslide"):
            used = height
        elif kind in ("-", "fragment"):
            used += height
        types.append(kind)
    return types


def stamp_slides(nb: nbformat.NotebookNode) -> None:
    """Write :func:`slide_types` into every cell's ``metadata.slideshow``."""
    for cell, kind in zip(nb.cells, slide_types(nb.cells)):
        cell.metadata["slideshow"] = {"slide_type": kind}


# ------------------------------------------------------------------------------------------------ study time
#: The heading that starts a notebook's optional part; everything before it is the core path.
DEEP_DIVE = "## Going deeper (optional)"
#: Study-time rule: reading speed (words a minute), minutes per code cell (read, run, look), per exercise.
WORDS_PER_MINUTE, MINUTES_PER_CODE_CELL, MINUTES_PER_EXERCISE = 150, 1.0, 5.0
#: The core path of every notebook must fit in this many minutes of study.
CORE_LIMIT_MINUTES = 60
#: Reading limits of a core path: Markdown words (notebook 04 carries most of the memory lesson's own text), and
#: words printed by its code cells.
CORE_WORD_LIMIT, PRINTED_WORD_LIMIT = 1500, 700
CORE_WORD_LIMITS = {"04_memory_budget": 1900}
PRINTED_WORD_LIMITS: dict[str, int] = {}
EXERCISE = re.compile(r"^\s*(?:lesson\.)?check_\w+\(", re.M)
_DETAILS = re.compile(r"<details>.*?</details>", re.S)


def word_count(text: str) -> int:
    """Words of ``text``: whitespace-separated tokens with a letter or a digit in them."""
    return sum(1 for token in text.split() if re.search(r"[A-Za-z0-9]", token))


def _printed(cell: dict) -> str:
    """What a code cell's outputs print: its streams' text, else its Markdown or plain text."""
    texts = []
    for out in cell.get("outputs", []) or []:
        data = out.get("data", {})
        text = out.get("text") or data.get("text/markdown") or data.get("text/plain") or ""
        texts.append("".join(text) if isinstance(text, list) else text)
    return "\n".join(texts)


@dataclass
class Reading:
    """What one part of a notebook asks of a learner: Markdown words (``<details>`` answers left out), words its
    code cells print, code cells and auto-checked exercises (the generated setup cell not counted)."""

    words: int = 0
    printed: int = 0
    code_cells: int = 0
    exercises: int = 0

    @property
    def minutes(self) -> int:
        """Study minutes at :data:`WORDS_PER_MINUTE`, a minute a code cell and five an exercise."""
        return math.ceil(
            self.words / WORDS_PER_MINUTE
            + MINUTES_PER_CODE_CELL * self.code_cells
            + MINUTES_PER_EXERCISE * self.exercises
        )


def reading(cells: list[dict]) -> tuple[Reading, Reading]:
    """(core path, "Going deeper") reading load; the core path ends at the :data:`DEEP_DIVE` heading."""
    parts, part = (Reading(), Reading()), 0
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and re.search(r"^#+\s*Going deeper", source, re.M | re.I):
            part = 1
        if cell["cell_type"] == "markdown":
            parts[part].words += word_count(_DETAILS.sub(" ", source))
        elif cell["cell_type"] == "code" and not is_setup_cell({**cell, "source": source}):
            exercise = EXERCISE.search(source) is not None
            parts[part].exercises += exercise
            parts[part].code_cells += not exercise
            parts[part].printed += word_count(_printed(cell))
    return parts


def study_minutes(cells: list[dict]) -> tuple[int, int]:
    """(core, optional) study minutes of :func:`reading`."""
    core, optional = reading(cells)
    return core.minutes, optional.minutes


def _up_to_5(minutes: int) -> int:
    """``minutes`` rounded up to a multiple of 5."""
    return 5 * math.ceil(minutes / 5)


def time_line(core: int, optional: int) -> str:
    """The header's study-time sentence, rounded up to 5 minutes."""
    line = f"**Time:** about {_up_to_5(core)} minutes of study for the core path"
    if optional:
        line += f', plus about {_up_to_5(optional)} for the optional "Going deeper" part after the recap'
    return line + "."


#: How a notebook's header gives its core path's study time (stamped by :func:`time_line`).
STUDY_TIME = re.compile(r"\*\*Time:\*\* about (\d+) minutes")


def study_time(path: Path) -> int | None:
    """The core path's study minutes in the header of the notebook at ``path``; None when it has none."""
    if not path.exists():
        return None
    found = STUDY_TIME.search(nbformat.read(path, as_version=4).cells[0].source)
    return int(found.group(1)) if found else None
