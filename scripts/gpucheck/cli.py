"""The command line (--out, --sections, --budget-s, --strict, --dry-run) and the run from start to end."""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from .children import Watchdog, end_children
from .gpu import cuda_torch, machine_summary
from .plan import build_plan, parse_sections, plan_budget, render_plan
from .report import close_results, write_outputs
from .runner import Clock, Context, Section, run_all
from .settings import (
    DEFAULT_BUDGET_S,
    ESTIMATE_LIMIT_PCT,
    EXIT_NO_CUDA,
    EXIT_OK,
    MEASURED_STEPS,
    NO_CUDA_MESSAGE,
    OFFLINE_ENV,
    OPTIONAL_LIBRARIES,
    REPO_ROOT,
)


def parse_args(sections: Sequence[Section], argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line: --out, --sections, --budget-s, --strict, --dry-run (errors exit 2 with usage)."""
    parser = argparse.ArgumentParser(
        prog="python scripts/gpu_check.py",
        description="Check the course's GPU paths on a real NVIDIA GPU, offline. Exit status: 0 nothing failed, "
        "1 a section failed (or the watchdog stopped the run), 2 no CUDA GPU, 3 --strict found a problem.",
    )
    parser.add_argument(
        "--out",
        default="gpu_check_out",
        help="folder for gpu_check.json and gpu_check.md (default: gpu_check_out/ in the current directory)",
    )
    parser.add_argument(
        "--sections",
        default=None,
        help="comma list of sections to run, by name or number (default: all): "
        + ", ".join(f"{s.number}={s.key}" for s in sections),
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=DEFAULT_BUDGET_S,
        help=f"total time budget in seconds, 30 to 3600 (default {DEFAULT_BUDGET_S:g} = 5 minutes, so that a lent "
        "GPU's 15 minutes leave room for a rerun); the sections plan within it",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help=f"exit 3 when nothing failed but an estimate error is over {ESTIMATE_LIMIT_PCT:g} %% or a section or "
        f"case was skipped (one not checked for a missing optional library - {', '.join(OPTIONAL_LIBRARIES)} - "
        "does not count)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print what would run on this GPU (sections, caps, cases) and exit 0; nothing runs on it",
    )
    args = parser.parse_args(argv)
    try:
        args.section_list = parse_sections(args.sections, sections)
    except ValueError as err:
        parser.error(f"argument --sections: {err}")
    if not 30 <= args.budget_s <= 3600:
        parser.error(f"argument --budget-s: must be between 30 and 3600 seconds, got {args.budget_s:g}")
    return args


def setup_environment(out_dir: Path | None = None) -> None:
    """Offline and quiet, for this process and its children; course_utils importable in child processes. With
    ``out_dir``, every file the run writes goes under it: temporary files (``TMPDIR``: the QLoRA build, the DDP
    ranks' files), torch.compile's and Triton's caches (the stand-in and the Trainer's folders are given it too)."""
    os.environ.update(OFFLINE_ENV)
    path = os.environ.get("PYTHONPATH", "")
    if str(REPO_ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
    if out_dir is not None:
        folders = {
            "TMPDIR": out_dir / "tmp",
            "TORCHINDUCTOR_CACHE_DIR": out_dir / "cache" / "inductor",
            "TRITON_CACHE_DIR": out_dir / "cache" / "triton",
        }
        for name, folder in folders.items():
            folder.mkdir(parents=True, exist_ok=True)
            os.environ[name] = str(folder)
        tempfile.tempdir = None  # tempfile reads TMPDIR again


def main(sections: Sequence[Section], argv: Sequence[str] | None = None) -> int:
    """Parse, check for CUDA, then print the plan (--dry-run) or run the sections, write and summarise."""
    args = parse_args(sections, argv)
    torch, why = cuda_torch()
    if torch is None:
        print(NO_CUDA_MESSAGE.format(why=why), file=sys.stderr)
        return EXIT_NO_CUDA
    if args.dry_run:
        print(render_plan(build_plan(torch, args.section_list, args.budget_s, args.strict)), end="")
        return EXIT_OK
    clock = Clock(float(args.budget_s))
    out_dir = Path(args.out).resolve()
    setup_environment(out_dir)
    planned = plan_budget(args.section_list, clock.budget_s)
    results: dict[str, Any] = {
        "script": "scripts/gpu_check.py",
        "started_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "budget_s": clock.budget_s,
        "strict": bool(args.strict),
        "estimate_limit_pct": ESTIMATE_LIMIT_PCT,
        "measured_steps": MEASURED_STEPS,
        "machine": machine_summary(torch),
        "sections": [],
        "planned_caps_s": {s.key: s.cap_s for s in planned},
        "requested_sections": [s.key for s in planned],
    }
    watchdog = Watchdog(results, out_dir, clock)
    watchdog.start()
    try:
        run_all(planned, Context(torch=torch, clock=clock, out_dir=out_dir), results)
    finally:
        if not watchdog.finish():  # pragma: no cover - the watchdog is ending the children, writing and exiting
            time.sleep(60)
        results["ended_children"] = end_children()
    close_results(results, clock.elapsed())
    json_path, md_path, markdown = write_outputs(results, out_dir)
    print(markdown)
    print(f"Results: {md_path} and {json_path}")
    print(results["summary"]["line"])
    return int(results["exit_status"])
