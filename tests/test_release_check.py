"""scripts/release_check.py: about.VERSION, pyproject, every notebook's setup cell and the git tag must agree.

Each test builds a small checkout in a temporary folder: a real git repository for the tag, notebooks whose setup
cell is the one scripts/build_notebooks.py writes, then breaks one thing and reads the one line that says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import about

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import build_notebooks  # noqa: E402 - after the path line above
import release_check  # noqa: E402

TAG = about.release_tag()


def write_notebook(path: Path, setup: str) -> None:
    """A notebook with a title cell and ``setup`` as its first code cell."""
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": ["# A title"]},
        {"cell_type": "code", "metadata": {}, "source": setup.splitlines(keepends=True), "outputs": []},
    ]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))


def git(root: Path, *args: str) -> None:
    """Run git in ``root``, quietly, with a throwaway identity."""
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        check=True,
        capture_output=True,
    )


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A checkout where everything agrees: this version's about.py and pyproject, two built notebooks, the tag."""
    (tmp_path / "course_utils").mkdir()
    (tmp_path / "course_utils" / "about.py").write_text((ROOT / "course_utils" / "about.py").read_text())
    (tmp_path / "pyproject.toml").write_text(f'[project]\nname = "course-utils"\nversion = "{about.VERSION}"\n')
    (tmp_path / "notebooks").mkdir()
    for name in ("01_a.ipynb", "02_b.ipynb"):
        write_notebook(tmp_path / "notebooks" / name, build_notebooks.setup_cell_source([]))
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "release")
    git(tmp_path, "tag", TAG)
    return tmp_path


def run(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, list[str]]:
    """(exit status, stdout, the problem lines on stderr) of the script on ``root``."""
    status = release_check.main(["--root", str(root)])
    out, err = capsys.readouterr()
    return status, out, err.splitlines()


def test_all_agree(checkout: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, problems = run(checkout, capsys)
    assert (status, problems) == (0, [])
    assert out == f"release {TAG}: about.py, pyproject.toml, every notebook's setup cell and the git tag agree\n"


def test_this_repository_notebooks_pin_this_version() -> None:
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert release_check.setup_pins(notebook) == (TAG, about.install_spec()), notebook.name


def test_missing_tag_says_how_to_create_and_push_it(checkout: Path, capsys: pytest.CaptureFixture[str]) -> None:
    git(checkout, "tag", "-d", TAG)
    git(checkout, "tag", "v0.0.1")
    status, _, problems = run(checkout, capsys)
    assert status == 1
    assert problems == [
        f"git tag {TAG} does not exist: on the release commit run `git tag {TAG} && git push origin {TAG}`"
    ]


def test_a_notebook_built_for_another_version_is_named(checkout: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = build_notebooks.setup_cell_source([]).replace(f"@{TAG}'", "@v0.1.0'").replace(f"'{TAG}'", "'v0.1.0'")
    write_notebook(checkout / "notebooks" / "02_b.ipynb", old)
    status, _, problems = run(checkout, capsys)
    assert status == 1 and len(problems) == 2
    assert problems[0] == f"notebooks/02_b.ipynb: setup cell pins RELEASE 'v0.1.0', not '{TAG}': rebuild the notebooks"
    assert (
        problems[1].startswith("notebooks/02_b.ipynb: setup cell installs 'course-utils @ git+")
        and "@v0.1.0'" in problems[1]
    )


def test_a_version_bumped_in_one_place_only(checkout: Path, capsys: pytest.CaptureFixture[str]) -> None:
    about_py = checkout / "course_utils" / "about.py"
    about_py.write_text(about_py.read_text().replace(f'VERSION = "{about.VERSION}"', 'VERSION = "9.9.9"'))
    status, _, problems = run(checkout, capsys)
    assert status == 1
    assert problems[0] == f"pyproject.toml: version is '{about.VERSION}', about.VERSION is '9.9.9'"
    assert sum("rebuild the notebooks" in line for line in problems) == 4  # two lines per notebook
    assert problems[-1].startswith("git tag v9.9.9 does not exist")


def test_a_notebook_without_a_setup_cell(checkout: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_notebook(checkout / "notebooks" / "03_c.ipynb", "print('no setup here')")
    assert run(checkout, capsys)[2] == ["notebooks/03_c.ipynb: no setup cell with a RELEASE line"]


def test_tags_are_read_with_git_tag_list(checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert release_check.git_tags(checkout) == [TAG]
    with pytest.raises(RuntimeError, match="git tag --list failed"):
        release_check.git_tags(checkout / "not-a-repository")
    asked: list[list[str]] = []

    def fake_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        asked.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "v0.1.0\nv0.2.0\n", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert release_check.git_tags(checkout) == ["v0.1.0", "v0.2.0"]
    assert asked == [["git", "-C", str(checkout), "tag", "--list"]]
