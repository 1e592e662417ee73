"""scripts/build_notebooks.py: how it reads the percent sources; it never drops executed outputs unless asked."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import build_notebooks  # noqa: E402 - after the path line above

STEM = "01_quantization"
SOURCES = sorted((ROOT / "notebooks" / "src").glob("*.py"))

PERCENT_SOURCE = '''# %% [markdown]
# # A title
#
# Some *prose*.

# %% [setup] extras=["peft", "datasets"]

# %%
x = 1


def f():
    return x


# %% tags=["nbval-ignore-output"] nbval_reason="timings differ from machine to machine"
print(f())

# %% [markdown]
# ## Next
'''


def test_parse_source_reads_markdown_tags_and_the_setup_marker() -> None:
    cells = build_notebooks.parse_source(PERCENT_SOURCE)
    got = [(c.cell_type, c.source, dict(c.metadata)) for c in cells]
    assert got == [
        ("markdown", "# A title\n\nSome *prose*.", {}),
        ("code", build_notebooks.setup_cell_source(["peft", "datasets"]), build_notebooks.SETUP_CELL_METADATA),
        ("code", "x = 1\n\n\ndef f():\n    return x", {}),
        ("code", "print(f())",
         {"tags": ["nbval-ignore-output"], "nbval_reason": "timings differ from machine to machine"}),
        ("markdown", "## Next", {}),
    ]
    assert "'datasets': '0'" in cells[1].source  # an extra the course does not pin: any version


def test_magics_in_a_source_stay_as_written() -> None:
    cells = build_notebooks.parse_source("# %%\n# %time is a comment here\n%env A=1\n")
    assert cells[0].source == "# %time is a comment here\n%env A=1"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_every_source_builds_and_matches_its_committed_notebook(source: Path, capsys: pytest.CaptureFixture) -> None:
    nb = build_notebooks.build(source.stem)
    assert nb.cells[0].cell_type == "markdown" and "colab-badge" in nb.cells[0].source
    assert any("setup_report()" in c.source for c in nb.cells if c.cell_type == "code")
    assert build_notebooks.main(["--check", source.stem]) == 0, capsys.readouterr().out


@pytest.fixture()
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The build script pointed at a copy of one executed notebook and of the README."""
    shutil.copy(ROOT / "notebooks" / f"{STEM}.ipynb", tmp_path / f"{STEM}.ipynb")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    monkeypatch.setattr(build_notebooks, "OUT", tmp_path)
    monkeypatch.setattr(build_notebooks, "README", tmp_path / "README.md")
    monkeypatch.setattr(build_notebooks, "ROOT", tmp_path)
    return tmp_path


def test_plain_build_keeps_executed_notebooks(sandbox: Path, capsys: pytest.CaptureFixture) -> None:
    before = (sandbox / f"{STEM}.ipynb").read_bytes()
    assert build_notebooks.main([STEM]) == 1
    assert (sandbox / f"{STEM}.ipynb").read_bytes() == before
    assert "--execute" in capsys.readouterr().out


def test_no_outputs_overwrites_when_asked(sandbox: Path) -> None:
    assert build_notebooks.main(["--no-outputs", STEM]) == 0
    nb = nbformat.read(sandbox / f"{STEM}.ipynb", as_version=4)
    assert not build_notebooks.has_outputs(sandbox / f"{STEM}.ipynb")
    assert len(nb.cells) > 5


def test_plain_build_writes_a_missing_notebook(sandbox: Path) -> None:
    (sandbox / f"{STEM}.ipynb").unlink()
    assert build_notebooks.main([STEM]) == 0
    assert (sandbox / f"{STEM}.ipynb").exists()


