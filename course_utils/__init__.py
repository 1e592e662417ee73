"""course_utils: the helpers behind the notebooks of "Pack the bag smarter".

One module per topic: ``hardware`` (what machine is this?), ``quant`` (quantization),
``precision`` (mixed precision), ``accumulation`` (gradient accumulation), ``memory``
(memory budgets), ``models`` (real and stand-in language models), ``plots`` and ``widgets``.
Modules are imported on demand, so ``import course_utils`` stays cheap.
"""
from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"


def data_path(*parts: str) -> Path:
    """Path of a file shipped in the course's ``data/`` folder.

    Works from a clone (the repo's ``data/``) and from an installed package (``course_utils/data``).
    """
    here = Path(__file__).resolve().parent
    for base in (here.parent / "data", here / "data"):
        candidate = base.joinpath(*parts)
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"course data file not found: {'/'.join(parts)}")
