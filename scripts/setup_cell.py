# @title Setup: the course helpers, versions and hardware (run me first)
# Run this cell first. On Colab or Kaggle it installs the course helpers at the version this notebook was built
# with, and the few libraries below where missing or too old; never torch or transformers: the host's own builds
# stay. On a machine with several GPUs it makes the course use one. To install the helpers from a fork or a
# mirror, set COURSE_UTILS_SOURCE first, e.g.
# %env COURSE_UTILS_SOURCE=git+https://github.com/YOU/FORK@main
# (This file is the template of every notebook's first cell: scripts/build_notebooks.py fills in the values of
# the capitalised names below, and ruff checks it like any other script.)
import importlib
import importlib.metadata
import os
import subprocess
import sys
import tempfile

SOURCE_ENV = "COURSE_UTILS_SOURCE"  # the variable that points the install elsewhere
RELEASE = "v0.0.0"  # the git tag of these helpers
REPO_URL = "https://github.com/OWNER/REPO"
HELPERS = os.environ.get(SOURCE_ENV) or "course-utils"  # pip's install spec
MAIN = "course-utils"  # pip's install spec of the main branch, for while the tag is not published
NEEDS = {"peft": "0"}  # package: oldest version the course works with
CAPS = {"bitsandbytes": "0"}  # package: newest version the course was tested with (installed no newer)


class SetupFailed(Exception):
    def _render_traceback_(self):  # Jupyter shows this one message instead of a traceback
        return [f"Setup failed: {self}"]


def hosted_notebook():
    # "Colab", "Kaggle", or None on your own machine (where nothing is installed)
    if any(k.startswith("COLAB_") for k in os.environ) or "google.colab" in sys.modules:
        return "Colab"
    if os.environ.get("KAGGLE_KERNEL_RUN_TYPE"):
        return "Kaggle"
    return None


def gpus_on_machine():
    # Counted without torch (CUDA reads CUDA_VISIBLE_DEVICES once, when torch first starts it)
    try:
        listed = subprocess.run(
            ["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=30
        )
        if listed.returncode == 0:
            return sum(line.startswith("GPU ") for line in listed.stdout.splitlines())
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def cuda_started():
    # True when this kernel's torch has already started CUDA: too late to hide a GPU
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def one_gpu(count, visible, started):
    # (the CUDA_VISIBLE_DEVICES value to set, or None; the line to print, or None)
    if count < 2 or visible is not None:  # one GPU or none, or the choice was made already
        return None, None
    if started:
        return None, (
            f"{count} GPUs found, and torch already started CUDA on all of them in this kernel: the "
            "course uses one GPU. Restart the kernel, then run this cell first."
        )
    return "0", (
        f"{count} GPUs found: the course uses one (CUDA_VISIBLE_DEVICES=0), so every batch size and "
        "memory peak printed is one GPU's."
    )


def version_ints(text):
    return [int(p) for p in text.split("+")[0].split(".")[:3] if p.isdigit()]


def too_old(name, floor):
    try:
        have = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return True
    return version_ints(have) < version_ints(floor)


def cache_folder():
    # The course's cache folder, found as course_utils.cache finds it (not installed yet): COURSE_UTILS_CACHE, else
    # ~/.cache/course_utils (XDG_CACHE_HOME respected), else the system's temporary folder where that is read-only
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.environ.get("COURSE_UTILS_CACHE") or os.path.join(base, "course_utils")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        folder = os.path.join(tempfile.gettempdir(), "course_utils")
        os.makedirs(folder, exist_ok=True)
    return folder


def run_pip(*args):
    # pip install, torch and transformers held at their installed builds: (it worked, its last lines)
    keep = os.path.join(cache_folder(), "pip-constraints.txt")  # pip may not touch these two
    kept = [n for n in ("torch", "transformers") if not too_old(n, "0")]
    with open(keep, "w") as f:
        f.writelines(f"{n}=={importlib.metadata.version(n)}\n" for n in kept)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "-c", keep, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    importlib.invalidate_caches()  # so that the packages just installed are found
    said = ((done.stdout or "") + (done.stderr or "")).strip().splitlines()[-15:] or ["(nothing)"]
    return done.returncode == 0, said


def pip_install(*args, what, hint):
    worked, said = run_pip(*args)
    if not worked:
        raise SetupFailed(f"pip could not install {what}.\n{hint}\npip's last lines:\n    " + "\n    ".join(said))


def install_helpers(host):
    elsewhere = f"%env {SOURCE_ENV}=git+https://github.com/YOU/FORK@main"
    offline = " On Kaggle, switch Internet on in the notebook's settings first." if host == "Kaggle" else ""
    if os.environ.get(SOURCE_ENV):
        hint = (
            f"Check that value, or point it elsewhere in a new cell, e.g.\n    {elsewhere}\n"
            f"or clear it (%env {SOURCE_ENV}=) to use the release tag {RELEASE}; then run this cell again." + offline
        )
        pip_install("--no-deps", HELPERS, what=f"the course helpers from {SOURCE_ENV}={HELPERS}", hint=hint)
        return
    if run_pip("--no-deps", HELPERS)[0]:
        return
    hint = (
        "The tag may not be published yet, and the main branch did not install either."
        + offline
        + f" To install the helpers from elsewhere (a fork, a branch), run\n    {elsewhere}\n"
        "in a new cell, then run this cell again."
    )
    pip_install(
        "--no-deps", MAIN, what=f"the course helpers from {REPO_URL} at tag {RELEASE} or its main branch", hint=hint
    )
    print(
        f"The helpers' tag {RELEASE} did not install (not published yet?): installed {REPO_URL}'s main branch "
        f"instead, course-utils {importlib.metadata.version('course-utils')}."
    )


visible_value, gpu_line = one_gpu(gpus_on_machine(), os.environ.get("CUDA_VISIBLE_DEVICES"), cuda_started())
if visible_value is not None:
    os.environ["CUDA_VISIBLE_DEVICES"] = visible_value  # before anything below imports torch
if gpu_line:
    print(gpu_line)
host = hosted_notebook()
if host:
    install_helpers(host)
    missing = [
        f"{name}>={floor}" + (f",<={CAPS[name]}" if name in CAPS else "")
        for name, floor in NEEDS.items()
        if too_old(name, floor)
    ]
    if missing:
        pip_install(*missing, what=", ".join(missing), hint="The 4-bit and LoRA cells need them.")

from course_utils.hardware import setup_report  # noqa: E402 - after the install above

print(setup_report())
