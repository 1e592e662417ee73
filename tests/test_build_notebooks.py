"""scripts/build_notebooks.py and its package scripts/notebookbuild/: how it reads the percent sources, each mode
(plain build, --no-outputs, --restamp, --check, --execute, --slides) and what it stamps; it never drops executed
outputs unless asked."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

from course_utils import about

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import build_notebooks  # noqa: E402 - after the path line above
import machine_info  # noqa: E402 - after the path line above
import notebook_layout  # noqa: E402 - after the path line above
from notebookbuild import docs, execute, notebook, paths, source, times  # noqa: E402 - after the path line above

STEM = "01_quantization"
SOURCES = sorted((ROOT / "notebooks" / "src").glob("*.py"))

PERCENT_SOURCE = """# %% [markdown]
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
"""


def test_parse_source_reads_markdown_tags_and_the_setup_marker() -> None:
    cells = build_notebooks.parse_source(PERCENT_SOURCE)
    got = [(c.cell_type, c.source, dict(c.metadata)) for c in cells]
    assert got == [
        ("markdown", "# A title\n\nSome *prose*.", {}),
        ("code", build_notebooks.setup_cell_source(["peft", "datasets"]), build_notebooks.SETUP_CELL_METADATA),
        ("code", "x = 1\n\n\ndef f():\n    return x", {}),
        (
            "code",
            "print(f())",
            {"tags": ["nbval-ignore-output"], "nbval_reason": "timings differ from machine to machine"},
        ),
        ("markdown", "## Next", {}),
    ]
    assert "'datasets': '0'" in cells[1].source  # an extra the course does not pin: any version


def test_magics_in_a_source_stay_as_written() -> None:
    cells = build_notebooks.parse_source("# %%\n# %time is a comment here\n%env A=1\n")
    assert cells[0].source == "# %time is a comment here\n%env A=1"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_every_source_builds_with_its_header_setup_cell_and_ids(path: Path) -> None:
    """Whether each committed notebook matches its source is tests/test_notebooks_fresh.py's --check."""
    nb = build_notebooks.build(path.stem)
    index = [info.filename for info in about.NOTEBOOKS].index(f"{path.stem}.ipynb")
    header = nb.cells[0].source
    before = about.NOTEBOOKS[index - 1].filename if index else "← Start of the module"
    after = about.NOTEBOOKS[index + 1].filename if index + 1 < len(about.NOTEBOOKS) else "End of the module →"
    assert f"({about.colab_url(f'{path.stem}.ipynb')})" in header and before in header and after in header
    assert notebook_layout.STUDY_TIME.search(header)
    setup = [c for c in nb.cells if notebook_layout.is_setup_cell(c)]
    skipped = {**build_notebooks.SETUP_CELL_METADATA, "slideshow": {"slide_type": "skip"}}  # run, not presented
    assert len(setup) == 1 and setup[0].metadata == skipped
    assert "setup_report()" in setup[0].source
    prefix = path.stem.split("_")[0]
    assert [c["id"] for c in nb.cells] == [f"{prefix}-{i:03d}" for i in range(len(nb.cells))]
    assert all(c.metadata["slideshow"]["slide_type"] in notebook_layout.SLIDE_TYPES for c in nb.cells)
    assert not any(c.get("outputs") or c.get("execution_count") for c in nb.cells if c.cell_type == "code")


