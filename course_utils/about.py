"""Facts about the course itself: where it lives and the notebooks in teaching order.

This is the one place that names the repository. Badges, the Colab install line and the
prev/next links are stamped from it by ``scripts/build_notebooks.py``.
"""
from __future__ import annotations

from typing import NamedTuple

#: GitHub "owner/name" of this course. Change it here (and re-run the build script) when the repo moves.
REPO = "pack-the-bag/single-gpu-tricks"
#: Branch that Colab badges and the Colab install line point to.
BRANCH = "main"


class NotebookInfo(NamedTuple):
    """One notebook of the module: its file name and its title."""

    filename: str
    title: str


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


def install_spec() -> str:
    """The pip requirement that installs this package straight from the repository."""
    return f"course-utils @ git+https://github.com/{REPO}@{BRANCH}"
