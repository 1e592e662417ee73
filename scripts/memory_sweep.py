#!/usr/bin/env python3
"""Maintainers: measure training steps over a grid, and store the measurements in a data file with the machine.

Every case is measured (course_utils.measure: on a CPU in a fresh, bounded child process; a warm-up step, then one
measured step) and written to ``--out``, a JSON file: the machine (CPU model, flags, cores), the date, the library
versions, and per case the step's arguments and the measured figures (peak, memory at the step's start, what was
measured). The estimate is never stored: :mod:`course_utils.sweeps` compares the stored measurements with the step
estimate of the code as it is, so the comparison stays true when the estimator changes. Notebook 05 draws
``data/sweeps/smollm2-135m-cpu.json``.

The default grid is method {full, lora, lora-bf16, qlora} x batch {1, 4, 16} x seq {128, 512} x checkpointing
{off, on} on SmolLM2-135M: 48 measured steps, more than an hour on a 2-core CPU (bfloat16 is slow on CPUs without
bf16 instructions). Each method's cases share one bounded child process that forks a fresh process per case
(:func:`course_utils.measure.measure_training_steps`). The file is rewritten as each method finishes, and a case
already there is not measured again, so an interrupted sweep resumes (on the same machine and versions only).

    python scripts/memory_sweep.py --methods lora,full --batches 1,4,8 --seqs 128 --checkpointing off \\
        --out data/sweeps/smollm2-135m-cpu.json                      # the six cases notebook 05 shows
    python scripts/memory_sweep.py --out sweep.json --table-only      # the table of what is there
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import itertools
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # machine_info, beside this script

from course_utils import sweeps  # noqa: E402 - after the path line above
from course_utils.hardware import as_device  # noqa: E402 - after the path line above
from course_utils.measure import Skipped, measure_training_steps  # noqa: E402 - after the path line above
from course_utils.memory import METHODS  # noqa: E402 - after the path line above
from machine_info import cpu_info  # noqa: E402 - after the path line above

KEYS = ("method", "batch", "seq", "checkpointing")
#: The rest of every measured step, stored with it (measure_training_step's defaults, spelled out).
FIXED = {
    "lora_rank": 8,
    "targets": ["q_proj", "v_proj"],
    "optimizer": "adamw",
    "autocast": None,
    "accumulation": 1,
    "steps": 1,
}
#: The versions stored with the measurements.
PACKAGES = ("torch", "transformers", "peft", "accelerate", "bitsandbytes")
#: The CPU flags worth storing: the vector and matrix instruction sets PyTorch's kernels choose between.
FLAG_PREFIXES = ("avx", "amx", "fma", "sse4", "bf16", "asimd", "sve")


def cases(
    methods: Iterable[str], batches: Iterable[int], seqs: Iterable[int], checkpointing: Iterable[bool]
) -> list[dict[str, Any]]:
    """Every combination, as keyword arguments of measure_training_step (and estimate_step, less ``steps``)."""
    return [{**dict(zip(KEYS, combo)), **FIXED} for combo in itertools.product(methods, batches, seqs, checkpointing)]


def machine(device: Any) -> dict[str, Any]:
    """Where and with what the sweep runs: CPU, cores, flags, PyTorch's kernel choice, versions, date."""
    import torch

    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    model, found = cpu_info()  # the one /proc/cpuinfo reader of the scripts
    flags = sorted(f for f in (found or ()) if f.startswith(FLAG_PREFIXES))
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {
        "device": str(device),
        "gpu": gpu,
        "cpu": model,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_flags": flags,
        "os": platform.platform(),
        "versions": versions,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def run_cases(config: str, todo: list[dict[str, Any]], device: Any, timeout_s: float) -> list[dict[str, Any]]:
    """Measure ``todo`` on ``device`` (one child process on a CPU, a fresh fork per case); their stored rows."""
    rows = []
    for case, m in zip(todo, measure_training_steps(config, todo, device=device, timeout_s=timeout_s)):
        if isinstance(m, Skipped):
            rows.append({"step": case, "error": m.reason.strip().splitlines()[-1][:200]})
        else:
            rows.append({"step": case, "measured": m.to_dict()})
    return rows


def key(step: dict[str, Any]) -> tuple[Any, ...]:
    """A case's identity in the grid."""
    return tuple(step[k] for k in KEYS)


def table(sweep: sweeps.Sweep, wanted: set[tuple[Any, ...]]) -> str:
    """The stored rows of ``wanted`` cases as Markdown, next to today's estimate, then the largest error."""
    lines = [
        "| method | batch | seq | checkpointing | estimate GB | measured GB | error | in step: estimate / measured |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    rows = [r for r in sweep.rows if key(r["step"]) in wanted]
    done = sweeps.Sweep(sweep.config, sweep.machine, [r for r in rows if "measured" in r]).compare()
    compared = iter(done)
    for r in rows:
        s = r["step"]
        head = f"| {s['method']} | {s['batch']} | {s['seq']} | {'on' if s['checkpointing'] else 'off'} "
        if "error" in r:
            lines.append(head + f"| | | failed: {r['error']} | |")
            continue
        c = next(compared)
        lines.append(
            head + f"| {c.estimate_gb:.3f} | {c.measured_gb:.3f} | {c.error_pct:+.1f} % "
            f"| {c.in_step_estimate_gb:.3f} / {c.in_step_measured_gb:.3f} |"
        )
    if done:
        lines.append(
            f"\n{len(done)} cases measured; largest error {sweeps.largest_error_pct(done):+.1f} % "
            f"(the course states {sweeps.TOLERANCE_PCT:g} %)."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="smollm2-135m", help="preset name or config.json path")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--seqs", default="128,512")
    parser.add_argument("--checkpointing", default="off,on", help="off, on, or off,on")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write (and resume from)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per measured case")
    parser.add_argument("--table-only", action="store_true", help="print the table of --out; measure nothing")
    args = parser.parse_args(argv)
    try:
        grid = cases(
            [m for m in args.methods.split(",") if m],
            [int(b) for b in args.batches.split(",")],
            [int(s) for s in args.seqs.split(",")],
            [{"off": False, "on": True}[c] for c in args.checkpointing.split(",")],
        )
    except (ValueError, KeyError) as err:
        parser.error(f"a grid option is malformed ({err})")
    if not args.table_only:
        device = as_device(None)
        here = machine(device)
        doc = {"config": args.config, "machine": here, "rows": []}
        if args.out.exists():
            doc = json.loads(args.out.read_text())
            same = {k: doc["machine"].get(k) for k in ("cpu", "device", "versions")}
            if doc["config"] != args.config or same != {k: here[k] for k in same}:
                parser.error(f"{args.out} holds another config, machine or library versions: choose another --out")
        seen = {key(r["step"]) for r in doc["rows"] if "measured" in r}
        doc["rows"] = [r for r in doc["rows"] if "measured" in r]  # failed cases are tried again
        todo = [case for case in grid if key(case) not in seen]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        for method in dict.fromkeys(case["method"] for case in todo):  # one child process per method
            for row in run_cases(args.config, [c for c in todo if c["method"] == method], device, args.timeout):
                doc["rows"].append(row)
                print(json.dumps(row), flush=True)
            args.out.write_text(json.dumps(doc, indent=1) + "\n")
    sweep = sweeps.load(args.out)
    print(f"measured on: {sweep.machine_line()}")
    print(table(sweep, {key(c) for c in grid}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