@pytest.fixture()
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The build pointed at a copy of one executed notebook, the README, the guide and the cell times."""
    shutil.copy(ROOT / "notebooks" / f"{STEM}.ipynb", tmp_path / f"{STEM}.ipynb")
    for name in ("README.md", "INSTRUCTORS.md", "notebooks/cell_times.json"):
        shutil.copy(ROOT / name, tmp_path / Path(name).name)
    monkeypatch.setattr(paths, "OUT", tmp_path)
    monkeypatch.setattr(paths, "README", tmp_path / "README.md")
    monkeypatch.setattr(paths, "GUIDE", tmp_path / "INSTRUCTORS.md")
    monkeypatch.setattr(paths, "TIMES", tmp_path / "cell_times.json")
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    return tmp_path


@pytest.fixture()
def unexecuted(sandbox: Path) -> Path:
    """The sandbox with its notebook rebuilt from the source without outputs: in step with its source, whether or
    not the committed one is (tests/test_notebooks_fresh.py checks that)."""
    assert build_notebooks.main(["--no-outputs", STEM]) == 0
    return sandbox


def test_plain_build_keeps_executed_notebooks(sandbox: Path, capsys: pytest.CaptureFixture) -> None:
    before = (sandbox / f"{STEM}.ipynb").read_bytes()
    assert build_notebooks.main([STEM]) == 1
    assert (sandbox / f"{STEM}.ipynb").read_bytes() == before
    assert "--execute" in capsys.readouterr().out


def test_no_outputs_overwrites_when_asked(sandbox: Path) -> None:
    assert build_notebooks.main(["--no-outputs", STEM]) == 0
    nb = nbformat.read(sandbox / f"{STEM}.ipynb", as_version=4)
    assert not notebook.has_outputs(sandbox / f"{STEM}.ipynb")
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
    setup = _code(notebook_layout.SETUP_TITLE + "\nprint(1)")
    marked = _md("A long aside.")
    marked.metadata["slideshow"] = {"slide_type": "notes"}
    cells = [
        _md("# Title"),
        setup,
        _md("## Section"),
        _code("x = 1"),
        _md("### Detail"),
        marked,
        _code("print(x)", lines_out=30),
        _code("print(x)", lines_out=30),
    ]
    assert notebook_layout.slide_types(cells) == ["slide", "skip", "slide", "-", "slide", "notes", "-", "slide"]


def test_a_closed_details_block_counts_as_one_line() -> None:
    hidden = "<details><summary>Answer</summary>\n\n" + "a long answer line\n" * 40 + "\n</details>"
    assert notebook_layout.markdown_height(hidden) < notebook_layout.markdown_height("a line\n" * 3)


def test_study_time_counts_words_code_cells_and_exercises_of_the_core_path() -> None:
    words = " ".join(["word"] * 300)  # 2 minutes at 150 words a minute
    answer = "<details><summary>Answer</summary>\n\n" + " ".join(["hidden"] * 500) + "\n</details>"
    printed = {"outputs": [{"output_type": "stream", "name": "stdout", "text": ["12 MB -> 3 MB, -- done\n"]}]}
    cells = [
        _md(words + "\n\n" + answer),
        {**_code("x = 1"), **printed},
        _code("answer = ...\ncheck_bytes(answer)"),
        _md(notebook_layout.DEEP_DIVE + "\n\n" + words),
        _code("y = 2"),
    ]
    core, optional = notebook_layout.reading(cells)
    assert (core.words, core.printed, core.code_cells, core.exercises) == (300, 5, 1, 1)  # "--" is no word
    assert core.minutes == 2 + 1 + 5  # 300 words (the answer left out), a code cell, an exercise
    assert notebook_layout.study_minutes(cells) == (8, 4)  # 304 words (the heading's too) and one code cell
    assert notebook_layout.time_line(7, 0) == "**Time:** about 10 minutes of study for the core path."
    assert "plus about 5" in notebook_layout.time_line(12, 4)


def test_restamp_keeps_outputs_and_refuses_changed_code(unexecuted: Path) -> None:
    target = unexecuted / f"{STEM}.ipynb"
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


def test_cell_times_go_into_the_guide_table(sandbox: Path) -> None:
    nb = nbformat.read(ROOT / "notebooks" / f"{STEM}.ipynb", as_version=4)
    slow = next(c for c in nb.cells if c.cell_type == "code" and "import" in c.source)
    times.record_times(STEM, {slow["id"]: 12.34, "01-999": 0.5})
    entry = json.loads((sandbox / "cell_times.json").read_text(encoding="utf-8"))[STEM]
    assert set(entry["machine"]) == {"cpu", "cores", "avx512_bf16", "amx_bf16", "os", "torch"}
    assert entry["total_s"] == 12.8 and len(entry["date"]) == 10
    table = docs.times_table()
    assert f"| {slow['id']} |" in table and "12.3" in table and "01-999" not in table
    assert machine_info.describe_machine(entry["machine"]) in table
    text = "guide\n" + docs.TIMES_START + "\nold\n" + docs.TIMES_END + "\nend"
    stamped = docs.stamp_between(text, docs.TIMES_START, docs.TIMES_END, table)
    assert "old" not in stamped and stamped.endswith("end") and "12.3" in stamped


def test_static_slides_show_each_slide_and_note_and_skip_the_setup_cell(sandbox: Path) -> None:
    assert build_notebooks.main(["--slides", str(sandbox / "slides"), STEM]) == 0
    html = (sandbox / "slides" / f"{STEM}.slides.html").read_text(encoding="utf-8")
    kinds = [c.metadata["slideshow"]["slide_type"] for c in nbformat.read(sandbox / f"{STEM}.ipynb", 4).cells]
    assert html.count("<section") == 2 * kinds.count("slide")  # a slide is a section holding one sub-slide
    assert html.count('<aside class="notes">') == kinds.count("notes")
    assert kinds.count("skip") == 1 and notebook_layout.SETUP_TITLE.split(": ")[1] not in html


def test_a_markdown_cell_splits_before_each_heading_but_not_in_code_or_answers() -> None:
    text = (
        "Intro.\n\n## Section\n\nText.\n\n```python\n# a comment, not a heading\n```\n\n"
        "<details><summary>Answer</summary>\n\n# not a heading either\n\n</details>\n\n### Sub\nMore."
    )
    assert source.split_at_headings(text) == [
        "Intro.",
        "## Section\n\nText.\n\n```python\n# a comment, not a heading\n```\n\n"
        "<details><summary>Answer</summary>\n\n# not a heading either\n\n</details>",
        "### Sub\nMore.",
    ]


# ------------------------------------------------------------------------------ the machine, README and guide
def test_cpu_info_reads_the_model_and_the_bfloat16_flags(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Test Xeon\nflags\t\t: fpu avx2 avx512_bf16 amx_bf16\n\n"
        "processor\t: 1\nmodel name\t: Other\nflags\t\t: fpu\n",
        encoding="utf-8",
    )
    assert machine_info.cpu_info(cpuinfo) == ("Test Xeon", {"fpu", "avx2", "avx512_bf16", "amx_bf16"})
    model, flags = machine_info.cpu_info(tmp_path / "missing")
    assert flags is None and model


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ((True, True), "(AVX-512-bf16, AMX)"),
        ((True, False), "(AVX-512-bf16, no AMX)"),
        ((False, False), "(no AVX-512-bf16, no AMX)"),
        ((None, None), "(bfloat16 flags unknown)"),
    ],
)
def test_describe_machine_names_cpu_cores_flags_os_and_torch(flags: tuple, words: str) -> None:
    machine = {
        "cpu": "Test CPU",
        "cores": 4,
        "avx512_bf16": flags[0],
        "amx_bf16": flags[1],
        "os": "Linux 6.1",
        "torch": "2.13.0",
    }
    assert machine_info.describe_machine(machine) == f"4-core Test CPU {words}, Linux 6.1, torch 2.13.0, CPU only"
    assert machine_info.describe_machine("an older record") == "an older record"


def _write_times(sandbox: Path, total_s: float, cpu: str = "Test CPU") -> None:
    machine = {"cpu": cpu, "cores": 4, "avx512_bf16": True, "amx_bf16": False, "os": "Linux 6.1", "torch": "2.13.0"}
    entry = {"machine": machine, "date": "2026-01-02", "total_s": total_s, "cells": {"01-024": total_s}}
    (sandbox / "cell_times.json").write_text(json.dumps({STEM: entry}), encoding="utf-8")


def test_readme_and_guide_are_stamped_from_the_cell_times(unexecuted: Path) -> None:
    sandbox = unexecuted
    _write_times(sandbox, 12.3)
    assert build_notebooks.main(["--restamp", STEM]) == 0
    readme = (sandbox / "README.md").read_text(encoding="utf-8")
    block = readme.split(docs.RUN_TIMES_START)[1].split(docs.RUN_TIMES_END)[0]
    machine = "4-core Test CPU (AVX-512-bf16, no AMX), Linux 6.1, torch 2.13.0, CPU only"
    assert f"01 12 s on a {machine} (2026-01-02)" in block
    assert "Study time of each core path" in block and "minutes" in block
    guide = (sandbox / "INSTRUCTORS.md").read_text(encoding="utf-8")
    assert f"**{STEM}** — 12 s of cells in all ({machine}, 2026-01-02)." in guide
    assert "| 01-024 |" in guide and "| 12.3 |" in guide
    assert build_notebooks.main(["--check", STEM]) == 0


@pytest.mark.parametrize(
    ("stale", "old", "typed"), [("README.md", "01 12 s", "01 27 s"), ("INSTRUCTORS.md", "| 12.3 |", "| 27.0 |")]
)
def test_a_stamp_that_disagrees_with_the_cell_times_fails_the_check(
    unexecuted: Path, stale: str, old: str, typed: str, capsys: pytest.CaptureFixture
) -> None:
    sandbox = unexecuted
    _write_times(sandbox, 12.3)
    assert build_notebooks.main(["--restamp", STEM]) == 0
    path = sandbox / stale
    assert old in path.read_text(encoding="utf-8")
    path.write_text(path.read_text(encoding="utf-8").replace(old, typed), encoding="utf-8")
    capsys.readouterr()
    assert build_notebooks.main(["--check", STEM]) == 1
    assert f"DRIFT: {stale}" in capsys.readouterr().out
    assert build_notebooks.main(["--restamp", STEM]) == 0
    assert build_notebooks.main(["--check", STEM]) == 0


def test_new_cell_times_make_the_stamps_stale(unexecuted: Path, capsys: pytest.CaptureFixture) -> None:
    sandbox = unexecuted
    _write_times(sandbox, 12.3)
    assert build_notebooks.main(["--restamp", STEM]) == 0
    _write_times(sandbox, 12.3, cpu="Another CPU")  # a re-run on another machine, not restamped
    assert build_notebooks.main(["--check", STEM]) == 1
    out = capsys.readouterr().out
    assert "DRIFT: README.md" in out and "DRIFT: INSTRUCTORS.md" in out


def test_notebooks_timed_on_two_machines_are_named_apart(sandbox: Path) -> None:
    _write_times(sandbox, 12.3)
    recorded = times.load_times()
    shutil.copy(sandbox / f"{STEM}.ipynb", sandbox / "02_mixed_precision.ipynb")
    old_run = {"machine": "2-core Old CPU", "date": "2025-12-31", "total_s": 9.1}
    recorded["02_mixed_precision"] = {**recorded[STEM], **old_run}
    (sandbox / "cell_times.json").write_text(json.dumps(recorded), encoding="utf-8")
    sentence = docs.run_time_sentence()
    assert "01 12 s on a 4-core Test CPU" in sentence and "; 02 9 s on a 2-core Old CPU (2025-12-31)" in sentence


# ------------------------------------------------------------------------------------------------- --execute
TINY_SOURCE = """# %% [markdown]
# # A tiny notebook

