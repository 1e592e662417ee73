"""requirements-colab.txt and scripts/test_colab.sh say the same thing about Colab's stack, within about.SUPPORTED."""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import about

ROOT = Path(__file__).resolve().parents[1]


def pins(name: str) -> dict[str, str]:
    """``package: version`` for each ``package==version`` line of a requirements file (names as written)."""
    found = {}
    for line in (ROOT / name).read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", line.strip())
        if match:
            found[match.group(1)] = match.group(2)
        else:
            assert not line.strip() or line.startswith("#"), f"{name}: not a pin or a comment: {line!r}"
    return found


def test_colab_versions_lie_in_the_supported_range() -> None:
    for package, version in pins("requirements-colab.txt").items():
        if package in about.SUPPORTED:
            assert about.version_status(package, version) is None, (package, version)


def test_torch_is_the_same_small_cpu_build_everywhere() -> None:
    # A loose torch would let pip pull a multi-GB CUDA build.
    assert pins("requirements-colab.txt")["torch"] == pins("requirements.txt")["torch"]


def test_the_script_installs_the_file_into_an_ignored_venv_and_runs_tests_that_exist() -> None:
    script = (ROOT / "scripts" / "test_colab.sh").read_text(encoding="utf-8")
    assert "COURSE_REQUIREMENTS=requirements-colab.txt bash scripts/install.sh" in script
    assert "/.venv-colab/" in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    for test in re.findall(r"tests/test_\w+\.py", script):
        assert (ROOT / test).exists(), test
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "test_colab.sh")], check=True)  # it parses


@pytest.mark.skipif(Path(sys.prefix).name != ".venv-colab", reason="only inside the Colab-stack venv")
def test_the_colab_venv_has_the_pinned_versions() -> None:
    for package, version in pins("requirements-colab.txt").items():
        assert md.version(package).split("+")[0] == version, package
