"""course_utils: the helpers behind the notebooks of "Pack the bag smarter".

The core, one module per concept: ``hardware`` (what machine is this?), ``quant`` (quantization), ``precision``
(mixed precision), ``accumulation`` (gradient accumulation), ``memory`` / ``step_memory`` / ``bottleneck`` (memory
estimates), ``measure`` and ``peak`` (measured steps), ``models`` (loading language models, with ``hub``,
``standin``, ``packaged``, ``footprint``, ``lora``, ``tickets``); shared helpers in ``checks``,
``units``, ``quiet``, ``configs``, ``architecture``, ``cache``; the command line in ``cli``. The core imports no
matplotlib and no ipywidgets. ``lessons`` has one module per notebook: its charts, widgets and exercises.
Modules are imported on demand, so ``import course_utils`` stays cheap.
"""

from pathlib import Path

from course_utils.about import VERSION as __version__  # noqa: F401 - the package's version, set in about.py


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