# ----------------------------------------------------------------------------------------- slides and times
def _md(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(text)


def _code(text: str, lines_out: int = 0) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(text)
    if lines_out:
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x\n" * lines_out)]
    return cell


def test_a_slide_marker_in_a_source_is_kept_and_checked() -> None:
    cells = build_notebooks.parse_source('# %% [markdown] slide="notes"\n# Say this aloud.\n\n# %%\nx = 1\n')
    assert cells[0].metadata["slideshow"] == {"slide_type": "notes"}
    assert "slideshow" not in cells[1].metadata
    with pytest.raises(SystemExit, match="slide marker must be one of"):
        build_notebooks.parse_source('# %% [markdown] slide="sideways"\n# text\n')


def test_headings_start_slides_and_tall_slides_are_split() -> None:
    setup = _code(build_notebooks.SETUP_TITLE + "\nprint(1)")
    marked = _md("A long aside.")
    marked.metadata["slideshow"] = {"slide_type": "notes"}
    cells = [_md("# Title"), setup, _md("## Section"), _code("x = 1"), _md("### Detail"), marked,
             _code("print(x)", lines_out=30), _code("print(x)", lines_out=30)]
    assert build_notebooks.slide_types(cells) == ["slide", "skip", "slide", "-", "slide", "notes", "-", "slide"]


def test_a_closed_details_block_counts_as_one_line() -> None:
    hidden = "<details><summary>Answer</summary>\n\n" + "a long answer line\n" * 40 + "\n</details>"
    assert build_notebooks.markdown_height(hidden) < build_notebooks.markdown_height("a line\n" * 3)


def test_study_time_counts_words_code_cells_and_exercises_of_the_core_path() -> None:
    words = " ".join(["word"] * 300)  # 2 minutes at 150 words a minute
    answer = "<details><summary>Answer</summary>\n\n" + " ".join(["hidden"] * 500) + "\n</details>"
    printed = {"outputs": [{"output_type": "stream", "name": "stdout", "text": ["12 MB -> 3 MB, -- done\n"]}]}
    cells = [_md(words + "\n\n" + answer), {**_code("x = 1"), **printed}, _code("answer = ...\ncheck_bytes(answer)"),
             _md(build_notebooks.DEEP_DIVE + "\n\n" + words), _code("y = 2")]
    core, optional = build_notebooks.reading(cells)
    assert (core.words, core.printed, core.code_cells, core.exercises) == (300, 5, 1, 1)  # "--" is no word
    assert core.minutes == 2 + 1 + 5  # 300 words (the answer left out), a code cell, an exercise
    assert build_notebooks.study_minutes(cells) == (8, 4)  # 304 words (the heading's too) and one code cell
    assert build_notebooks.time_line(7, 0) == "**Time:** about 10 minutes of study for the core path."
    assert "plus about 5" in build_notebooks.time_line(12, 4)


def test_restamp_keeps_outputs_and_refuses_changed_code(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = sandbox / f"{STEM}.ipynb"
    build_notebooks.main(["--no-outputs", STEM])
    nb = nbformat.read(target, as_version=4)
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    first_code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="kept\n")]
    nbformat.write(nb, target)
    assert build_notebooks.main(["--restamp", STEM]) == 0
    again = nbformat.read(target, as_version=4)
    assert next(c for c in again.cells if c.cell_type == "code").outputs[0]["text"] == "kept\n"
    assert all("slide_type" in c.metadata.get("slideshow", {}) for c in again.cells)
    assert build_notebooks.main(["--check", STEM]) == 0
    first_code.source += "\nprint('changed')"
    nbformat.write(nb, target)
    assert build_notebooks.main(["--restamp", STEM]) == 1
    assert build_notebooks.main(["--check", STEM]) == 1


def test_cell_times_go_into_the_guide_table(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build_notebooks, "TIMES", sandbox / "cell_times.json")
    nb = nbformat.read(ROOT / "notebooks" / f"{STEM}.ipynb", as_version=4)
    slow = next(c for c in nb.cells if c.cell_type == "code" and "import" in c.source)
    build_notebooks.record_times(STEM, {slow["id"]: 12.34, "01-999": 0.5})
    table = build_notebooks.times_table()
    assert f"| {slow['id']} |" in table and "12.3" in table and "01-999" not in table
    text = "guide\n" + build_notebooks.TIMES_START + "\nold\n" + build_notebooks.TIMES_END + "\nend"
    stamped = build_notebooks.stamp_between(text, build_notebooks.TIMES_START, build_notebooks.TIMES_END, table)
    assert "old" not in stamped and stamped.endswith("end") and "12.3" in stamped


def test_static_slides_export(sandbox: Path) -> None:
    build_notebooks.main(["--no-outputs", STEM])  # stamped slide metadata, as every build writes it
    assert build_notebooks.main(["--slides", str(sandbox / "slides"), STEM]) == 0
    html = (sandbox / "slides" / f"{STEM}.slides.html").read_text(encoding="utf-8")
    assert html.count("<section") > 5 and "reveal" in html


def test_a_markdown_cell_splits_before_each_heading_but_not_in_code_or_answers() -> None:
    text = ("Intro.\n\n## Section\n\nText.\n\n```python\n# a comment, not a heading\n```\n\n"
            "<details><summary>Answer</summary>\n\n# not a heading either\n\n</details>\n\n### Sub\nMore.")
    assert build_notebooks.split_at_headings(text) == [
        "Intro.",
        "## Section\n\nText.\n\n```python\n# a comment, not a heading\n```\n\n"
        "<details><summary>Answer</summary>\n\n# not a heading either\n\n</details>",
        "### Sub\nMore."]
