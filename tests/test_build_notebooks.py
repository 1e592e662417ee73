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


# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: timings differ from machine to machine.
print(f())

# %% [markdown]
# ## Next
'''


def test_parse_source_reads_markdown_tags_and_the_setup_marker() -> None:
    cells = build_notebooks.parse_source(PERCENT_SOURCE)
    got = [(c.cell_type, c.source, dict(c.metadata)) for c in cells]
    assert got == [
        ("markdown", "# A title\n\nSome *prose*.", {}),
        ("code", build_notebooks.setup_cell_source(["peft", "datasets"]), {"tags": ["nbval-ignore-output"]}),
        ("code", "x = 1\n\n\ndef f():\n    return x", {}),
        ("code", "# nbval-ignore-output: timings differ from machine to machine.\nprint(f())",
         {"tags": ["nbval-ignore-output"]}),
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
