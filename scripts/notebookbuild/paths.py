"""Where the build reads and writes: the sources, the notebooks, their cell times, the README and the guide.

Every part reads these here at the time of use (``paths.OUT``, never a copy), so a test points the whole build at
a temporary folder by setting them in this module.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "notebooks" / "src"
OUT = ROOT / "notebooks"
TIMES = OUT / "cell_times.json"
README = ROOT / "README.md"
GUIDE = ROOT / "INSTRUCTORS.md"


def notebook(stem: str) -> Path:
    """The built notebook ``<OUT>/<stem>.ipynb``."""
    return OUT / f"{stem}.ipynb"


def shown(path: Path) -> str:
    """``path`` as the build's messages give it: relative to :data:`ROOT`."""
    return str(path.relative_to(ROOT))
