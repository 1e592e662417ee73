#!/usr/bin/env python3
"""Build the course notebooks from their sources, stamp them, and (re-)execute them.

Sources live in ``notebooks/src/NN_name.py`` in jupytext's "percent" format, with one marker of ours,
``# %% [setup] extras=[...]``, where the standard setup cell goes (``notebookbuild/source.py`` describes the
format). The first markdown cell gets the Colab badge and the prev/next links stamped under it, from
``course_utils.about`` (the one place that names the repository).

Usage (from the repo root, with the course environment):

    python scripts/build_notebooks.py --execute  # build and execute top to bottom on CPU, save outputs
    python scripts/build_notebooks.py            # build without outputs: only where no executed notebook exists
    python scripts/build_notebooks.py --no-outputs 02_mixed_precision   # overwrite an executed one, outputs dropped
    python scripts/build_notebooks.py --execute 02_mixed_precision   # one notebook
    python scripts/build_notebooks.py --check    # exit 1 if a committed notebook drifted from its source
    python scripts/build_notebooks.py --restamp  # prose changed, code did not: keep the outputs; restamp the docs
    python scripts/build_notebooks.py --slides build/slides   # export static HTML slides (reveal.js)

Stamped from the sources, never written by hand:
- the header: study time (``notebook_layout.study_minutes``), the Colab badge and prev/next links;
- slide metadata on every cell (``notebook_layout.slide_types``): every ``#``/``##``/``###`` heading starts a
  slide, a slide that grows taller than the screen is split, and ``# %% [markdown] slide="notes"`` (or any of
  ``notebook_layout.SLIDE_TYPES``) in a source overrides the rule for that cell. RISE (jupyterlab-rise) and
  nbconvert's slides read it;
- with ``--execute``, each cell's run time and this machine (``machine_info.machine_record``: CPU, cores,
  AVX-512-bf16 and AMX, OS, torch, date) into ``notebooks/cell_times.json``;
- from ``notebooks/cell_times.json`` (with ``--execute``, ``--restamp`` and a plain build; ``--check`` fails when
  they drifted): README.md's run-time sentence and INSTRUCTORS.md's cell-time table, each between its markers.

This file is the entry point; the build lives in the package ``scripts/notebookbuild/``, one mode per module (its
``__init__`` lists them). The names other scripts and tests use are importable from here.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # notebookbuild/ and notebook_layout.py, beside this file
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # course_utils from this clone, installed or not
from notebookbuild.cli import main
from notebookbuild.notebook import build
from notebookbuild.source import SETUP_CELL_METADATA, parse_source, setup_cell_source

__all__ = ["SETUP_CELL_METADATA", "build", "main", "parse_source", "setup_cell_source"]

if __name__ == "__main__":
    raise SystemExit(main())
