"""The generated setup cell (scripts/build_notebooks.py ``setup_cell_source``), executed as its own text.

A simulated Colab (``COLAB_RELEASE_TAG`` set) or Kaggle (``KAGGLE_KERNEL_RUN_TYPE`` set) and a fake pip (and
``nvidia-smi``) in place of ``subprocess.run``: what it installs, with which caps, the fallback to the main branch
while the release tag is not published, and the one message a student sees when pip fails.
tests/test_gpu_paths.py runs the same cell on every simulated device, and tests/test_hosts.py on Kaggle's one and
two T4s, with the FakePip and run_cell of this file.
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

from course_utils import about, cache

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import build_notebooks  # noqa: E402 - after the path line above

#: What the fake pip prints when it fails: 20 numbered lines, the last one pip's usual error.
PIP_LINES = [f"pip line {i}" for i in range(1, 20)] + [
    "ERROR: Could not find a version that satisfies the requirement course-utils (no such tag)"
]


class FakePip:
    """Stands in for subprocess.run: records each pip command; fails those containing ``fail_on``.

    ``nvidia-smi -L`` answers with ``gpus`` lines, as on a machine with that many GPUs (not recorded in ``calls``).
    """

    def __init__(self, fail_on: str | None = None, gpus: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.kwargs: list[dict] = []
        self.fail_on = fail_on
        self.gpus = gpus

    def __call__(self, cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        if cmd[0] == "nvidia-smi":
            listed = [f"GPU {i}: Tesla T4 (UUID: GPU-0000000{i}-fake)" for i in range(self.gpus)]
            return subprocess.CompletedProcess(cmd, 0, "\n".join(listed) + "\n", None)
        self.calls.append(list(cmd))
        self.kwargs.append(kwargs)
        failed = self.fail_on is not None and any(self.fail_on in part for part in cmd)
        # The cell asks for pip's combined output (stderr=STDOUT): it all comes back as stdout.
        return subprocess.CompletedProcess(cmd, 1 if failed else 0, "\n".join(PIP_LINES) if failed else "", None)


#: What the setup cell sees installed, by default: everything but bitsandbytes (as on Colab).
NO_BITSANDBYTES: dict[str, str | None] = {"bitsandbytes": None}


def run_cell(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    pip: FakePip,
    *,
    colab: bool = True,
    kaggle: bool = False,
    source: str | None = None,
    installed: dict[str, str | None] = NO_BITSANDBYTES,
    namespace: dict | None = None,
) -> str:
    """Execute the setup cell of a notebook with extras ``["peft"]`` (in ``namespace``); return what it printed.

    ``installed``: package versions the cell reads instead of the real ones (None: not installed). Whatever the
    cell sets in ``CUDA_VISIBLE_DEVICES`` is undone at the test's end.
    """
    monkeypatch.setattr(subprocess, "run", pip)
    monkeypatch.setenv("HOME", str(tmp_path))
    for key in ("COURSE_UTILS_CACHE", "XDG_CACHE_HOME"):  # the course's cache folder: under this HOME
        monkeypatch.delenv(key, raising=False)
    for key in [k for k in os.environ if k.startswith(("COLAB_", "KAGGLE_"))]:
        monkeypatch.delenv(key)
    if colab:
        monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-test")
    if kaggle:
        monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible or "")  # recorded: the test's end restores it
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
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
    scope = {} if namespace is None else namespace
    out = io.StringIO()
    with redirect_stdout(out):
        exec(compile(build_notebooks.setup_cell_source(["peft"]), "<setup cell>", "exec"), scope)
    return out.getvalue()


def failure_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pip: FakePip, **kwargs: object) -> str:
    with pytest.raises(Exception) as info:
        run_cell(monkeypatch, tmp_path, pip, **kwargs)
    assert type(info.value).__name__ == "SetupFailed"
    shown = info.value._render_traceback_()  # what Jupyter shows instead of a traceback
    assert len(shown) == 1 and shown[0].startswith("Setup failed: pip could not install ")
    assert "Traceback" not in shown[0]
    return shown[0]


def test_failed_helpers_install_names_the_repository_the_tag_and_the_way_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pip = FakePip(fail_on="git+https://")
    message = failure_message(monkeypatch, tmp_path, pip)
    assert f"the course helpers from {about.repo_url()} at tag {about.release_tag()} or its main branch." in message
    assert "The tag may not be published yet, and the main branch did not install either." in message
    assert f"%env {about.SOURCE_ENV}=git+https://github.com/YOU/FORK@main" in message
    assert "internet" not in message.lower()  # on Colab pip's own lines say what went wrong
    # pip's last 15 lines of combined output, indented, and nothing before them
    assert message.endswith("pip's last lines:\n    " + "\n    ".join(PIP_LINES[-15:]))
    assert "pip line 5\n" not in message and "    pip line 6\n" in message
    assert [call[-1] for call in pip.calls] == [about.install_spec(), about.install_spec("main")]  # no extras
    assert pip.kwargs[0]["stderr"] is subprocess.STDOUT


def test_unpublished_tag_falls_back_to_main_and_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pip = FakePip(fail_on=f"@{about.release_tag()}")
    printed = run_cell(monkeypatch, tmp_path, pip, installed={"bitsandbytes": None, "course-utils": "0.3.0.dev1"})
    tag, main, extras = pip.calls
    assert tag[-2:] == ["--no-deps", about.install_spec()] and main[-2:] == ["--no-deps", about.install_spec("main")]
    assert about.install_spec("main") == f"course-utils @ git+{about.repo_url()}@main"
    assert any(part.startswith("bitsandbytes>=") for part in extras)  # then carries on as usual
    (line,) = [line for line in printed.splitlines() if "main branch" in line]
    assert line == (
        f"The helpers' tag {about.release_tag()} did not install (not published yet?): installed "
        f"{about.repo_url()}'s main branch instead, course-utils 0.3.0.dev1."
    )
    assert "Setup failed" not in printed and "\nReady. " in printed  # the line above, then the usual report


def test_an_override_gets_no_fallback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fork = "git+https://github.com/someone/fork@v9"
    pip = FakePip(fail_on=fork)
    failure_message(monkeypatch, tmp_path, pip, source=fork)
    assert len(pip.calls) == 1  # what the student asked for, and nothing else


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


def test_success_installs_helpers_then_the_missing_extras_capped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
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
    (keep,) = {call[call.index("-c") + 1] for call in pip.calls}
    assert Path(keep).parent == tmp_path / ".cache" / "course_utils"  # the course's cache folder, nothing in HOME
    held = Path(keep).read_text()
    assert "torch==" in held and "transformers==" in held  # held at the installed builds
    assert "Setup failed" not in printed and "torch" in printed  # then the version report


@pytest.mark.parametrize(
    "env, where",
    [
        ({"COURSE_UTILS_CACHE": "mine"}, "mine"),
        ({"XDG_CACHE_HOME": "xdg"}, "xdg/course_utils"),
        ({"COURSE_UTILS_CACHE": "mine", "XDG_CACHE_HOME": "xdg"}, "mine"),
    ],
)
def test_pip_constraints_go_where_course_utils_keeps_its_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str], where: str
) -> None:
    """The cell runs before course_utils is installed, so it finds the cache folder itself: as course_utils.cache."""
    cell: dict = {}
    run_cell(monkeypatch, tmp_path, FakePip(), colab=False, namespace=cell)
    for key, value in env.items():
        monkeypatch.setenv(key, str(tmp_path / value))
    assert cell["cache_folder"]() == str(tmp_path / where)
    if "COURSE_UTILS_CACHE" in env:
        assert cache.cache_dir() == tmp_path / where  # the package's own rule, read at call time


def test_pip_constraints_fall_back_to_the_temp_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import tempfile

    cell: dict = {}
    run_cell(monkeypatch, tmp_path, FakePip(), colab=False, namespace=cell)
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("COURSE_UTILS_CACHE", str(tmp_path / "a-file" / "cache"))  # cannot be created
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    assert cell["cache_folder"]() == str(tmp_path / "tmp" / "course_utils")
    assert cache.fallback_dir() == tmp_path / "tmp" / "course_utils"  # where course_utils.cache falls back too


def test_nothing_installed_off_colab(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pip = FakePip(fail_on="")
    printed = run_cell(monkeypatch, tmp_path, pip, colab=False)
    assert pip.calls == [] and "torch" in printed


def test_kaggle_installs_as_colab_does(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    on_colab, on_kaggle = FakePip(), FakePip()
    run_cell(monkeypatch, tmp_path, on_colab)
    run_cell(monkeypatch, tmp_path, on_kaggle, colab=False, kaggle=True)
    assert on_kaggle.calls == on_colab.calls and len(on_kaggle.calls) == 2


def test_kaggle_failure_says_to_switch_internet_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    message = failure_message(monkeypatch, tmp_path, FakePip(fail_on="git+https://"), colab=False, kaggle=True)
    assert "On Kaggle, switch Internet on in the notebook's settings first." in message


@pytest.mark.parametrize(
    "env, host",
    [
        ({"COLAB_RELEASE_TAG": "x"}, "Colab"),
        ({"KAGGLE_KERNEL_RUN_TYPE": "Batch"}, "Kaggle"),
        ({"KAGGLE_KERNEL_RUN_TYPE": ""}, None),
        ({}, None),
    ],
)
def test_hosted_notebook(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str], host: str | None
) -> None:
    cell: dict = {}
    run_cell(monkeypatch, tmp_path, FakePip(), colab=False, namespace=cell)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert cell["hosted_notebook"]() == host


@pytest.mark.parametrize(
    "count, visible, started, expect",
    [
        (0, None, False, None),
        (1, None, False, None),
        (2, "1", False, None),
        (2, "", False, None),
        (2, None, False, "0"),
        (4, None, False, "0"),
        (2, None, True, None),
    ],
)
def test_one_gpu_decision(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, count: int, visible: str | None, started: bool, expect: str | None
) -> None:
    cell: dict = {}
    run_cell(monkeypatch, tmp_path, FakePip(), colab=False, namespace=cell)
    value, line = cell["one_gpu"](count, visible, started)
    assert value == expect
    if expect is not None:
        assert line == (
            f"{count} GPUs found: the course uses one (CUDA_VISIBLE_DEVICES=0), so every batch size and "
            "memory peak printed is one GPU's."
        )
    elif started and count > 1:
        assert "Restart the kernel, then run this cell first." in line and f"{count} GPUs found" in line
    else:
        assert line is None  # one GPU, none, or the choice was made already: nothing to say


@pytest.mark.parametrize("gpus", [0, 1, 2, 8])
def test_gpus_on_machine_counts_nvidia_smi_lines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, gpus: int) -> None:
    cell: dict = {}
    pip = FakePip(gpus=gpus)
    run_cell(monkeypatch, tmp_path, pip, colab=False, namespace=cell)
    assert cell["gpus_on_machine"]() == gpus and pip.calls == []


def test_gpus_on_machine_without_nvidia_smi_reads_the_driver(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cell: dict = {}
    run_cell(monkeypatch, tmp_path, FakePip(), colab=False, namespace=cell)

    def missing(what: object, **kwargs: object) -> None:
        raise FileNotFoundError(what)

    monkeypatch.setattr(subprocess, "run", missing)
    monkeypatch.setattr(os, "listdir", lambda path: ["0000:00:04.0", "0000:00:05.0"] if "nvidia" in path else [])
    assert cell["gpus_on_machine"]() == 2
    monkeypatch.setattr(os, "listdir", missing)  # no driver either
    assert cell["gpus_on_machine"]() == 0


def test_the_cap_is_the_newest_tested_version_and_the_floor_the_oldest() -> None:
    def pin(path: str, name: str) -> str:
        for line in (ROOT / path).read_text(encoding="utf-8").splitlines():
            if line.startswith(f"{name}=="):
                return line.split("==")[1].strip()
        raise AssertionError(f"{path} pins no {name}")

    assert about.SUPPORTED["bitsandbytes"] == (
        pin("requirements-floor.txt", "bitsandbytes"),
        pin("requirements.txt", "bitsandbytes"),
    )
    assert pin("requirements-colab.txt", "bitsandbytes") == about.SUPPORTED["bitsandbytes"][1]
    source = build_notebooks.setup_cell_source([])
    assert f"CAPS = {{'bitsandbytes': '{about.SUPPORTED['bitsandbytes'][1]}'}}" in source
