"""``notebooks/cell_times.json``: each notebook's cell seconds from its last ``--execute`` run, and that machine."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from machine_info import machine_record

from course_utils import about

from . import paths


def load_times() -> dict[str, dict]:
    """``notebooks/cell_times.json``: per notebook stem, its machine, date, total seconds and cell seconds."""
    if not paths.TIMES.exists():
        return {}
    return json.loads(paths.TIMES.read_text(encoding="utf-8"))


def record_times(stem: str, seconds: dict[str, float]) -> None:
    """Store one notebook's cell times and this machine in ``notebooks/cell_times.json`` (other entries stay)."""
    times = load_times()
    times[stem] = {
        "machine": machine_record(),
        "date": datetime.now().date().isoformat(),
        "total_s": round(sum(seconds.values()), 1),
        "cells": seconds,
    }
    paths.TIMES.write_text(json.dumps(times, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def timed_notebooks() -> list[tuple[str, dict]]:
    """(stem, entry) of :func:`load_times` in teaching order, for every notebook that exists and has times."""
    times = load_times()
    stems = [Path(info.filename).stem for info in about.NOTEBOOKS]
    return [(stem, times[stem]) for stem in stems if stem in times and paths.notebook(stem).exists()]
