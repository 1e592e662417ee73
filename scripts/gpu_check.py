"""Check the course's GPU paths on a real NVIDIA GPU, in one command, offline, within a 300 s budget.

No development machine of this course has a GPU, so every CUDA branch of ``course_utils`` is proven here,
on whatever NVIDIA GPU is lent (a Colab T4, an L4, an A100, an H100, an H200...). Run from the repository root::

    python scripts/gpu_check.py                      # all sections, results in ./gpu_check_out/
    python scripts/gpu_check.py --strict             # also fail on estimate errors over 10 % and on skips
    python scripts/gpu_check.py --dry-run            # print the plan for this GPU; nothing runs on it
    python scripts/gpu_check.py --out /tmp/check --sections matmul,qlora --budget-s 200

Sections, in order (``--sections`` takes their names or numbers):

1. ``environment`` - versions, GPU name, compute capability, memory; ``hardware.setup_report()`` and the
   dtype decisions (``autocast_dtype``, ``bf16_native``, ``needs_loss_scaling``).
2. ``matmul`` - 4096x4096 and 8192x8192 matmuls in float32 / float16 / bfloat16, each timed with
   ``torch.utils.benchmark.Timer(...).blocked_autorange(...)``: median, spread (IQR and min-max over the
   measurements), TFLOP/s and % of the datasheet peak (``hardware.datasheet_for``); the lessons'
   ``precision.time_matmul`` once at 4096 in float16.
3. ``mixed_precision`` - notebook 02's loop (``precision.train_mixed_precision``) with float16 + GradScaler
   and a forced overflow (the scaler must skip that step and lower its scale), and with bfloat16 (Ampere+).
4. ``microbatch_sweep`` - notebook 03's micro-batch sweep (``accumulation.sweep_micro_batches``) on CUDA.
5. ``step_memory`` - the whole-step estimate (``step_memory.estimate_step``, with the attention backend this GPU
   gets) against the allocator peak of ``measure.measure_training_step`` (3 timed steps each): LoRA and full x
   batch 1/4/8, float16 autocast with GradScaler (``autocast="fp16"``) on every GPU, full-bf16, lora-bf16, qlora,
   and LoRA at 1,024 tokens (batch: the largest a T4 fits by the estimate); each row shows the attention backend
   that ran next to the one the estimate assumed. Then notebook 05's tricks (``tricks.measure_tricks``, 3 timed
   steps each: gradient checkpointing, 16-bit autocast, 8-bit AdamW, accumulation), then torch.compile in a
   bounded child process, after the in-process cases (its compiler workers would compete for the CPU while eager
   steps are timed). Full tuning and the tricks need torch and transformers only; a case that needs peft or
   bitsandbytes is "not checked: <package> missing" without it.
6. ``qlora`` - the offline stand-in loaded in 4 bits, LoRA added (notebook 01b's recipe), 8 AdamW steps on 01b's
   tickets with 01b's GradScaler (on for float16 compute), 10 generated tokens; with the GPU's own compute dtype
   and, on Ampere or newer, again with float16 compute (the T4 branch).
7. ``ddp`` - notebook 03's 2-process gloo DDP check, started after CUDA is initialised.
8. ``trainer`` - notebook 05's memory-efficient ``TrainingArguments`` for 2 Trainer steps, and on Ampere or
   newer the same arguments with ``fp16=True`` forced (the T4 branch: float16 + the Trainer's loss scaling).
9. ``timeline`` - notebook 05's baseline step over time (``timeline_measure.measure_timeline``: the profiler's
   memory timeline, and the CUDA allocator's history saved as ``timeline/step_snapshot.pickle`` for
   https://pytorch.org/memory_viz) against ``timeline.predicted_timeline``: tensor peaks within 5 %, the same
   phase, each kind's most bytes alive side by side.

So the T4 branch (float16 + loss scaling) runs on any card: forced on Ampere-or-newer ones, the default on a T4.

The script never contacts the Hugging Face Hub (it sets ``HF_HUB_OFFLINE=1``): the model is the course's
stand-in, the SmolLM2-135M architecture from ``data/configs`` with random weights. It puts the repository
root on ``sys.path`` itself, so ``course_utils`` need not be installed, and it does not assume this
project's pinned versions. A section whose optional library (transformers, peft, accelerate, bitsandbytes)
is missing is listed as "not checked: no <library>" (never as passed); every section runs inside
try/except, so one failure is recorded (type, message, end of the traceback) and the others still run.

Budget: ``--budget-s`` (default 300 s, so that a lent GPU's 15 minutes leave room for a rerun) is planned
ahead: each section has a cap, and the caps (scaled down for a smaller budget) fit in the budget less 8 s kept
for writing the results; a section may also use what the sections before it left unused, as long as the
sections after it keep their caps. Inside a section every case checks the time left before it starts, and a
section is skipped, with the reason, when the time left is below its minimum. A watchdog stops the run at
the budget in any case. Child processes (the torch.compile child and its compilers, the DDP ranks and their
fork server) are ended with the run: at its end, and when the watchdog fires (see :func:`end_children`).
``--dry-run`` prints the plan for the GPU found (sections, caps, cases) and runs nothing on it.

Output: ``gpu_check.json`` and ``gpu_check.md`` (a table per section) in ``--out``; every other file the check
writes goes there too (the stand-in model, the Trainer's folders, temporary files, torch.compile's and Triton's
caches: see :func:`setup_environment`). The markdown is also printed, then one summary line (``gpu_check:
PASSED|INCOMPLETE|FAILED ...``). Exit status: 0 when no section failed (sections and cases skipped or not checked
are listed; PASSED only when every section passed in full); 1 when a section failed or the watchdog stopped the run;
2 when there is no CUDA GPU (one line on stderr, nothing run); 3 with ``--strict`` when nothing failed but an
estimate error (step_memory: estimate vs measured peak) is over 10 %, no estimate was checked at all (step_memory
requested: a missing library counts here), an estimate assumed another attention backend than the one that ran, or a
section or case was skipped for a reason other than a missing optional library (sections not checked for a missing
library do not fail ``--strict`` otherwise).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the check's other files, beside this one
from gpu_check_core import (
    DEFAULT_BUDGET_S,
    ESTIMATE_LIMIT_PCT,
    EXIT_FAILED,
    EXIT_NO_CUDA,
    EXIT_OK,
    MATMUL_SIZES,
    MEASURED_STEPS,
    NO_CUDA_MESSAGE,
    OFFLINE_ENV,
    OPTIONAL_LIBRARIES,
    REPO_ROOT,
    RESERVE_S,
    Clock,
    Context,
    Section,
    describe_error,
    exit_status,
    format_cell,
    free_memory,
    new_record,
    not_checked_reason,
    requirement_problem,
    run_section,
    summarize,
)
from gpu_check_lessons import (
    section_environment,
    section_matmul,
    section_microbatch_sweep,
    section_mixed_precision,
)
from gpu_check_memory import section_step_memory
from gpu_check_models import section_ddp, section_qlora, section_trainer
from gpu_check_plan import section_cases
from gpu_check_procs import end_children
from gpu_check_timeline import section_timeline
from gpu_check_report import write_outputs

SECTIONS: tuple[Section, ...] = (
    Section(1, "environment", "Environment and the hardware decisions", section_environment, min_s=3, cap_s=5),
    Section(2, "matmul", "Matmul speed: 4096² and 8192², float32, float16, bfloat16", section_matmul,
            min_s=10, cap_s=20),
    Section(3, "mixed_precision", "Mixed-precision training loop (notebook 02)", section_mixed_precision,
            min_s=8, cap_s=15),
    Section(4, "microbatch_sweep", "Micro-batch sweep on CUDA (notebook 03)", section_microbatch_sweep,
            min_s=5, cap_s=10),
    Section(5, "step_memory", "Whole-step estimate vs measured peak, fp16 and attention included; notebook 05's "
            "tricks", section_step_memory, needs=("transformers",), min_s=40, cap_s=167),
    Section(6, "qlora", "QLoRA on the offline stand-in (notebook 01b's loop), float16 compute included",
            section_qlora, needs=("transformers", "peft", "accelerate", "bitsandbytes"), min_s=20, cap_s=30),
    Section(7, "ddp", "gloo DDP after CUDA is initialised (notebook 03)", section_ddp, min_s=15, cap_s=15),
    Section(8, "trainer", "Memory-efficient TrainingArguments with the Trainer, fp16 included (notebook 05)",
            section_trainer, needs=("transformers", "accelerate"), min_s=15, cap_s=20),
    Section(9, "timeline", "One step's memory over time, measured against predicted (notebook 05); the "
            "allocator's history saved for pytorch.org/memory_viz", section_timeline, needs=("transformers",),
            min_s=10, cap_s=10),
)


def plan_budget(sections: Sequence[Section], budget_s: float) -> list[Section]:
    """``sections`` with their caps scaled down, if need be, to fit in ``budget_s`` less the reserve."""
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or budget_s <= RESERVE_S:
        raise ValueError(f"budget_s must be a number of seconds above {RESERVE_S:g}, got {budget_s!r}")
    room = float(budget_s) - RESERVE_S
    total = sum(s.cap_s for s in sections)
    if total <= room:
        return list(sections)
    return [dataclasses.replace(s, cap_s=round(s.cap_s * room / total, 1)) for s in sections]


def build_plan(torch: Any, sections: Sequence[Section], budget_s: float, strict: bool = False,
               problem: Callable[[str], str | None] | None = None) -> dict[str, Any]:
    """What a run would do on this GPU, decided without running anything on it (--dry-run)."""
    from course_utils import hardware

    problem = requirement_problem if problem is None else problem
    native = bool(hardware.bf16_native("cuda"))
    found = {name: problem(name) for name in OPTIONAL_LIBRARIES}
    planned = []
    for s in plan_budget(sections, budget_s):
        why = {name: found[name] if name in found else problem(name) for name in s.needs}
        missing = [name for name in s.needs if why[name]]
        planned.append({"number": s.number, "key": s.key, "title": s.title, "cap_s": s.cap_s, "min_s": s.min_s,
                        "needs": list(s.needs),
                        "not_checked": (not_checked_reason(missing, [why[n] for n in missing]) if missing else None),
                        "cases": section_cases(s.key, native, found)})
    return {"machine": machine_summary(torch), "bf16_native": native, "budget_s": float(budget_s),
            "reserve_s": RESERVE_S, "planned_s": round(sum(p["cap_s"] for p in planned), 1), "strict": strict,
            "estimate_limit_pct": ESTIMATE_LIMIT_PCT, "measured_steps": MEASURED_STEPS,
            "matmul_sizes": list(MATMUL_SIZES), "libraries": found, "sections": planned}


def render_plan(plan: dict[str, Any]) -> str:
    """The dry run's plan as Markdown: the GPU, the budget, and each section's cap and cases."""
    m = plan["machine"]
    lines = ["# gpu_check dry run: the plan (nothing was run on the GPU)", "",
             f"GPU: {m['gpu']} (compute capability {m['capability']}, {format_cell(m['memory_gb'])} GB, native "
             f"bfloat16: {format_cell(plan['bf16_native'])}); torch {m['torch']}, CUDA {m['cuda']}.", "",
             f"Budget {format_cell(plan['budget_s'])} s: sections planned within {format_cell(plan['planned_s'])} s, "
             f"{plan['reserve_s']:g} s kept for writing the results; {plan['measured_steps']} measured "
             f"steps per case and per trick; --strict {'on' if plan['strict'] else 'off'} (estimate errors over "
             f"{plan['estimate_limit_pct']:g} % and skips fail it; a missing optional library is 'not checked')."]
    for s in plan["sections"]:
        lines += ["", f"## {s['number']}. {s['title']} (cap {format_cell(s['cap_s'])} s)"]
        if s["not_checked"]:
            lines += ["", f"**{s['not_checked']}**"]
        lines += [""] + [f"- {c['label']}" for c in s["cases"]]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Running it all
# --------------------------------------------------------------------------------------------
def parse_sections(text: str | None) -> list[Section]:
    """Sections named (or numbered) in a comma list, in the script's order; all of them for None/empty."""
    if not text:
        return list(SECTIONS)
    wanted = {w.strip().lower() for w in text.split(",") if w.strip()}
    known = {s.key: s for s in SECTIONS} | {str(s.number): s for s in SECTIONS}
    unknown = sorted(wanted - set(known))
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(f'{s.number}={s.key}' for s in SECTIONS)}")
    chosen = {known[w].key for w in wanted}
    return [s for s in SECTIONS if s.key in chosen]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line: --out, --sections, --budget-s, --strict, --dry-run (errors exit 2 with usage)."""
    parser = argparse.ArgumentParser(prog="python scripts/gpu_check.py",
                                     description="Check the course's GPU paths on a real NVIDIA GPU, offline. Exit "
                                     "status: 0 nothing failed, 1 a section failed (or the watchdog stopped the run), "
                                     "2 no CUDA GPU, 3 --strict found a problem.")
    parser.add_argument("--out", default="gpu_check_out", help="folder for gpu_check.json and gpu_check.md "
                        "(default: gpu_check_out/ in the current directory)")
    parser.add_argument("--sections", default=None, help="comma list of sections to run, by name or number "
                        "(default: all): " + ", ".join(f"{s.number}={s.key}" for s in SECTIONS))
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help=f"total time budget in seconds, 30 to 3600 (default {DEFAULT_BUDGET_S:g} = 5 minutes, "
                        "so that a lent GPU's 15 minutes leave room for a rerun); the sections plan within it")
    parser.add_argument("--strict", action="store_true",
                        help=f"exit 3 when nothing failed but an estimate error is over {ESTIMATE_LIMIT_PCT:g} %% or a "
                        "section or case was skipped (one not checked for a missing optional library - "
                        f"{', '.join(OPTIONAL_LIBRARIES)} - does not count)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would run on this GPU (sections, caps, cases) and exit 0; nothing runs on it")
    args = parser.parse_args(argv)
    try:
        args.section_list = parse_sections(args.sections)
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
        folders = {"TMPDIR": out_dir / "tmp", "TORCHINDUCTOR_CACHE_DIR": out_dir / "cache" / "inductor",
                   "TRITON_CACHE_DIR": out_dir / "cache" / "triton"}
        for name, folder in folders.items():
            folder.mkdir(parents=True, exist_ok=True)
            os.environ[name] = str(folder)
        tempfile.tempdir = None  # tempfile reads TMPDIR again


def gpus_hidden(environ: dict[str, str] | None = None) -> bool:
    """True when CUDA_VISIBLE_DEVICES hides every GPU ("" or "-1"): no CUDA, known without importing torch."""
    env = os.environ if environ is None else environ
    value = env.get("CUDA_VISIBLE_DEVICES")
    return value is not None and value.split(",")[0].strip() in ("", "-1")


def cuda_torch() -> tuple[Any | None, str]:
    """(torch, "") when torch is installed and sees a CUDA GPU; (None, why not) otherwise.

    Decided before any heavy import (transformers, peft, bitsandbytes), and without importing torch at all
    when CUDA_VISIBLE_DEVICES hides every GPU.
    """
    if gpus_hidden():
        return None, f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r} hides every GPU"
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if torch.cuda.is_available():
            return torch, ""
    return None, f"torch {torch.__version__} sees no CUDA GPU: torch.cuda.is_available() is False"


def machine_summary(torch: Any) -> dict[str, Any]:
    """GPU name, compute capability, memory (GB), torch and CUDA versions."""
    cap = torch.cuda.get_device_capability(0)
    return {"gpu": torch.cuda.get_device_name(0), "capability": f"{cap[0]}.{cap[1]}",
            "memory_gb": torch.cuda.get_device_properties(0).total_memory / 1e9, "torch": torch.__version__,
            "cuda": torch.version.cuda}


def close_results(results: dict[str, Any], clock: Clock) -> None:
    """Elapsed time, exit status and summary into ``results`` (the watchdog's exit status is always 1)."""
    results["elapsed_s"] = round(clock.elapsed(), 1)
    status = exit_status(results["sections"], bool(results.get("strict")))
    results["exit_status"] = EXIT_FAILED if results.get("stopped_by_watchdog") else status
    results["summary"] = summarize(results)


class Watchdog:
    """Stops the whole run when the budget is spent: ends the child processes, writes what was found so far,
    and exits with status 1."""

    def __init__(self, results: dict[str, Any], out_dir: Path, clock: Clock) -> None:
        self.results, self.out_dir, self.clock = results, out_dir, clock
        self.lock = threading.Lock()
        self.done = False
        self.timer = threading.Timer(max(1.0, clock.budget_s - clock.elapsed()), self.fire)
        self.timer.daemon = True

    def start(self) -> None:
        """Arm the timer."""
        self.timer.start()

    def finish(self) -> bool:
        """Called by the main thread when it is done: False if the watchdog already fired."""
        self.timer.cancel()
        with self.lock:
            if self.done:
                return False
            self.done = True
            return True

    def fire(self) -> None:
        """The budget is spent: mark what ran and what never started, end the children, write, exit 1."""
        with self.lock:
            if self.done:
                return
            self.done = True
            for rec in self.results["sections"]:
                if rec["status"] == "running":
                    rec.update(status="failed", reason=f"still running when the {self.clock.budget_s:.0f} s budget "
                               "ran out: the run was stopped", error={"type": "TimeoutError", "message":
                               "stopped by the watchdog", "traceback": ""})
                elif rec["status"] == "pending":
                    rec.update(status="skipped", reason="not started: the time budget ran out")
            self.results["stopped_by_watchdog"] = True
            try:
                with contextlib.suppress(Exception):
                    self.results["ended_children"] = end_children(grace_s=1.0)
                close_results(self.results, self.clock)
                _, md_path, markdown = write_outputs(self.results, self.out_dir)
                sys.stdout.write(markdown + f"\nResults: {md_path} and {md_path.with_suffix('.json')}\n"
                                 + self.results["summary"]["line"] + "\n")
                sys.stdout.flush()
            finally:
                os._exit(EXIT_FAILED)


def run_all(sections: Sequence[Section], ctx: Context, results: dict[str, Any]) -> None:
    """Run the sections in order, each recorded in ``results['sections']`` before it starts."""
    records = [new_record(s) for s in sections]
    results["sections"] = records
    for i, (section, record) in enumerate(zip(sections, records)):
        try:
            run_section(section, ctx, record, after_s=sum(s.cap_s for s in sections[i + 1:]))
        except KeyboardInterrupt:
            record.update(status="failed", reason="interrupted (Ctrl-C)")
            for later in records:
                if later["status"] == "pending":
                    later.update(status="skipped", reason="not started: the run was interrupted")
            break
        except Exception as err:  # noqa: BLE001 - a fault of the runner itself: record it, go on
            record.update(status="failed", reason=f"gpu_check runner: {type(err).__name__}", error=describe_error(err))
        with contextlib.suppress(Exception):
            free_memory(ctx.torch)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, check for CUDA, then print the plan (--dry-run) or run the sections, write and summarise."""
    args = parse_args(argv)
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
    sections = plan_budget(args.section_list, clock.budget_s)
    results: dict[str, Any] = {
        "script": "scripts/gpu_check.py",
        "started_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "budget_s": clock.budget_s, "strict": bool(args.strict), "estimate_limit_pct": ESTIMATE_LIMIT_PCT,
        "measured_steps": MEASURED_STEPS, "machine": machine_summary(torch), "sections": [],
        "planned_caps_s": {s.key: s.cap_s for s in sections}, "requested_sections": [s.key for s in sections]}
    watchdog = Watchdog(results, out_dir, clock)
    watchdog.start()
    try:
        run_all(sections, Context(torch=torch, clock=clock, out_dir=out_dir), results)
    finally:
        if not watchdog.finish():  # pragma: no cover - the watchdog is ending the children, writing and exiting
            time.sleep(60)
        results["ended_children"] = end_children()
    close_results(results, clock)
    json_path, md_path, markdown = write_outputs(results, out_dir)
    print(markdown)
    print(f"Results: {md_path} and {json_path}")
    print(results["summary"]["line"])
    return int(results["exit_status"])


if __name__ == "__main__":
    sys.exit(main())
