"""The generated setup cell (scripts/build_notebooks.py ``setup_cell_source``), executed as its own text.

A simulated Colab (``COLAB_RELEASE_TAG`` set) and a fake pip in place of ``subprocess.run``: what it installs,
with which caps, and the one message a student sees when pip fails. tests/test_gpu_paths.py
runs the same cell on every simulated device, with the FakePip and run_cell of this file.
"""
from __future__ import annotations

import importlib.metadata as md
import io
import os
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from course_utils import about

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import build_notebooks  # noqa: E402 - after the path line above

#: What the fake pip prints when it fails: 20 numbered lines, the last one pip's usual error.
PIP_LINES = [f"pip line {i}" for i in range(1, 20)] + [
    "ERROR: Could not find a version that satisfies the requirement course-utils (no such tag)"]


class FakePip:
    """Stands in for subprocess.run: records each pip command; fails those containing ``fail_on``."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[list[str]] = []
        self.kwargs: list[dict] = []
        self.fail_on = fail_on

    def __call__(self, cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        self.calls.append(list(cmd))
        self.kwargs.append(kwargs)
        failed = self.fail_on is not None and any(self.fail_on in part for part in cmd)
        # The cell asks for pip's combined output (stderr=STDOUT): it all comes back as stdout.
        return subprocess.CompletedProcess(cmd, 1 if failed else 0, "\n".join(PIP_LINES) if failed else "", None)


#: What the setup cell sees installed, by default: everything but bitsandbytes (as on Colab).
NO_BITSANDBYTES: dict[str, str | None] = {"bitsandbytes": None}


def run_cell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pip: FakePip, *, colab: bool = True,
             source: str | None = None, installed: dict[str, str | None] = NO_BITSANDBYTES) -> str:
    """Execute the setup cell of a notebook with extras ``["peft"]``; return what it printed.

    ``installed``: package versions the cell reads instead of the real ones (None: not installed).
    """
    monkeypatch.setattr(subprocess, "run", pip)
    monkeypatch.setenv("HOME", str(tmp_path))
    for key in [k for k in os.environ if k.startswith("COLAB_")]:
        monkeypatch.delenv(key)
    if colab:
        monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-test")
    if source is None:
        monkeypatch.delenv(about.SOURCE_ENV, raising=False)
    else:
        monkeypatch.setenv(about.SOURCE_ENV, source)
    real = md.version

    def version(name: str) -> str:
        if name not in installed:
            return real(name)
        if installed[name] is None:
            raise md.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(md, "version", version)
    out = io.StringIO()
    with redirect_stdout(out):
        exec(compile(build_notebooks.setup_cell_source(["peft"]), "<setup cell>", "exec"), {})
    return out.getvalue()


def failure_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pip: FakePip, **kwargs: object) -> str:
    with pytest.raises(Exception) as info:
        run_cell(monkeypatch, tmp_path, pip, **kwargs)
    assert type(info.value).__name__ == "SetupFailed"
    shown = info.value._render_traceback_()  # what Jupyter shows instead of a traceback
    assert len(shown) == 1 and shown[0].startswith("Setup failed: pip could not install ")
    assert "Traceback" not in shown[0]
    return shown[0]


def test_failed_helpers_install_names_the_repository_the_tag_and_the_way_out(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    pip = FakePip(fail_on="git+https://")
    message = failure_message(monkeypatch, tmp_path, pip)
    assert f"the course helpers from {about.repo_url()} at tag {about.release_tag()}." in message
    assert "That tag may not be published yet" in message
    assert f"%env {about.SOURCE_ENV}=git+https://github.com/YOU/FORK@main" in message
    assert "internet" not in message  # pip's own lines say what went wrong
    # pip's last 15 lines of combined output, indented, and nothing before them
    assert message.endswith("pip's last lines:\n    " + "\n    ".join(PIP_LINES[-15:]))
    assert "pip line 5\n" not in message and "    pip line 6\n" in message
    assert len(pip.calls) == 1  # stopped: the extras were not attempted
    assert pip.kwargs[0]["stderr"] is subprocess.STDOUT


def test_failed_install_from_an_override_names_the_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fork = "git+https://github.com/someone/fork@main"
    message = failure_message(monkeypatch, tmp_path, FakePip(fail_on=fork), source=fork)
    assert f"the course helpers from {about.SOURCE_ENV}={fork}." in message
    assert f"%env {about.SOURCE_ENV}=)" in message  # how to go back to the release tag
    assert PIP_LINES[-1] in message


def test_failed_extras_install_names_the_capped_requirement(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pip = FakePip(fail_on="bitsandbytes")
    message = failure_message(monkeypatch, tmp_path, pip)
    low, high = about.SUPPORTED["bitsandbytes"]
    assert f"pip could not install bitsandbytes>={low},<={high}" in message
    assert PIP_LINES[-1] in message and len(pip.calls) == 2


def test_success_installs_helpers_then_the_missing_extras_capped(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    pip = FakePip()
    printed = run_cell(monkeypatch, tmp_path, pip, installed={"bitsandbytes": None, "accelerate": None, "peft": None})
    helpers, extras = pip.calls
    assert helpers[-2:] == ["--no-deps", about.install_spec()]
    low, high = about.SUPPORTED["bitsandbytes"]
    assert f"bitsandbytes>={low},<={high}" in extras
    assert f"accelerate>={about.SUPPORTED['accelerate'][0]}" in extras  # no cap: only bitsandbytes is capped
    assert f"peft>={about.SUPPORTED['peft'][0]}" in extras
    for call in pip.calls:
        assert call[1:5] == ["-m", "pip", "install", "-q"] and "-c" in call
        assert not any(part.split(">=")[0].split("==")[0] in ("torch", "transformers") for part in call[5:])
    keep = (tmp_path / ".course-keep.txt").read_text()
    assert "torch==" in keep and "transformers==" in keep  # held at the installed builds
    assert "Setup failed" not in printed and "torch" in printed  # then the version report


def test_nothing_installed_off_colab(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pip = FakePip(fail_on="")
    printed = run_cell(monkeypatch, tmp_path, pip, colab=False)
    assert pip.calls == [] and "torch" in printed


def test_the_cap_is_the_newest_tested_version_and_the_floor_the_oldest() -> None:
    def pin(path: str, name: str) -> str:
        for line in (ROOT / path).read_text(encoding="utf-8").splitlines():
            if line.startswith(f"{name}=="):
                return line.split("==")[1].strip()
        raise AssertionError(f"{path} pins no {name}")

    assert about.SUPPORTED["bitsandbytes"] == (pin("requirements-floor.txt", "bitsandbytes"),
                                               pin("requirements.txt", "bitsandbytes"))
    assert pin("requirements-colab.txt", "bitsandbytes") == about.SUPPORTED["bitsandbytes"][1]
    source = build_notebooks.setup_cell_source([])
    assert f"CAPS = {{'bitsandbytes': '{about.SUPPORTED['bitsandbytes'][1]}'}}" in source
