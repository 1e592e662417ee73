"""Facts about the course itself: where it lives and the notebooks in teaching order.

This is the one place that names the repository. Badges, the Colab install line and the
prev/next links are stamped from it by ``scripts/build_notebooks.py``.
"""

import re
from typing import NamedTuple

from course_utils import checks

#: GitHub "owner/name" of this course. Change it here (and re-run the build script) when the repo moves.
REPO = "pack-the-bag/single-gpu-tricks"
#: Branch that Colab badges point to, and that the setup cell installs the helpers from when the release tag
#: is not published yet.
BRANCH = "main"
#: This package's version. The setup cell (on Colab or Kaggle) installs the helpers from the git tag ``v{VERSION}``,
#: so a notebook always gets the helpers it was built with (:data:`BRANCH` while the tag is not published); tag
#: each release and check it with scripts/release_check.py (see CONTRIBUTING.md, "Releasing").
VERSION = "0.2.0"
#: Environment variable that overrides where the setup cell installs the helpers from (a fork, a
#: mirror, a branch, a wheel): any requirement pip understands.
SOURCE_ENV = "COURSE_UTILS_SOURCE"

#: Library versions the course supports: (oldest, newest tested). Hosted images lag PyPI by months, so the
#: floor is what the notebooks were tested with on the oldest stack (requirements-floor.txt), the top what
#: requirements.txt pins. torch's floor is the oldest release with every API the notebooks call
#: (``torch.amp.GradScaler("cuda")`` needs 2.3).
SUPPORTED: dict[str, tuple[str, str]] = {
    "torch": ("2.3", "2.13.0"),
    "transformers": ("4.57.6", "5.24.0"),
    "peft": ("0.17.1", "0.21.2"),
    "accelerate": ("1.10.1", "1.15.0"),
    "bitsandbytes": ("0.48.2", "0.50.2"),
}
#: What the setup cell installs on Colab or Kaggle when missing or older than its floor. Never torch or transformers:
#: the hosted image's own builds stay (replacing torch would break its CUDA setup).
COLAB_INSTALLS = ("bitsandbytes", "accelerate", "peft")
#: Of those, what the setup cell installs no newer than SUPPORTED's top (a bitsandbytes release can change its
#: 4-bit kernels and CPU path): ``bitsandbytes>=0.48.2,<=0.50.2``.
COLAB_CAPPED = ("bitsandbytes",)


class NotebookInfo(NamedTuple):
    """One notebook of the module: its file name and its title."""

    filename: str
    title: str

    @property
    def lesson(self) -> str:
        """Its lesson module in ``course_utils.lessons``: the file name without number and suffix."""
        return self.filename.removesuffix(".ipynb").split("_", 1)[1]


#: The module's notebooks, in teaching order.
NOTEBOOKS: tuple[NotebookInfo, ...] = (
    NotebookInfo("01_quantization.ipynb", "Quantization: keep fewer digits"),
    NotebookInfo("01b_real_models_qlora.ipynb", "Real models in 4 bits, and QLoRA"),
    NotebookInfo("02_mixed_precision.ipynb", "Mixed precision: fast where we can, precise where we must"),
    NotebookInfo("03_gradient_accumulation.ipynb", "Gradient accumulation: several trips"),
    NotebookInfo("04_memory_budget.ipynb", "Memory budgets: will it fit?"),
    NotebookInfo("05_memory_tricks.ipynb", "Three more memory tricks, measured"),
)


def colab_url(filename: str) -> str:
    """The 'Open in Colab' address of a notebook in this repository."""
    return f"https://colab.research.google.com/github/{REPO}/blob/{BRANCH}/notebooks/{filename}"


def release_tag() -> str:
    """The git tag of this version of the helpers, e.g. ``v0.2.0``."""
    return f"v{VERSION}"


def repo_url() -> str:
    """The repository's web address, e.g. ``https://github.com/pack-the-bag/single-gpu-tricks``."""
    return f"https://github.com/{REPO}"


def install_spec(ref: str | None = None) -> str:
    """The pip requirement that installs the package from the repository at ``ref`` (default: this release's tag)."""
    if ref is not None and (not isinstance(ref, str) or not re.fullmatch(r"[\w][\w./-]*", ref)):
        raise ValueError(f"ref must be a git tag or branch name such as 'main' or 'v0.2.0', got {ref!r}")
    return f"course-utils @ git+{repo_url()}@{ref or release_tag()}"


def _as_tuple(version: str) -> tuple[int, ...]:
    """'4.57.6' -> (4, 57, 6); a pre-release or local suffix ('2.13.0+cu126', '5.0.0rc1') is cut off."""
    numbers = re.match(r"\d+(\.\d+)*", version.strip()) if isinstance(version, str) else None
    if numbers is None:
        raise ValueError(f"version must be a string that starts with a number such as '4.57.6', got {version!r}")
    return tuple(int(n) for n in numbers.group().split("."))


def version_status(package: str, installed: str | None) -> str | None:
    """None when ``installed`` is inside :data:`SUPPORTED`'s range for ``package``; else one line saying what to do.

    Newer than tested is a note (it will probably work); older than the floor, or missing, says how to fix it.
    """
    low, high = SUPPORTED[checks.choice(package, "package", SUPPORTED)]
    if installed is None:
        return f"{package} is not installed: pip install '{package}>={low}'"
    have, top = _as_tuple(installed), _as_tuple(high)
    if have < _as_tuple(low):
        fix = f"pip install -U '{package}>={low}', then restart the runtime"
        return f"{package} {installed} is older than the course supports ({low} to {high}): {fix}"
    if have[: len(top)] > top:
        return f"note: {package} {installed} is newer than the course has tested ({low} to {high}); report problems"
    return None