# %%
print(6 * 7)

# %% [markdown]
# ## Next

# %%
x = 3
x
"""


def test_execute_runs_the_notebook_and_records_its_cell_times(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--execute on a two-cell source (a kernel starts; no torch): outputs saved, cell times and docs stamped."""
    (sandbox / "src").mkdir()
    (sandbox / "src" / f"{STEM}.py").write_text(TINY_SOURCE, encoding="utf-8")
    monkeypatch.setattr(paths, "SRC", sandbox / "src")
    for name in [*execute.EXEC_ENV, "PATH"]:  # --execute sets these in its own process: put them back after
        monkeypatch.setenv(name, os.environ.get(name, ""))
    assert build_notebooks.main(["--execute", "--timeout", "60", STEM]) == 0
    nb = nbformat.read(sandbox / f"{STEM}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == [1, 2]
    assert code[0].outputs[0]["text"] == "42\n" and code[1].outputs[0]["data"]["text/plain"] == "3"
    assert all("execution" not in c.metadata for c in nb.cells)  # the kernel's timestamps stay out
    entry = times.load_times()[STEM]
    assert set(entry["cells"]) == {c["id"] for c in code} and entry["total_s"] >= 0
    assert build_notebooks.main(["--check", STEM]) == 0  # README and guide stamped from the new times
