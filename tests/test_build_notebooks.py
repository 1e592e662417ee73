"""scripts/build_notebooks.py never drops executed outputs unless asked."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import build_notebooks  # noqa: E402

STEM = "01_quantization"


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
