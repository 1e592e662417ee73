#!/usr/bin/env python3
"""Maintainers: the step estimate against the measured peak, over a grid of training steps.

Every case is estimated (course_utils.step_memory) and measured (course_utils.measure: on a CPU in a fresh,
bounded child process) on the same device, and the error printed as a Markdown table. The default grid is
method {full, lora, lora-bf16, qlora} x batch {1, 4, 16} x seq {128, 512} x checkpointing {off, on} on
SmolLM2-135M: 48 measured steps, more than an hour on a 2-core CPU (bfloat16 is slow on CPUs without bf16
instructions). Each method's cases share one bounded child process that forks a fresh process per case
(:func:`course_utils.measure.measure_training_steps`). Rows are appended to ``--out`` (JSON lines) as each
method finishes, and a case already there is not measured again, so an interrupted sweep resumes. The table
always shows the estimate of the code as it is now, next to the stored measurement.

    python scripts/memory_sweep.py --out sweep.jsonl                 # the whole grid
    python scripts/memory_sweep.py --methods qlora --batches 4 --seqs 256 --checkpointing off
    python scripts/memory_sweep.py --out sweep.jsonl --table-only    # print the table of what is there
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_utils.hardware import as_device  # noqa: E402 - after the path line above
from course_utils.measure import measure_training_steps  # noqa: E402 - after the path line above
from course_utils.memory import METHODS  # noqa: E402 - after the path line above
from course_utils.step_memory import error_percent, estimate_device_for, estimate_step  # noqa: E402 - after the path line above

KEYS = ("method", "batch", "seq", "checkpointing")


def cases(methods: Iterable[str], batches: Iterable[int], seqs: Iterable[int],
          checkpointing: Iterable[bool]) -> list[dict[str, Any]]:
    """Every combination, as keyword arguments of estimate_step and measure_training_step."""
    return [dict(zip(KEYS, combo)) for combo in itertools.product(methods, batches, seqs, checkpointing)]


def run_cases(config: str, cases: list[dict[str, Any]], device: Any, timeout_s: float) -> list[dict[str, Any]]:
    """Measure ``cases`` on ``device`` (one child process on a CPU, a fresh fork per case); their table rows."""
    start = time.perf_counter()
    rows = []
    for case, m in zip(cases, measure_training_steps(config, cases, device=device, timeout_s=timeout_s)):
        if isinstance(m, Exception):
            rows.append({**case, "error": str(m).strip().splitlines()[-1][:200]})
            continue
        rows.append(with_estimate(config, {**case, "measured_gb": m.peak_gb, "device": str(device),
                                           "start_gb": m.start_bytes / 1e9, "baseline_gb": m.baseline_bytes / 1e9,
                                           "seconds": time.perf_counter() - start}))
    return rows


def with_estimate(config: str, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with the current code's estimate for its case and device, and the error against its measurement."""
    est = estimate_step(config, **{k: row[k] for k in KEYS}, device=estimate_device_for(row["device"]))
    return {**row, "estimate_gb": est.peak_gb, "moment": est.peak_moment,
            "error_pct": error_percent(est.peak_gb, row["measured_gb"])}


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as Markdown, then the largest error."""
    lines = ["| method | batch | seq | checkpointing | estimate GB | measured GB | error |",
             "| --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['method']} | {r['batch']} | {r['seq']} | {'on' if r['checkpointing'] else 'off'} "
                         f"| | | failed: {r['error']} |")
            continue
        lines.append(f"| {r['method']} | {r['batch']} | {r['seq']} | {'on' if r['checkpointing'] else 'off'} "
                     f"| {r['estimate_gb']:.3f} | {r['measured_gb']:.3f} | {r['error_pct']:+.1f} % |")
    measured = [r for r in rows if "error_pct" in r]
    if measured:
        worst = max(measured, key=lambda r: abs(r["error_pct"]))
        lines.append(f"\n{len(measured)} cases measured; largest error {worst['error_pct']:+.1f} % "
                     f"({', '.join(f'{k}={worst[k]}' for k in KEYS)}).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="smollm2-135m", help="preset name or config.json path")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--seqs", default="128,512")
    parser.add_argument("--checkpointing", default="off,on", help="off, on, or off,on")
    parser.add_argument("--out", type=Path, default=None, help="JSON-lines file to append to and resume from")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per measured case")
    parser.add_argument("--table-only", action="store_true", help="print the table of --out; measure nothing")
    args = parser.parse_args(argv)
    try:
        grid = cases([m for m in args.methods.split(",") if m], [int(b) for b in args.batches.split(",")],
                     [int(s) for s in args.seqs.split(",")],
                     [{"off": False, "on": True}[c] for c in args.checkpointing.split(",")])
    except (ValueError, KeyError) as err:
        parser.error(f"a grid option is malformed ({err})")
    done = []
    if args.out is not None and args.out.exists():
        done = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]
    if not args.table_only:
        device = as_device(None)
        seen = {tuple(r[k] for k in KEYS) for r in done if "error" not in r}
        todo = [case for case in grid if tuple(case[k] for k in KEYS) not in seen]
        for method in dict.fromkeys(case["method"] for case in todo):  # one child process per method
            for row in run_cases(args.config, [c for c in todo if c["method"] == method], device, args.timeout):
                done.append(row)
                print(json.dumps(row), flush=True)
                if args.out is not None:
                    with args.out.open("a") as fh:
                        fh.write(json.dumps(row) + "\n")
    wanted = {tuple(c[k] for k in KEYS) for c in grid}
    rows = [r if "error" in r else with_estimate(args.config, r) for r in done if tuple(r[k] for k in KEYS) in wanted]
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
