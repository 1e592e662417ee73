"""The committed notebooks are what nbval checks, so they must be fresh, clean and match their sources."""
from __future__ import annotations

import json
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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_ignored_cells_say_why(path: Path) -> None:
    """A cell excluded from comparison must say why in its first comment line."""
    for i, cell in enumerate(_code_cells(path)):
        if "nbval-ignore-output" in cell.get("metadata", {}).get("tags", []):
            first = "".join(cell["source"]).splitlines()[0]
            assert first.startswith("#") and "nbval-ignore-output" in first, (
                f"{path.name} code cell {i}: ignored output without a reason in its first comment line")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_comparison_is_not_switched_off_wholesale(path: Path) -> None:
    cells = _code_cells(path)
    ignored = sum("nbval-ignore-output" in c.get("metadata", {}).get("tags", []) for c in cells)
    assert ignored < len(cells) * 0.6, f"{path.name}: {ignored} of {len(cells)} code cells are excluded from comparison"


def test_notebooks_match_their_sources() -> None:
    """nbdev's rule: the notebook and its source never drift (rebuild with scripts/build_notebooks.py)."""
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_notebooks.py"), "--check"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
