"""Stored measurements of training steps (``scripts/memory_sweep.py``'s files), next to the estimate of today's code.

A sweep file holds the machine it was measured on (CPU, cores, flags, library versions, date) and, per case, the
step's arguments and the measured figures (:class:`course_utils.measure.StepMeasurement`'s fields). No estimate is
stored: :func:`compare` asks :func:`course_utils.step_memory.estimate_step` now, so a change to the estimator shows
up here, and ``tests/test_sweeps.py`` holds it to :data:`TOLERANCE_PCT`. Plain arithmetic on a JSON file: nothing
here measures or imports torch.
"""

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from course_utils import data_path
from course_utils.step_memory import error_percent, estimate_step
from course_utils.units import GB

#: The accuracy the course states for a step estimate against a measured peak: within this many percent.
TOLERANCE_PCT = 5.0
#: The sweep notebook 05 draws: SmolLM2-135M, LoRA and full fine-tuning at batch 1, 4 and 8 x 128 tokens, on a CPU.
SMOLLM2_CPU = "smollm2-135m-cpu.json"
#: Step arguments a measurement takes and an estimate does not.
_MEASURE_ONLY = ("steps", "compile")


class Compared(NamedTuple):
    """One stored case next to today's estimate (GB). ``in_step_*``: the peak less what the step started with
    (estimate: baseline, runtime, weights, optimizer states; measured: the memory in use when the step began)."""

    label: str
    estimate_gb: float
    measured_gb: float
    error_pct: float
    in_step_estimate_gb: float
    in_step_measured_gb: float
    baseline_gb: float


class Sweep(NamedTuple):
    """A sweep file: the ``config`` measured, the ``machine`` it ran on, and its ``rows`` (``step`` with
    ``measured`` or ``error``)."""

    config: str
    machine: dict[str, Any]
    rows: list[dict[str, Any]]

    def machine_line(self) -> str:
        """Where the rows were measured, in one line: CPU, cores, bfloat16 instructions, versions, date."""
        m, v = self.machine, self.machine["versions"]
        bf16 = [f for f in m["cpu_flags"] if "bf16" in f]
        where = m["gpu"] or f"{m['cpu']}, {m['cores']} cores, bfloat16 instructions: {', '.join(bf16) or 'none'}"
        versions = f"Python {v['python']}, torch {v['torch']}, transformers {v['transformers']}, peft {v['peft']}"
        return f"{where}; {versions}; {m['date'][:10]}"

    def compare(self) -> list[Compared]:
        """Each measured row next to today's estimate for the same step and counter (failed rows left out)."""
        device = "cuda" if self.machine["device"].startswith("cuda") else "cpu"
        out = []
        for case in (r for r in self.rows if "measured" in r):
            step, m = case["step"], case["measured"]
            kwargs = {k: v for k, v in step.items() if k not in _MEASURE_ONLY}
            est = estimate_step(self.config, **{**kwargs, "autocast": bool(kwargs.get("autocast"))}, device=device)
            fixed = est.baseline_bytes + est.runtime_bytes + est.weights_bytes + est.optimizer_bytes
            est_gb, measured_gb = est.peak_bytes / GB, m["peak_bytes"] / GB
            in_step_est, in_step_measured = (est.peak_bytes - fixed) / GB, (m["peak_bytes"] - m["start_bytes"]) / GB
            error = error_percent(est.peak_bytes, m["peak_bytes"])
            label = f"{step['method']} b{step['batch']}"
            out.append(
                Compared(label, est_gb, measured_gb, error, in_step_est, in_step_measured, m["baseline_bytes"] / GB)
            )
        return out


def load(path: str | os.PathLike | None = None) -> Sweep:
    """Read a sweep file; ``path`` None means the one notebook 05 draws (:data:`SMOLLM2_CPU`)."""
    path = data_path("sweeps", SMOLLM2_CPU) if path is None else path
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not {"config", "machine", "rows"} <= doc.keys():
        raise ValueError(f"{path} is not a sweep file: a JSON object with config, machine and rows")
    return Sweep(doc["config"], doc["machine"], doc["rows"])


def largest_error_pct(compared: list[Compared]) -> float:
    """The error of the case farthest from its estimate (signed, in percent)."""
    if not compared:
        raise ValueError("compared must hold at least one measured case")
    return max((c.error_pct for c in compared), key=abs)
