"""``--execute``: a notebook built, run top to bottom in a fresh kernel on CPU, offline, and written with its
outputs; its cell times and this machine recorded in ``notebooks/cell_times.json``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import nbformat

from . import paths
from .docs import stamp_or_check_docs
from .notebook import build
from .times import record_times

#: The command line's script: with several notebooks, each runs in a process of its own.
SCRIPT = Path(__file__).resolve().parents[1] / "build_notebooks.py"

#: Environment for executing notebooks: CPU only, offline, fixed hashing, quiet progress bars.
EXEC_ENV = {
    "CUDA_VISIBLE_DEVICES": "",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONHASHSEED": "0",
    "PYTHONWARNINGS": "ignore::DeprecationWarning",
}


def _stamp_time(stamps: dict, key: str) -> datetime:
    """One of the kernel's ISO timestamps (``Z`` for UTC) that nbclient records for a cell."""
    return datetime.fromisoformat(stamps[key].replace("Z", "+00:00"))


def execute(nb: nbformat.NotebookNode, timeout: int) -> dict[str, float]:
    """Run ``nb`` top to bottom in a fresh kernel of this Python, on CPU, offline; return each code cell's seconds.

    The seconds are measured by the kernel (from the cell's start to its reply) and kept out of the notebook.
    """
    from nbclient import NotebookClient  # slow to import, and only this mode needs it

    os.environ.update(EXEC_ENV)
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(paths.OUT)}},
        store_widget_state=True,
        record_timing=True,
    )
    client.execute()
    seconds = {}
    for cell in nb.cells:
        stamps = cell.metadata.pop("execution", None)
        if cell.cell_type == "code" and stamps:
            start = _stamp_time(stamps, "iopub.execute_input")
            end = _stamp_time(stamps, "shell.execute_reply")
            seconds[cell["id"]] = round((end - start).total_seconds(), 1)
    return seconds


def execute_one(stem: str, timeout: int) -> int:
    """Build, execute top to bottom, record the cell times, write; stamp the README and the instructor guide."""
    target = paths.notebook(stem)
    fresh = build(stem)
    start = time.perf_counter()
    seconds = execute(fresh, timeout)
    fresh = build(stem, executed=fresh)  # slides again from the source, now that outputs have heights
    print(f"executed {target.name} in {time.perf_counter() - start:.1f} s")
    record_times(stem, seconds)
    nbformat.write(fresh, target)
    print(f"wrote {paths.shown(target)}")
    return stamp_or_check_docs(check=False)


def execute_in_own_process(stem: str, timeout: int) -> int:
    """:func:`execute_one` in a new process; its exit status.

    One process per notebook: a second NotebookClient in the same process was seen to stall for the whole cell
    timeout after the first one finished.
    """
    done = subprocess.run([sys.executable, str(SCRIPT), "--execute", "--timeout", str(timeout), stem])
    return done.returncode
