#@title Setup: the course helpers, versions and hardware (run me first)
# Run this cell first. On Colab it installs the course helpers at the version this notebook was built with, and
# the few libraries below where missing or too old; never torch or transformers: Colab's own builds stay. To
# install the helpers from a fork or a mirror, set COURSE_UTILS_SOURCE first, e.g.
# %env COURSE_UTILS_SOURCE=git+https://github.com/YOU/FORK@main
# (This file is the template of every notebook's first cell: scripts/build_notebooks.py fills in the values of
# the capitalised names below, and ruff checks it like any other script.)
import importlib.metadata
import os
import subprocess
import sys

SOURCE_ENV = "COURSE_UTILS_SOURCE"  # the variable that points the install elsewhere
RELEASE = "v0.0.0"  # the git tag of these helpers
REPO_URL = "https://github.com/OWNER/REPO"
HELPERS = os.environ.get(SOURCE_ENV) or "course-utils"  # pip's install spec
NEEDS = {"peft": "0"}  # package: oldest version the course works with
CAPS = {"bitsandbytes": "0"}  # package: newest version the course was tested with (installed no newer)


class SetupFailed(Exception):
    def _render_traceback_(self):  # Jupyter shows this one message instead of a traceback
        return [f"Setup failed: {self}"]


def on_colab():
    return any(k.startswith("COLAB_") for k in os.environ) or "google.colab" in sys.modules


def version_ints(text):
    return [int(p) for p in text.split("+")[0].split(".")[:3] if p.isdigit()]


def too_old(name, floor):
    try:
        have = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return True
    return version_ints(have) < version_ints(floor)


def pip_install(*args, what, hint):
    keep = os.path.join(os.path.expanduser("~"), ".course-keep.txt")  # pip may not touch these two
    kept = [n for n in ("torch", "transformers") if not too_old(n, "0")]
    with open(keep, "w") as f:
        f.writelines(f"{n}=={importlib.metadata.version(n)}\n" for n in kept)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-c", keep, *args],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        said = ((done.stdout or "") + (done.stderr or "")).strip().splitlines()[-15:] or ["(nothing)"]
        raise SetupFailed(f"pip could not install {what}.\n{hint}\npip's last lines:\n    " + "\n    ".join(said))


if on_colab():
    elsewhere = f"%env {SOURCE_ENV}=git+https://github.com/YOU/FORK@main"
    if os.environ.get(SOURCE_ENV):
        where = f"{SOURCE_ENV}={HELPERS}"
        hint = (f"Check that value, or point it elsewhere in a new cell, e.g.\n    {elsewhere}\n"
                f"or clear it (%env {SOURCE_ENV}=) to use the release tag {RELEASE}; then run this cell again.")
    else:
        where = f"{REPO_URL} at tag {RELEASE}"
        hint = ("That tag may not be published yet. To install the helpers from elsewhere (a fork, a branch), run\n"
                f"    {elsewhere}\nin a new cell, then run this cell again.")
    pip_install("--no-deps", HELPERS, what=f"the course helpers from {where}", hint=hint)
    missing = [f"{name}>={floor}" + (f",<={CAPS[name]}" if name in CAPS else "")
               for name, floor in NEEDS.items() if too_old(name, floor)]
    if missing:
        pip_install(*missing, what=", ".join(missing), hint="The 4-bit and LoRA cells need them.")

from course_utils.hardware import setup_report  # noqa: E402 - after the install above

print(setup_report())
