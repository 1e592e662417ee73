"""The committed notebooks are what nbval checks, so they must be fresh, clean and match their sources."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import about

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _code_cells(path: Path) -> list[dict]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS, "no notebooks found in notebooks/"


def test_every_notebook_is_listed_in_teaching_order() -> None:
    listed = [nb.filename for nb in about.NOTEBOOKS]
    for path in NOTEBOOKS:
        assert path.name in listed, f"{path.name} is missing from course_utils/about.py NOTEBOOKS"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_execution_counts_are_a_fresh_top_to_bottom_run(path: Path) -> None:
    counts = [c.get("execution_count") for c in _code_cells(path)]
    assert None not in counts, f"{path.name}: {counts.count(None)} code cell(s) never executed"
    assert counts == list(range(1, len(counts) + 1)), f"{path.name}: execution counts {counts} are not 1, 2, 3..."


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_errors_or_stderr_in_committed_outputs(path: Path) -> None:
    for i, cell in enumerate(_code_cells(path)):
        for out in cell.get("outputs", []):
            assert out["output_type"] != "error", f"{path.name} code cell {i}: stored error {out.get('ename')}"
            if out["output_type"] == "stream":
                text = "".join(out["text"])[:120]
                assert out["name"] != "stderr", f"{path.name} code cell {i} wrote to stderr: {text!r}"


NBVAL_TAGS = {"nbval-ignore-output", "nbval-skip", "nbval-check-output", "nbval-raises-exception"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_ignored_cells_say_why_in_their_metadata(path: Path) -> None:
    """A cell excluded from comparison says why in its ``nbval_reason`` metadata key, not in code a learner reads."""
    for i, cell in enumerate(_code_cells(path)):
        meta = cell.get("metadata", {})
        if NBVAL_TAGS & set(meta.get("tags", [])) - {"nbval-check-output"}:
            reason = meta.get("nbval_reason", "")
            assert isinstance(reason, str) and len(reason.split()) >= 3, (
                f"{path.name} code cell {i}: excluded from comparison without an nbval_reason in its metadata"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_visible_code_line_mentions_the_test_tooling(path: Path) -> None:
    for i, cell in enumerate(_code_cells(path)):
        if cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"):
            continue
        lines = [line for line in "".join(cell["source"]).splitlines() if "nbval" in line.lower()]
        assert not lines, f"{path.name} code cell {i}: a learner reads {lines[0]!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_comparison_is_not_switched_off_wholesale(path: Path) -> None:
    cells = _code_cells(path)
    ignored = sum("nbval-ignore-output" in c.get("metadata", {}).get("tags", []) for c in cells)
    assert ignored < len(cells) * 0.6, f"{path.name}: {ignored} of {len(cells)} code cells are excluded from comparison"


def test_notebooks_match_their_sources() -> None:
    """nbdev's rule: the notebook and its source never drift (rebuild with scripts/build_notebooks.py)."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_notebooks.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------------------------- the instructor and student kit
sys.path.insert(0, str(ROOT / "scripts"))
import notebook_layout  # noqa: E402 - after the path line above
from notebookbuild import docs, times  # noqa: E402 - after the path line above

#: Words from how the course was written, which students must never read (issue 13's grep, plus a few).
AUTHORING_WORDS = re.compile(
    r"seed's|as the seed|the seed (asks|loads|says|printed|promises|shows|uses)|"
    r"seed of this course|a maintainer|course machine|these notes|lesson's table",
    re.I,
)


def _cells(path: Path) -> list[dict]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        cell["source"] = "".join(cell["source"])
    return nb["cells"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_has_a_slide_type(path: Path) -> None:
    kinds = [c.get("metadata", {}).get("slideshow", {}).get("slide_type") for c in _cells(path)]
    assert None not in kinds, f"{path.name}: cell {kinds.index(None)} has no slide type; rebuild it"
    assert kinds.count("slide") >= 3, f"{path.name}: a slideshow needs at least 3 slides"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_core_path_fits_the_study_time(path: Path) -> None:
    core, _ = notebook_layout.study_minutes(_cells(path))
    assert core <= notebook_layout.CORE_LIMIT_MINUTES, (
        f"{path.name}: the core path takes about {core} minutes of study; move material after "
        f"'{notebook_layout.DEEP_DIVE}' or tighten it"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_core_path_is_short_reading(path: Path) -> None:
    """A learner finishes: at most 1,500 Markdown words (04: 1,900) and 700 printed words before "Going deeper"."""
    core, _ = notebook_layout.reading(_cells(path))
    limit = notebook_layout.CORE_WORD_LIMITS.get(path.stem, notebook_layout.CORE_WORD_LIMIT)
    assert core.words <= limit, f"{path.name}: {core.words} words of Markdown in the core path (at most {limit})"
    printed = notebook_layout.PRINTED_WORD_LIMITS.get(path.stem, notebook_layout.PRINTED_WORD_LIMIT)
    assert core.printed <= printed, (
        f"{path.name}: its core path prints {core.printed} words (at most {printed}): print a table, not sentences"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_notebook_has_two_auto_checked_exercises(path: Path) -> None:
    core, _ = notebook_layout.reading(_cells(path))
    assert core.exercises >= 2, f"{path.name}: {core.exercises} auto-checked exercise(s) in the core path"


def test_students_never_read_authoring_words() -> None:
    for source in sorted((ROOT / "notebooks" / "src").glob("*.py")):
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            assert not AUTHORING_WORDS.search(line), f"{source.name}:{number}: {line.strip()}"


# ------------------------------------------------------------------------------------------ stamped run times
STAMPED = [
    ("README.md", docs.RUN_TIMES_START, docs.RUN_TIMES_END, docs.stamp_readme),
    ("INSTRUCTORS.md", docs.TIMES_START, docs.TIMES_END, docs.stamp_guide),
]
#: Figures in seconds that README.md and INSTRUCTORS.md may type outside their stamped parts: settings, not runs.
TYPED_SECONDS_ALLOWED = ("300 s budget", "slower than 2 s")


@pytest.mark.parametrize(("name", "start", "end", "stamp"), STAMPED, ids=[s[0] for s in STAMPED])
def test_stamped_run_times_agree_with_cell_times(name: str, start: str, end: str, stamp) -> None:
    """README's run-time sentence and the guide's table are what notebooks/cell_times.json says, machine named."""
    text = (ROOT / name).read_text(encoding="utf-8")
    assert start in text and end in text, f"{name}: the markers {start} ... {end} are missing"
    assert stamp(text) == text, (
        f"{name}: its stamped run times disagree with notebooks/cell_times.json; run "
        "scripts/build_notebooks.py --restamp"
    )


def test_every_notebook_has_cell_times() -> None:
    timed = {stem for stem, _ in times.timed_notebooks()}
    missing = [nb.filename for nb in about.NOTEBOOKS if Path(nb.filename).stem not in timed]
    assert not missing, f"no cell times for {missing}: run scripts/build_notebooks.py --execute on them"


@pytest.mark.parametrize("name", [s[0] for s in STAMPED])
def test_prose_types_no_run_time(name: str) -> None:
    """A time in seconds outside the stamped parts would be another machine's, or an old run's."""
    text = (ROOT / name).read_text(encoding="utf-8")
    for _, start, end, _ in STAMPED:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), "", text, flags=re.S)
    for allowed in TYPED_SECONDS_ALLOWED:
        text = text.replace(allowed, "")
    typed = re.findall(r".{0,40}\b\d+(?:\.\d+)?\s?(?:s|sec|seconds)\b.{0,20}", text)
    assert not typed, f"{name} types a run time outside its stamped parts: {typed}"
