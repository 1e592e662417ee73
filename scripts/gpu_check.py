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
5. ``step_memory`` - the whole-step estimate (``step_memory.estimate_step``) against the allocator peak of
   ``measure.measure_training_step`` (3 measured steps each): LoRA and full x batch 1/4/8, and float16 autocast
   with GradScaler (``autocast="fp16"``) on every GPU; then notebook 05's tricks (``tricks.measure_tricks``,
   3 measured steps each: gradient checkpointing, 8-bit AdamW, and torch.compile in a bounded child process
   that runs while the in-process cases are measured).
6. ``qlora`` - the offline stand-in loaded in 4 bits, LoRA added, 8 AdamW steps, 10 generated tokens; with the
   GPU's own compute dtype and, on Ampere or newer, again with float16 compute (the T4 branch).
7. ``ddp`` - notebook 03's 2-process gloo DDP check, started after CUDA is initialised.
8. ``trainer`` - notebook 05's memory-efficient ``TrainingArguments`` for 2 Trainer steps, and on Ampere or
   newer the same arguments with ``fp16=True`` forced (the T4 branch: float16 + the Trainer's loss scaling).

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

Output: ``gpu_check.json`` and ``gpu_check.md`` (a table per section) in ``--out``; the markdown is also
printed, then one summary line (``gpu_check: PASSED|INCOMPLETE|FAILED ...``). Exit status: 0 when no section
failed (sections and cases skipped or not checked are listed; PASSED only when every section passed in
full); 1 when a section failed or the watchdog stopped the run; 2 when there is no CUDA GPU (one line on
stderr, nothing run); 3 with ``--strict`` when nothing failed but an estimate error (step_memory: estimate vs
measured peak) is over 10 %, or a section or case was skipped for a reason other than a missing optional
library (sections not checked for a missing library do not fail ``--strict``).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import gc
import importlib
import importlib.util
import json
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # course_utils from this clone, installed or not

NO_CUDA_MESSAGE = "gpu_check: needs an NVIDIA GPU with CUDA ({why}); nothing was run."
DEFAULT_BUDGET_S = 300.0
#: Seconds kept back from the budget for writing the results (sections stop planning work past it).
RESERVE_S = 8.0
MATMUL_SIZES = (4096, 8192)
MATMUL_DTYPES = ("float32", "float16", "bfloat16")
#: ``blocked_autorange(min_run_time=...)`` per matmul case, seconds.
MATMUL_MIN_RUN_S = 0.3
#: Measured training steps per case and per trick (``steps=`` of measure_training_step), after the warm-up step.
MEASURED_STEPS = 3
STEP_SEQ = 128
#: --strict fails when |estimate - measured| / measured is above this, in percent.
ESTIMATE_LIMIT_PCT = 10.0
#: A section or case skipped for one of these missing is "not checked", and does not fail --strict.
OPTIONAL_LIBRARIES = ("transformers", "peft", "accelerate", "bitsandbytes")
#: What TrainingArguments get on a T4 (``precision.training_arguments_kwargs`` there), forced on newer GPUs.
FP16_TRAINING_KWARGS = {"bf16": False, "fp16": True}
QLORA_STEPS = 8
STANDIN_CONFIG = "smollm2-135m"
PROMPT = "The capital of France is"
EXIT_OK, EXIT_FAILED, EXIT_NO_CUDA, EXIT_STRICT = 0, 1, 2, 3
#: Kinds of a skipped part of a section: "time" and "other" fail --strict, "library" is "not checked",
#: "n/a" is a path this GPU does not have (bfloat16 on a T4).
SKIP_KINDS = ("time", "library", "n/a", "other")
#: Environment every part of the run (and every child process) gets: offline, quiet, no experiment trackers.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_MODE": "disabled",
    "WANDB_DISABLED": "true",
}


# --------------------------------------------------------------------------------------------
# Pure arithmetic (unit-tested without a GPU)
# --------------------------------------------------------------------------------------------
def tflops(n: int, seconds: float) -> float:
    """Achieved TFLOP/s of one n x n by n x n matmul that took ``seconds``: 2 n^3 / seconds / 1e12."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return 2 * n ** 3 / seconds / 1e12


def peak_tflops(dtype: str, sheet: Any, bf16_native: bool) -> float | None:
    """The datasheet figure to compare a ``dtype`` matmul with: fp32_tflops for float32, tensor16_tflops for
    float16 and (native only) bfloat16; None when the GPU is not in the table or bfloat16 is emulated."""
    if sheet is None:
        return None
    if dtype == "float32":
        return float(sheet.fp32_tflops)
    if dtype == "bfloat16" and not bf16_native:
        return None
    return float(sheet.tensor16_tflops)


def percent_of_peak(achieved: float, peak: float | None) -> float | None:
    """``achieved`` as a percentage of ``peak`` (None when there is no peak to compare with)."""
    if peak is None or peak <= 0:
        return None
    return 100.0 * achieved / peak


def error_pct(estimate: float, measured: float) -> float:
    """(estimate - measured) / measured in percent: positive when the estimate is too high."""
    if measured <= 0:
        raise ValueError(f"measured must be positive, got {measured}")
    return 100.0 * (estimate - measured) / measured


def gb(n_bytes: float | None) -> float | None:
    """Bytes in GB (10^9), None stays None."""
    return None if n_bytes is None else n_bytes / 1e9


def matmul_stats(size: int, times: Sequence[float]) -> dict[str, Any]:
    """Median, quartiles, min and max (ms) of per-matmul ``times`` (s), and TFLOP/s at the median and the best."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive integer, got {size!r}")
    values = [float(t) for t in times]
    if not values or any(not math.isfinite(t) or t <= 0 for t in values):
        raise ValueError(f"times must be positive seconds, at least one, got {list(times)!r}")
    median = statistics.median(values)
    q1, q3 = (statistics.quantiles(values, n=4, method="inclusive")[::2] if len(values) > 1 else (median, median))
    return {"size": size, "runs": len(values), "median_ms": median * 1e3, "q1_ms": q1 * 1e3, "q3_ms": q3 * 1e3,
            "iqr_ms": (q3 - q1) * 1e3, "min_ms": min(values) * 1e3, "max_ms": max(values) * 1e3,
            "tflops": tflops(size, median), "best_tflops": tflops(size, min(values))}


# --------------------------------------------------------------------------------------------
# Plans: what each section runs on this GPU (the sections and --dry-run read the same plans)
# --------------------------------------------------------------------------------------------
def plan_matmul(native: bool) -> list[dict[str, Any]]:
    """The matmul cases: every size x dtype; emulated bfloat16 (no native bf16) at the smallest size only."""
    cases = []
    for size in MATMUL_SIZES:
        for dtype in MATMUL_DTYPES:
            emulated = dtype == "bfloat16" and not native
            if emulated and size != MATMUL_SIZES[0]:
                continue
            cases.append({"label": f"{size}x{size} {dtype}" + (" (emulated: no native bfloat16)" if emulated else ""),
                          "size": size, "dtype": dtype, "emulated": emulated, "fp16": dtype == "float16",
                          "forced": False, "timer": "blocked_autorange"})
    return cases


def step_cases(native: bool) -> list[dict[str, Any]]:
    """measure_training_step's cases in step_memory: LoRA/full x batch 1/4/8, then fp16 autocast + GradScaler."""
    cases = [{"label": f"{method} batch {batch}", "method": method, "batch": batch, "seq": STEP_SEQ,
              "steps": MEASURED_STEPS, "fp16": False, "forced": False}
             for method in ("lora", "full") for batch in (1, 4, 8)]
    why = "forced: the T4 branch on this GPU" if native else "this GPU's 16-bit dtype"
    cases += [{"label": f"{method} batch 4, fp16 autocast + GradScaler ({why})", "method": method, "batch": 4,
               "seq": STEP_SEQ, "steps": MEASURED_STEPS, "autocast": "fp16", "fp16": True, "forced": native}
              for method in ("lora", "full")]
    return cases


def case_kwargs(case: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of measure_training_step in a planned case (its label and flags left out)."""
    return {k: v for k, v in case.items() if k not in ("label", "fp16", "forced")}


def trick_plan(bitsandbytes: bool) -> tuple[dict[str, Any], list[str]]:
    """tricks.measure_tricks' base step (full, batch 4, 3 measured steps) and its in-process tricks."""
    base = {"method": "full", "batch": 4, "seq": STEP_SEQ, "steps": MEASURED_STEPS}
    keys = ["baseline", "checkpointing"] + (["adamw8bit"] if bitsandbytes else [])
    return base, keys


def qlora_cases(native: bool) -> list[dict[str, Any]]:
    """The QLoRA runs: the GPU's own compute dtype; on Ampere+ also float16 compute (the T4 branch)."""
    if not native:
        return [{"label": "4-bit, float16 compute (this GPU's 16-bit dtype: the T4 branch)",
                 "compute_dtype": "float16", "fp16": True, "forced": False}]
    return [{"label": "4-bit, bfloat16 compute (this GPU's 16-bit dtype)", "compute_dtype": "bfloat16",
             "fp16": False, "forced": False},
            {"label": "4-bit, float16 compute (forced: the T4 branch on this GPU)", "compute_dtype": "float16",
             "fp16": True, "forced": True}]


def trainer_cases(native: bool) -> list[dict[str, Any]]:
    """The Trainer runs: the lesson's arguments for this GPU; on Ampere+ also with fp16=True forced."""
    if not native:
        return [{"label": "the lesson's arguments for this GPU: fp16=True (the T4 branch)", "fp16": True,
                 "forced": False}]
    return [{"label": "the lesson's arguments for this GPU: bf16=True", "fp16": False, "forced": False},
            {"label": "fp16=True forced, bf16=False (the T4 branch on this GPU)", "fp16": True, "forced": True}]


def plain_case(label: str) -> dict[str, Any]:
    """A planned case with nothing but its label."""
    return {"label": label, "fp16": False, "forced": False}


def section_cases(key: str, native: bool, bitsandbytes: bool) -> list[dict[str, Any]]:
    """What section ``key`` runs on a GPU with (or without) native bfloat16, as planned cases."""
    if key == "matmul":
        return plan_matmul(native) + [{**plain_case("4096x4096 float16 with precision.time_matmul (the lessons' "
                                                    "helper)"), "fp16": True}]
    if key == "step_memory":
        base, keys = trick_plan(bitsandbytes)
        cases = step_cases(native)
        cases += [{**plain_case(f"trick {k}: full batch 4, {base['steps']} measured steps"), "steps": base["steps"],
                   "trick": k} for k in keys]
        cases.append({**plain_case(f"trick compile: full batch 4, {base['steps']} measured steps, in a bounded "
                                   "child process started first"), "steps": base["steps"], "trick": "compile"})
        if not bitsandbytes:
            cases.append(plain_case("trick adamw8bit: not checked: no bitsandbytes"))
        return cases
    if key == "qlora":
        return qlora_cases(native)
    if key == "trainer":
        return trainer_cases(native)
    fixed = {
        "environment": ["versions, GPU, hardware.setup_report() and the dtype decisions"],
        "mixed_precision": ["float32 loop, 200 steps",
                            "float16 + GradScaler loop, 100 steps, overflow forced at step 60",
                            "bfloat16 loop, 200 steps" if native else "bfloat16 loop: n/a (no native bfloat16)",
                            "one float16 step with the loss x 1e6: skipped by the scaler"],
        "microbatch_sweep": ["micro-batches 1..64 of a batch of 64: same gradient, activation memory, time"],
        "ddp": ["2-process gloo DDP, 4 micro-batches of 8 each, started after CUDA is initialised"],
    }
    if key not in fixed:
        raise ValueError(f"key must be a section name, got {key!r}")
    cases = [plain_case(label) for label in fixed[key]]
    if key == "mixed_precision":
        cases[1].update(fp16=True)
        cases[3].update(fp16=True)
    return cases


# --------------------------------------------------------------------------------------------
# Sections: what they return, and the runner
# --------------------------------------------------------------------------------------------
class Skip(Exception):
    """Raised by a section that cannot run here; the message is the stated reason."""


@dataclass
class Outcome:
    """What a section found: data for the JSON, tables and text for the summary, and pass/fail checks."""

    data: dict[str, Any] = field(default_factory=dict)
    tables: list[dict[str, Any]] = field(default_factory=list)
    texts: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    partial: list[dict[str, Any]] = field(default_factory=list)

    def table(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Add a table (one row per list)."""
        self.tables.append({"title": title, "columns": list(columns), "rows": [list(r) for r in rows]})

    def text(self, title: str, body: str) -> None:
        """Add a block of verbatim text (printed output of a course helper)."""
        self.texts.append({"title": title, "text": body})

    def note(self, line: str) -> None:
        """Add one observation."""
        self.notes.append(line)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        """Record a check; a False check fails the section."""
        self.checks.append({"check": name, "ok": bool(ok), "detail": detail})
        return bool(ok)

    def skip_part(self, reason: str, kind: str = "time", library: str | None = None) -> None:
        """Record that part of the section was skipped, why, and its kind (see SKIP_KINDS)."""
        if kind not in SKIP_KINDS:
            raise ValueError(f"kind must be one of {', '.join(SKIP_KINDS)}, got {kind!r}")
        if (kind == "library") != (library is not None):
            raise ValueError("library must name the missing library exactly when kind is 'library'")
        self.partial.append({"what": reason, "kind": kind, "library": library})


@dataclass
class Clock:
    """The run's time budget: seconds used, seconds left (before the reserve kept for writing results)."""

    budget_s: float
    start: float = field(default_factory=time.monotonic)
    reserve_s: float = RESERVE_S

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.start

    def left(self) -> float:
        """Seconds left for work: the budget less the reserve, less what was used."""
        return self.budget_s - self.reserve_s - self.elapsed()


@dataclass
class Context:
    """What every section gets: torch, the device, the clock and the section's own deadline."""

    torch: Any
    clock: Clock
    out_dir: Path
    device: str = "cuda"
    deadline: float = math.inf  # time.monotonic() value past which the section starts no new work

    def left(self) -> float:
        """Seconds left for the current section (its own cap and the whole budget both count)."""
        return min(self.deadline - time.monotonic(), self.clock.left())


@dataclass(frozen=True)
class Section:
    """One section: its function, the optional libraries it needs, the least time worth starting it with,
    and the most time it should take (so the later sections keep theirs)."""

    number: int
    key: str
    title: str
    func: Callable[[Context, Outcome], None]
    needs: tuple[str, ...] = ()
    min_s: float = 10.0
    cap_s: float = 60.0


def describe_error(err: BaseException, tail_lines: int = 12) -> dict[str, str]:
    """Type, message (shortened) and the last lines of the traceback of ``err``."""
    lines = "".join(traceback.format_exception(type(err), err, err.__traceback__)).rstrip().splitlines()
    message = str(err)
    if len(message) > 2000:
        message = message[:2000] + " [...]"
    tail = [line if len(line) <= 500 else line[:500] + " [...]" for line in lines[-tail_lines:]]
    return {"type": type(err).__name__, "message": message, "traceback": "\n".join(tail)}


def requirement_problem(package: str) -> str | None:
    """None when ``package`` imports; otherwise why the sections needing it are not checked."""
    try:
        if importlib.util.find_spec(package) is None:
            return f"{package} is not installed"
        if package == "bitsandbytes":
            from course_utils.quiet import import_bitsandbytes

            return None if import_bitsandbytes() is not None else "bitsandbytes is installed but does not import here"
        importlib.import_module(package)
    except Exception as err:  # noqa: BLE001 - a broken or incompatible install: say so and skip
        return f"{package} is installed but does not import ({type(err).__name__}: {str(err)[:200]})"
    return None


def not_checked_reason(libraries: Sequence[str], problems: Sequence[str]) -> str:
    """'not checked: no peft, no bitsandbytes (why)' for the missing optional ``libraries``."""
    return "not checked: " + ", ".join(f"no {name}" for name in libraries) + f" ({'; '.join(problems)})"


def new_record(section: Section) -> dict[str, Any]:
    """The result record of a section before it runs."""
    return {"number": section.number, "key": section.key, "title": section.title, "status": "pending",
            "reason": None, "missing": [], "seconds": 0.0, "error": None, "data": {}, "tables": [], "texts": [],
            "notes": [], "checks": [], "partial": []}


def section_seconds(cap_s: float, left_s: float, after_s: float | None) -> float:
    """Seconds a section may take: its cap, or more when the sections after it (planned at ``after_s`` seconds)
    keep theirs; never more than what is left. ``after_s`` None: the cap, within what is left."""
    if after_s is None:
        return min(cap_s, left_s)
    return min(left_s, max(cap_s, left_s - after_s))


def run_section(section: Section, ctx: Context, record: dict[str, Any] | None = None,
                problem: Callable[[str], str | None] | None = None, after_s: float | None = None) -> dict[str, Any]:
    """Run one section inside try/except and fill its record: passed, failed (with the error or the failed
    checks), skipped (time budget, or the section's own reason) or not checked (a missing optional library).
    ``after_s``: the caps of the sections still to run, so that this one may use the time earlier ones left."""
    rec = new_record(section) if record is None else record
    problem = requirement_problem if problem is None else problem
    found = [(name, problem(name)) for name in section.needs]
    missing = [(name, why) for name, why in found if why]
    if missing:
        rec.update(status="not checked", missing=[name for name, _ in missing],
                   reason=not_checked_reason([n for n, _ in missing], [w for _, w in missing]))
        return rec
    left = ctx.clock.left()
    if left < section.min_s:
        rec.update(status="skipped", reason=(f"time budget nearly spent: {max(left, 0):.0f} s left of the "
                                             f"{ctx.clock.budget_s:.0f} s budget, this section needs about "
                                             f"{section.min_s:.0f} s"))
        return rec
    rec["status"] = "running"
    ctx.deadline = time.monotonic() + section_seconds(section.cap_s, left, after_s)
    out = Outcome()
    t0 = time.monotonic()
    try:
        section.func(ctx, out)
    except Skip as why:
        rec.update(status="skipped", reason=str(why))
    except Exception as err:  # noqa: BLE001 - record and go on with the next section
        first_line = str(err).splitlines()[0][:300] if str(err) else ""
        rec.update(status="failed", reason=f"{type(err).__name__}: {first_line}", error=describe_error(err))
    else:
        failed = [c["check"] for c in out.checks if not c["ok"]]
        if failed:
            rec.update(status="failed", reason="failed checks: " + "; ".join(failed))
        else:
            rec["status"] = "passed"
            if out.partial:
                rec["reason"] = "partly skipped: " + "; ".join(p["what"] for p in out.partial)
    finally:
        rec["seconds"] = round(time.monotonic() - t0, 2)
        rec.update(data=out.data, tables=out.tables, texts=out.texts, notes=out.notes, checks=out.checks,
                   partial=out.partial)
    return rec


def part_of(item: Any) -> dict[str, Any]:
    """A partial-skip entry as a dict (a bare string, as older results hold, is of kind 'other')."""
    return item if isinstance(item, dict) else {"what": str(item), "kind": "other", "library": None}


def not_checked(records: Sequence[dict[str, Any]]) -> list[str]:
    """'section: not checked: no <library>' for every section or case left out for a missing optional library."""
    lines = []
    for r in records:
        if r["status"] == "not checked":
            lines.append(f"{r['key']}: {r.get('reason') or 'not checked'}")
        for part in map(part_of, r.get("partial", [])):
            if part["kind"] == "library":
                lines.append(f"{r['key']}: {part['what']} (not checked: no {part['library']})")
    return lines


def estimate_errors(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every estimate-vs-measured error the sections recorded (step_memory), with its section."""
    return [{"section": r["key"], **e} for r in records for e in r.get("data", {}).get("estimate_errors", [])]


def strict_problems(records: Sequence[dict[str, Any]], limit_pct: float = ESTIMATE_LIMIT_PCT) -> list[str]:
    """What fails --strict: estimate errors over ``limit_pct`` %, and sections or cases skipped for a reason
    other than a missing optional library (those are "not checked") or a path this GPU does not have."""
    if not isinstance(limit_pct, (int, float)) or isinstance(limit_pct, bool) or limit_pct <= 0:
        raise ValueError(f"limit_pct must be a positive number, got {limit_pct!r}")
    problems = []
    for e in estimate_errors(records):
        if e.get("error_pct") is not None and abs(e["error_pct"]) > limit_pct:
            problems.append(f"{e['section']}: estimate error {e['error_pct']:+.1f} % for {e['case']} "
                            f"(over {limit_pct:g} %)")
    for r in records:
        if r["status"] in ("skipped", "pending", "running"):
            problems.append(f"{r['key']}: section {r['status']}: {r.get('reason') or 'no reason given'}")
        for part in map(part_of, r.get("partial", [])):
            if part["kind"] in ("time", "other"):
                problems.append(f"{r['key']}: part skipped: {part['what']}")
    return problems


def exit_status(records: Sequence[dict[str, Any]], strict: bool = False) -> int:
    """0 when no section failed (skips need a stated reason), 1 when any failed or never finished, and with
    ``strict`` 3 when nothing failed but :func:`strict_problems` found something."""
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be True or False, got {type(strict).__name__}")
    ok = all(r["status"] in ("passed", "not checked") or (r["status"] == "skipped" and r.get("reason"))
             for r in records)
    if not ok:
        return EXIT_FAILED
    if strict and strict_problems(records):
        return EXIT_STRICT
    return EXIT_OK


def complete(records: Sequence[dict[str, Any]]) -> bool:
    """Whether every section passed and nothing in them was skipped, but for paths this GPU does not have."""
    return bool(records) and all(r["status"] == "passed" and all(part_of(p)["kind"] == "n/a"
                                                                for p in r.get("partial", [])) for r in records)


def verdict_word(status: int, records: Sequence[dict[str, Any]]) -> str:
    """FAILED (any non-zero exit), PASSED (every section passed in full), otherwise INCOMPLETE."""
    if status == EXIT_STRICT:
        return "FAILED (--strict)"
    if status != EXIT_OK:
        return "FAILED"
    return "PASSED" if complete(records) else "INCOMPLETE"


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """The run's verdict: sections by status, not checked, strict problems, and one summary line."""
    records = results.get("sections", [])
    strict = bool(results.get("strict"))
    status = results.get("exit_status", exit_status(records, strict))
    by = {s: [r["key"] for r in records if r["status"] == s] for s in ("passed", "failed", "skipped", "not checked")}
    problems = strict_problems(records)
    gaps = not_checked(records)
    word = verdict_word(status, records)
    line = (f"gpu_check: {word}: {len(by['passed'])} passed, {len(by['failed'])} failed, {len(by['skipped'])} "
            f"skipped, {len(by['not checked'])} not checked of {len(records)} sections")
    if by["failed"]:
        line += f"; failed: {', '.join(by['failed'])}"
    if by["skipped"]:
        line += f"; skipped: {', '.join(by['skipped'])}"
    if gaps:
        line += f"; {len(gaps)} not checked for a missing library"
    if problems:
        line += f"; {len(problems)} {'--strict problem(s)' if strict else 'problem(s) --strict would fail on'}"
    line += (f"; {format_cell(results.get('elapsed_s'))} s of a {format_cell(results.get('budget_s'))} s budget; "
             f"exit status {status}")
    return {"word": word, "exit_status": status, "strict": strict, "passed": by["passed"], "failed": by["failed"],
            "skipped": by["skipped"], "not_checked_sections": by["not checked"], "not_checked": gaps,
            "strict_problems": problems, "line": line}


# --------------------------------------------------------------------------------------------
# Child processes: ended with the run
# --------------------------------------------------------------------------------------------
def process_table(proc: Path = Path("/proc")) -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, process group, state letter) of every process in ``proc`` (empty without /proc)."""
    table: dict[int, tuple[int, int, str]] = {}
    try:
        entries = [e for e in proc.iterdir() if e.name.isdigit()]
    except OSError:
        return table
    for entry in entries:
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended meanwhile
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) >= 3:
            table[int(entry.name)] = (int(fields[1]), int(fields[2]), fields[0])
    return table


def descendants(root: int, table: dict[int, tuple[int, int, str]]) -> list[int]:
    """Every process below ``root`` in ``table``: its children, theirs, and so on (breadth first)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = sorted(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        if pid in found or pid == root:
            continue
        found.append(pid)
        todo.extend(sorted(children.get(pid, [])))
    return found


def is_alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, waiting for its parent to read its status, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        stat = ""
    if stat:
        return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_all(pids: Sequence[int], groups: Sequence[int], sig: int) -> None:
    """Send ``sig`` to each process group in ``groups`` and to each process in ``pids``, whatever has gone."""
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def resource_tracker_pids() -> set[int]:
    """multiprocessing's resource tracker, if this process started one: it ends by itself with this process,
    holds no GPU memory, and must outlive the objects it tracks (killed, it is relaunched with a warning)."""
    tracker = getattr(sys.modules.get("multiprocessing.resource_tracker"), "_resource_tracker", None)
    pid = getattr(tracker, "_pid", None)
    return {pid} if isinstance(pid, int) else set()


def end_children(grace_s: float = 3.0, root: int | None = None, spare: Sequence[int] | None = None) -> list[int]:
    """End every process started below ``root`` (default: this one), and the whole process group of each that
    leads its own (course_utils.measure starts the torch.compile child with start_new_session=True, so the
    compilers it starts go with it, even once orphaned; the DDP ranks are children of multiprocessing's fork
    server). SIGTERM first, SIGKILL to what still runs after ``grace_s``; returns the pids ended. ``spare``:
    pids left alone (default: multiprocessing's resource tracker)."""
    if not isinstance(grace_s, (int, float)) or isinstance(grace_s, bool) or grace_s < 0:
        raise ValueError(f"grace_s must be a number of seconds >= 0, got {grace_s!r}")
    if os.name != "posix":
        return []
    root = os.getpid() if root is None else int(root)
    keep = resource_tracker_pids() if spare is None else {int(p) for p in spare}
    table = process_table()
    pids = [p for p in descendants(root, table) if p not in keep]
    if not pids:
        return []
    try:
        own_group = os.getpgid(root)
    except ProcessLookupError:
        own_group = -1
    groups = sorted({table[p][1] for p in pids if table[p][1] == p and p != own_group})
    _signal_all(pids, groups, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(is_alive(p) for p in pids):
        time.sleep(0.05)
    left = [p for p in pids if is_alive(p)]
    if left or groups:
        _signal_all(left, groups, signal.SIGKILL)  # the groups too: members that left the tree (orphans)
    return pids


# --------------------------------------------------------------------------------------------
# Small GPU helpers
# --------------------------------------------------------------------------------------------
def free_memory(torch: Any) -> None:
    """Drop what the last section left behind, so the next one measures from a clean allocator."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def reset_peak(ctx: Context) -> None:
    """Start a new allocator peak (CUDA only)."""
    if ctx.device.startswith("cuda"):
        ctx.torch.cuda.synchronize()
        ctx.torch.cuda.reset_peak_memory_stats()


def peak_allocated(ctx: Context) -> int | None:
    """The allocator's peak since the last reset, in bytes (None off CUDA)."""
    if ctx.device.startswith("cuda"):
        ctx.torch.cuda.synchronize()
        return int(ctx.torch.cuda.max_memory_allocated())
    return None


def package_versions(torch: Any) -> dict[str, str]:
    """Versions of Python, torch (and its CUDA) and the optional packages, read from their metadata."""
    from importlib.metadata import PackageNotFoundError, version
    import platform

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "torch.version.cuda": str(torch.version.cuda)}
    for name in ("transformers", "peft", "accelerate", "bitsandbytes", "triton"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def as_plain(obj: Any) -> Any:
    """A datasheet entry (NamedTuple or dataclass) as a dict for the JSON; None stays None, anything else text."""
    if obj is None:
        return None
    if hasattr(obj, "_asdict"):
        return dict(obj._asdict())
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else str(obj)


def _call(module: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    """``module.name(*args)``, or a marker string when the function does not exist (the module is being changed)."""
    fn = getattr(module, name, None)
    if not callable(fn):
        return f"<{module.__name__}.{name} not found>"
    return fn(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# 1. Environment
# --------------------------------------------------------------------------------------------
def section_environment(ctx: Context, out: Outcome) -> None:
    """Versions, the GPU, and the hardware module's decisions (what every notebook's setup cell prints)."""
    torch = ctx.torch
    from course_utils import hardware

    versions = package_versions(torch)
    out.data["versions"] = versions
    out.table("Versions", ["package", "version"], list(versions.items()))

    name = torch.cuda.get_device_name(0)
    cap = tuple(torch.cuda.get_device_capability(0))
    props = torch.cuda.get_device_properties(0)
    sheet = _call(hardware, "datasheet_for", name)
    native = _call(hardware, "bf16_native", ctx.device)
    dtype = _call(hardware, "autocast_dtype", ctx.device)
    scaling = _call(hardware, "needs_loss_scaling", dtype) if isinstance(dtype, torch.dtype) else dtype
    mem_gb = _call(hardware, "gpu_memory_gb", ctx.device)
    gpu = {"name": name, "compute_capability": f"{cap[0]}.{cap[1]}", "total_memory_gb": props.total_memory / 1e9,
           "multiprocessors": getattr(props, "multi_processor_count", None),
           "torch.cuda.is_bf16_supported() (includes emulation)": bool(torch.cuda.is_bf16_supported()),
           "hardware.bf16_native()": native, "hardware.autocast_dtype()": str(dtype),
           "hardware.needs_loss_scaling(autocast dtype)": scaling, "hardware.gpu_memory_gb()": mem_gb,
           "hardware.datasheet_for(name)": as_plain(sheet),
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
           "TF32 matmul allowed": bool(torch.backends.cuda.matmul.allow_tf32)}
    out.data["gpu"] = gpu
    out.table("GPU and the course's decisions", ["property", "value"], list(gpu.items()))
    out.text("hardware.setup_report() (what every notebook's setup cell prints)", str(_call(hardware, "setup_report")))
    if callable(getattr(hardware, "version_notes", None)):
        for line in hardware.version_notes():
            out.note(f"hardware.version_notes(): {line}")

    out.check("bf16_native follows the compute capability (>= 8.0)", native == (cap >= (8, 0)),
              f"capability {cap[0]}.{cap[1]}, bf16_native={native}")
    want = torch.bfloat16 if cap >= (8, 0) else torch.float16
    out.check("autocast_dtype is bfloat16 on Ampere+, float16 before", dtype == want, f"got {dtype}, want {want}")
    out.check("needs_loss_scaling is True exactly for float16", scaling == (dtype == torch.float16), f"got {scaling}")
    if isinstance(mem_gb, float):
        out.check("gpu_memory_gb matches get_device_properties", abs(mem_gb - props.total_memory / 1e9) < 0.01,
                  f"{mem_gb:.2f} GB")
    summary = _call(hardware, "hardware_summary")
    out.check("the hardware line names this GPU", name in str(summary), str(summary))
    if sheet is None:
        out.note(f"{name!r} is not in hardware.DATASHEETS: no % of peak in the matmul section.")



# --------------------------------------------------------------------------------------------
# 2. Matmul speed
# --------------------------------------------------------------------------------------------
def square_pair(torch: Any, size: int, dtype: str, device: str) -> tuple[Any, Any]:
    """Two random ``size x size`` matrices of ``dtype`` on ``device`` (seeded)."""
    gen = torch.Generator(device=device).manual_seed(0)
    dt = getattr(torch, dtype)
    return (torch.randn(size, size, generator=gen, device=device, dtype=dt),
            torch.randn(size, size, generator=gen, device=device, dtype=dt))


def time_square_matmul(torch: Any, size: int, dtype: str, device: str,
                       min_run_time: float = MATMUL_MIN_RUN_S) -> dict[str, Any]:
    """``a @ b`` timed with ``Timer(...).blocked_autorange(min_run_time)`` after 3 untimed runs: matmul_stats."""
    from torch.utils import benchmark

    if not isinstance(min_run_time, (int, float)) or isinstance(min_run_time, bool) or min_run_time <= 0:
        raise ValueError(f"min_run_time must be a positive number of seconds, got {min_run_time!r}")
    a, b = square_pair(torch, size, dtype, device)
    timer = benchmark.Timer(stmt="a @ b", globals={"a": a, "b": b}, label=f"{size}x{size} matmul",
                            description=dtype)
    timer.timeit(3)  # warm-up: clocks up, cuBLAS picks its kernel
    measurement = timer.blocked_autorange(min_run_time=min_run_time)
    stats = matmul_stats(size, list(measurement.times))
    stats["number_per_run"] = int(getattr(measurement, "number_per_run", 1))
    del a, b
    return stats


def section_matmul(ctx: Context, out: Outcome) -> None:
    """4096² and 8192² matmuls in three dtypes, blocked_autorange: median, spread, TFLOP/s vs the datasheet."""
    torch = ctx.torch
    from course_utils import hardware, precision

    name = torch.cuda.get_device_name(0)
    sheet = hardware.datasheet_for(name)
    native = bool(hardware.bf16_native(ctx.device))
    cap = torch.cuda.get_device_capability(0)
    out.data.update(sizes=list(MATMUL_SIZES), gpu=name, datasheet=as_plain(sheet), min_run_time_s=MATMUL_MIN_RUN_S,
                    allow_tf32=bool(torch.backends.cuda.matmul.allow_tf32),
                    float32_matmul_precision=torch.get_float32_matmul_precision())
    rows, timings = [], []
    for case in plan_matmul(native):
        size, dtype = case["size"], case["dtype"]
        if ctx.left() < 5:
            out.skip_part(f"{size}x{size} {dtype} not timed: section time used up", "time")
            continue
        stats = time_square_matmul(torch, size, dtype, ctx.device)
        peak = peak_tflops(dtype, sheet, native)
        pct = percent_of_peak(stats["tflops"], peak)
        course = precision.fraction_of_peak(precision.MatmulTiming(size, dtype, ctx.device, stats["median_ms"],
                                                                   stats["tflops"]), sheet)
        timings.append({**stats, "dtype": dtype, "emulated": case["emulated"], "peak_tflops": peak,
                        "percent_of_peak": pct, "course_fraction_of_peak": course})
        note = (f"emulated: compute capability {cap[0]}.{cap[1]} has no bfloat16 tensor cores, no % of peak"
                if case["emulated"] else "")
        rows.append([size, dtype, stats["median_ms"], stats["iqr_ms"], f"{stats['min_ms']:.3f}-{stats['max_ms']:.3f}",
                     stats["runs"], stats["tflops"], stats["best_tflops"], peak, pct, note])
        out.check(f"{size} {dtype}: a positive, finite TFLOP/s", math.isfinite(stats["tflops"]) and stats["tflops"] > 0,
                  f"{stats['tflops']:.2f}")
        same = (pct is None and course is None) or (
            pct is not None and course is not None and abs(pct - 100 * course) < 1e-6 * max(pct, 1))
        out.check(f"{size} {dtype}: precision.fraction_of_peak agrees with 2n^3/t over the datasheet", same,
                  f"course {course}, here {pct}")
    out.data["timings"] = timings
    out.table(f"Square matmuls, torch.utils.benchmark blocked_autorange(min_run_time={MATMUL_MIN_RUN_S:g}) after 3 "
              "warm-up runs; TFLOP/s at the median", ["size", "dtype", "median ms", "IQR ms", "min-max ms",
                                                      "measurements", "TFLOP/s", "best TFLOP/s", "datasheet TFLOP/s",
                                                      "% of peak", "note"], rows)
    for size in MATMUL_SIZES:
        ms = {t["dtype"]: t["median_ms"] for t in timings if t["size"] == size}
        if "float32" in ms and "float16" in ms:
            speedup = ms["float32"] / ms["float16"]
            out.data[f"float16_speedup_{size}"] = speedup
            out.check(f"{size}: float16 is faster than float32 (tensor cores)", speedup > 1.0, f"{speedup:.1f}x")
    if not native:
        out.skip_part(f"bfloat16 not compared with a peak, and not timed at {MATMUL_SIZES[-1]}: it is emulated on "
                      f"compute capability {cap[0]}.{cap[1]} (hardware.bf16_native() is False)", "n/a")
    lesson_matmul(ctx, out, precision)
    if any(t["dtype"] == "float32" and (t["percent_of_peak"] or 0) > 100 for t in timings):
        out.note("float32 above 100 % of the float32 datasheet peak: TF32 tensor cores are probably in use "
                 f"(allow_tf32={torch.backends.cuda.matmul.allow_tf32}, precision "
                 f"{torch.get_float32_matmul_precision()!r}).")
    if sheet is None:
        out.note(f"{name!r} is not in hardware.DATASHEETS: % of peak is n/a.")


def lesson_matmul(ctx: Context, out: Outcome, precision: Any) -> None:
    """The lessons' own helper, precision.time_matmul, once on CUDA (4096², float16)."""
    if ctx.left() < 3:
        out.skip_part("precision.time_matmul not run: section time used up", "time")
        return
    t = precision.time_matmul(MATMUL_SIZES[0], "float16", ctx.device, min_run_time=MATMUL_MIN_RUN_S)
    out.data["lesson_time_matmul"] = {"size": t.size, "dtype": t.dtype, "device": t.device, "ms": t.ms,
                                      "tflops": t.tflops}
    out.check("precision.time_matmul on CUDA: a positive, finite TFLOP/s on the GPU",
              math.isfinite(t.tflops) and t.tflops > 0 and str(t.device).startswith("cuda"),
              f"{t.tflops:.2f} TFLOP/s on {t.device}")


# --------------------------------------------------------------------------------------------
# 3. Mixed-precision training loop
# --------------------------------------------------------------------------------------------
def lesson_task(precision: Any, torch: Any) -> tuple[Any, str]:
    """Notebook 02's digits task (needs scikit-learn), or a synthetic 64-feature, 10-class task without it."""
    from course_utils import digits

    try:
        return digits.load_digits_data(), "scikit-learn digits (notebooks 01 and 02's task)"
    except ImportError:
        g = torch.Generator().manual_seed(0)
        x = torch.rand(1797, 64, generator=g)
        y = (x @ torch.randn(64, 10, generator=g)).argmax(dim=1)
        return digits.DigitsData(x[:1347], y[:1347], x[1347:], y[1347:]), "synthetic (scikit-learn is not installed)"


def overflow_step_leaves_weights(ctx: Context, precision: Any, task: Any) -> tuple[bool, float, float]:
    """One float16 step whose loss is multiplied by 1e6: (weights unchanged?, scale before, scale after)."""
    torch = ctx.torch
    from course_utils import digits

    model = digits.make_mlp(seed=0, **precision.CLASSIFIER).to(ctx.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    kind = torch.device(ctx.device).type
    scaler = torch.amp.GradScaler(kind)
    x, y = next(task.batches(1, 64, seed=0))
    x, y = x.to(ctx.device), y.to(ctx.device)
    before = [p.detach().clone() for p in model.parameters()]
    with torch.autocast(device_type=kind, dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    scale0 = float(scaler.get_scale())
    scaler.scale(loss * 1e6).backward()
    scaler.step(optimizer)
    scaler.update()
    same = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    return same, scale0, float(scaler.get_scale())


def section_mixed_precision(ctx: Context, out: Outcome) -> None:
    """Notebook 02's loop on CUDA: float16 + GradScaler with a forced overflow; bfloat16 where native."""
    torch = ctx.torch
    from course_utils import hardware, precision

    task, source = lesson_task(precision, torch)
    out.data["task"] = source
    runs: dict[str, Any] = {}
    runs["float32"] = precision.train_mixed_precision("float32", device=ctx.device, steps=200, task=task)
    spike = 60
    runs["float16"] = fp16 = precision.train_mixed_precision("float16", device=ctx.device, steps=100,
                                                             spike_at=(spike,), task=task)
    if hardware.bf16_native(ctx.device):
        runs["bfloat16"] = precision.train_mixed_precision("bfloat16", device=ctx.device, steps=200, task=task)
    else:
        cap = torch.cuda.get_device_capability(0)
        out.skip_part(f"bfloat16 loop not run: compute capability {cap[0]}.{cap[1]} has no native bfloat16 "
                      "(torch can emulate it; the lessons use float16 + loss scaling here)", "n/a")
    rows = []
    for name, r in runs.items():
        losses = [h.loss for h in r.history]
        skipped = [h.step for h in r.history if h.skipped]
        rows.append([name, r.loss_scaling, len(r.history), losses[0], losses[-1], r.test_accuracy,
                     ", ".join(map(str, skipped)) or "none"])
        out.check(f"{name}: losses finite", all(math.isfinite(v) for v in losses),
                  f"first {losses[0]:.3f}, last {losses[-1]:.3f}")
        out.check(f"{name}: loss went down", losses[-1] < losses[0], f"{losses[0]:.3f} -> {losses[-1]:.3f}")
    out.table("Training runs (precision.train_mixed_precision on CUDA)",
              ["dtype", "loss scaling", "steps", "first loss", "last loss", "test accuracy", "skipped steps"], rows)
    around = [h for h in fp16.history if spike - 2 <= h.step <= spike + 2]
    out.table(f"float16 around the forced overflow (loss x 1e4 at step {spike})",
              ["step", "loss", "scale after the step", "skipped"],
              [[h.step, h.loss, h.scale, h.skipped] for h in around])
    before = fp16.history[spike - 2].scale
    at = fp16.history[spike - 1]
    out.data["float16_spike"] = {"step": spike, "scale_before": before, "scale_after": at.scale, "skipped": at.skipped}
    out.check("float16: the GradScaler is on", fp16.loss_scaling)
    out.check("float16: the overflowing step was skipped and the scale reduced",
              at.skipped and at.scale < before, f"scale {before:,.0f} -> {at.scale:,.0f}")
    if "bfloat16" in runs:
        out.check("bfloat16: no loss scaling", not runs["bfloat16"].loss_scaling)
    unchanged, s0, s1 = overflow_step_leaves_weights(ctx, precision, task)
    out.data["direct_overflow_step"] = {"weights_unchanged": unchanged, "scale_before": s0, "scale_after": s1}
    out.check("a float16 step with loss x 1e6: weights untouched, scale halved", unchanged and s1 == s0 / 2,
              f"weights unchanged={unchanged}, scale {s0:,.0f} -> {s1:,.0f}")
    kept = autocast_float32_ops(torch, ctx.device, hardware.autocast_dtype(ctx.device))
    out.check("CUDA autocast keeps softmax and layer_norm in float32 (notebook 02, rule 2)",
              all(d == torch.float32 for d in kept.values()), str(kept))


def autocast_float32_ops(torch: Any, device: Any, dtype: Any) -> dict[str, Any]:
    """The dtypes softmax and layer_norm give under autocast on ``device`` (CUDA keeps both in float32)."""
    with torch.autocast(device_type=torch.device(device).type, dtype=dtype):
        h = torch.nn.Linear(8, 8).to(device)(torch.randn(4, 8, device=device))
        return {"softmax": torch.softmax(h, dim=-1).dtype,
                "layer_norm": torch.nn.functional.layer_norm(h, h.shape[-1:]).dtype}


# --------------------------------------------------------------------------------------------
# 4. Micro-batch sweep (notebook 03)
# --------------------------------------------------------------------------------------------
def section_microbatch_sweep(ctx: Context, out: Outcome) -> None:
    """accumulation.sweep_micro_batches on CUDA: same gradient, activation memory (allocator) and time."""
    from course_utils import accumulation as acc

    rows = acc.sweep_micro_batches(acc.MICRO_BATCH_SIZES, batch_size=64, device=ctx.device)
    out.data["memory_what"] = rows[0].memory_what
    out.data["rows"] = [r.__dict__ if hasattr(r, "__dict__") else r._asdict() for r in rows]
    out.table("Micro-batch sweep, batch 64 (" + rows[0].memory_what + ")",
              ["micro-batch", "steps", "same gradient", "largest diff", "activation MB", "ms per batch"],
              [[r.micro_batch_size, r.accumulation_steps, r.same_gradient, r.max_difference,
                r.activation_bytes / 1e6, r.seconds * 1e3] for r in rows])
    out.check("the CUDA allocator was measured", rows[0].memory_what.startswith("CUDA"), rows[0].memory_what)
    bad = [r.micro_batch_size for r in rows if not r.same_gradient]
    out.check("every micro-batch size gives the batch's gradient", not bad, f"differs at {bad}" if bad else "")
    small, big = min(rows, key=lambda r: r.micro_batch_size), max(rows, key=lambda r: r.micro_batch_size)
    out.check("activation memory grows with the micro-batch", big.activation_bytes > small.activation_bytes,
              f"{small.activation_bytes / 1e6:.2f} MB at {small.micro_batch_size}, "
              f"{big.activation_bytes / 1e6:.2f} MB at {big.micro_batch_size}")


# --------------------------------------------------------------------------------------------
# 5. Estimate vs measured; the tricks of notebook 05
# --------------------------------------------------------------------------------------------
ESTIMATE_KEYS = ("method", "batch", "seq", "lora_rank", "targets", "checkpointing", "optimizer", "accumulation")
#: Least seconds left in the section to start one more measured case, the tricks, and torch.compile.
CASE_MIN_S, TRICKS_MIN_S, COMPILE_MIN_S = 6.0, 15.0, 30.0
COMPILE_MAX_S = 240.0
#: Words of a trick's ``skipped`` reason that mean it ran out of time (anything else is a failure).
TIME_WORDS = ("did not finish within", "budget", "timed out", "timeout")


class Background:
    """One call run in a daemon thread (the wait for the torch.compile child); join() gives its result."""

    def __init__(self, fn: Callable[[], Any], name: str = "gpu-check-background") -> None:
        self.fn, self.result, self.error = fn, None, None
        self.started = math.nan
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        """The thread's body: keep the result or the error."""
        try:
            self.result = self.fn()
        except BaseException as err:  # noqa: BLE001 - handed to join(), in the main thread
            self.error = err

    def start(self) -> Background:
        """Start the call; returns self."""
        self.started = time.monotonic()
        self.thread.start()
        return self

    def elapsed(self) -> float:
        """Seconds since start()."""
        return time.monotonic() - self.started

    def join(self, timeout_s: float) -> Any:
        """The call's result, its own error raised again, or TimeoutError when it still runs after ``timeout_s``."""
        self.thread.join(max(0.0, float(timeout_s)))
        if self.thread.is_alive():
            raise TimeoutError(f"still running after {timeout_s:.0f} s more")
        if self.error is not None:
            raise self.error
        return self.result


def cuda_estimate(sm: Any, kwargs: dict[str, Any], baseline_bytes: int) -> Any:
    """step_memory.estimate_step for the same arguments as a CUDA measurement, with its allocator baseline."""
    return sm.estimate_step(STANDIN_CONFIG, autocast=bool(kwargs.get("autocast")), device="cuda",
                            baseline_bytes=int(baseline_bytes), **{k: kwargs[k] for k in ESTIMATE_KEYS if k in kwargs})


def check_measurement(out: Outcome, label: str, m: Any, case: dict[str, Any]) -> None:
    """The checks every measured case gets: CUDA allocator, the planned steps, fp16 autocast with GradScaler."""
    out.check(f"{label}: measured on the CUDA allocator", str(m.device).startswith("cuda") and m.peak_bytes > 0,
              m.what)
    want = case.get("steps", MEASURED_STEPS)
    out.check(f"{label}: {want} measured steps", m.steps == want, f"steps={m.steps}")
    if case.get("fp16"):
        scaling = (m.extra or {}).get("loss_scaling")
        out.check(f"{label}: float16 autocast with loss scaling (GradScaler on)",
                  m.autocast == "float16" and scaling is True, f"autocast={m.autocast}, loss_scaling={scaling}")


def measure_step_cases(ctx: Context, out: Outcome, measure: Any, sm: Any, cases: Sequence[dict[str, Any]]) -> None:
    """measure_training_step for each planned case, in this process as the notebooks run it on a GPU, against
    estimate_step given the measured allocator baseline."""
    rows, records = [], []
    for case in cases:
        label, kwargs = case["label"], case_kwargs(case)
        if ctx.left() < CASE_MIN_S:
            out.skip_part(f"{label} not measured: section time used up", "time")
            rows.append([label, None, None, None, None, None, "skipped: time"])
            continue
        free_memory(ctx.torch)
        try:
            m = measure.measure_training_step(STANDIN_CONFIG, device=ctx.device, **kwargs)
            est = cuda_estimate(sm, kwargs, m.baseline_bytes)
        except Exception as err:  # noqa: BLE001 - record this case, measure the others
            info = describe_error(err)
            out.data.setdefault("case_errors", []).append({"case": label, **info})
            out.check(f"{label}: measured", False, f"{info['type']}: {info['message'][:300]}")
            rows.append([label, None, None, None, None, None, f"failed: {info['type']}"])
            continue
        err = error_pct(est.peak_bytes, m.peak_bytes)
        records.append({"case": label, "kwargs": kwargs, "estimate_bytes": est.peak_bytes,
                        "estimate_gb": gb(est.peak_bytes), "estimate_moment": est.peak_moment, "error_pct": err,
                        "measurement": m.to_dict()})
        out.data["estimate_errors"].append({"case": label, "error_pct": err, "source": "step_memory.estimate_step"})
        rows.append([label, gb(est.peak_bytes), gb(m.peak_bytes), err, gb(m.reserved_bytes), m.step_seconds,
                     est.peak_moment])
        check_measurement(out, label, m, case)
    out.data["estimate_vs_measured"] = records
    out.table(f"Whole-step estimate vs measured CUDA allocator peak (SmolLM2-135M architecture, seq {STEP_SEQ}, "
              f"{MEASURED_STEPS} measured steps after a warm-up, in-process as the notebooks run it on a GPU; the "
              "estimate gets the measured allocator baseline)",
              ["case", "estimate GB", "measured GB", "error %", "reserved GB", "step s", "estimated peak moment"], rows)
    if records:
        worst = max(records, key=lambda c: abs(c["error_pct"]))
        out.note(f"largest estimate error: {worst['error_pct']:+.1f} % ({worst['case']}); --strict fails above "
                 f"{ESTIMATE_LIMIT_PCT:g} %.")


def start_compile(ctx: Context, out: Outcome, tricks: Any, base: dict[str, Any]) -> tuple[Background | None, float]:
    """Start tricks.measure_tricks(['compile']) in a thread (its bounded child process compiles while the
    in-process cases run; allocator peaks are per process): the running call and its time limit."""
    limit = min(COMPILE_MAX_S, ctx.left() - 10)
    if limit < COMPILE_MIN_S:
        out.skip_part(f"torch.compile not measured: {max(limit, 0):.0f} s left in the section", "time")
        return None, 0.0
    run = Background(lambda: tricks.measure_tricks(STANDIN_CONFIG, base, ["compile"], compile_timeout_s=limit,
                                                   device=ctx.device), name="gpu-check-compile")
    return run.start(), limit


def finish_compile(out: Outcome, run: Background | None, limit: float) -> list[Any]:
    """The compile trick's rows once its child is done (or stopped at its limit), [] when it did not run."""
    if run is None:
        return []
    try:
        return list(run.join(limit + 20 - run.elapsed()))
    except TimeoutError:
        out.skip_part("torch.compile: its child process still ran at the section's end (ended with the run)", "time")
    except Exception as err:  # noqa: BLE001 - older course_utils raised where it now returns a skipped row
        info = describe_error(err)
        out.check("trick compile: tricks.measure_tricks ran", False, f"{info['type']}: {info['message'][:300]}")
    return []


def measure_tricks_in_process(ctx: Context, out: Outcome, tricks: Any, base: dict[str, Any],
                              keys: Sequence[str]) -> list[Any]:
    """tricks.measure_tricks for the in-process tricks on CUDA (a failed case comes back as a skipped row)."""
    if ctx.left() < TRICKS_MIN_S:
        out.skip_part(f"tricks {', '.join(keys)} not measured: section time used up", "time")
        return []
    free_memory(ctx.torch)
    try:
        return list(tricks.measure_tricks(STANDIN_CONFIG, base, list(keys), timeout_s=max(1.0, min(600.0, ctx.left())),
                                          device=ctx.device))
    except Exception as err:  # noqa: BLE001 - older course_utils raised on a failed case: record it
        info = describe_error(err)
        out.check("tricks.measure_tricks ran on CUDA", False, f"{info['type']}: {info['message'][:300]}")
        return []


def trick_record(row: Any, verdict: str, mode: str) -> dict[str, Any]:
    """A TrickResult as plain data: its own fields (the measurement as StepMeasurement.to_dict()), the estimate
    error (torch.compile is not modelled by the estimate), the verdict and how it ran."""
    if not dataclasses.is_dataclass(row) or isinstance(row, type):
        raise TypeError(f"row must be a tricks.TrickResult, got {type(row).__name__}")
    data = {f.name: getattr(row, f.name) for f in dataclasses.fields(row) if f.name != "measurement"}
    m = row.measurement
    data["measurement"] = m.to_dict() if hasattr(m, "to_dict") else None
    modelled = row.key != "compile"
    est, peak = row.estimate_bytes, row.peak_bytes
    data.update(peak_gb=gb(peak), estimate_gb=gb(est) if modelled else None,
                error_pct=error_pct(est, peak) if (modelled and est and peak) else None,
                allocator_baseline_gb=gb(m.baseline_bytes) if m is not None else None, verdict=verdict, mode=mode)
    return data


def skipped_for_time(reason: str) -> bool:
    """Whether a trick's ``skipped`` reason says it ran out of time (not that its step failed)."""
    if not isinstance(reason, str):
        raise TypeError(f"reason must be a string, got {type(reason).__name__}")
    return "failed" not in reason and any(word in reason for word in TIME_WORDS)


def judge_trick(out: Outcome, row: Any) -> None:
    """A trick skipped for time is a skipped part; skipped for any other reason it failed; measured, its checks."""
    if row.skipped:
        if skipped_for_time(row.skipped):
            out.skip_part(f"trick {row.key}: {row.skipped}", "time")
        else:
            out.check(f"trick {row.key}: measured", False, row.skipped)
        return
    m = row.measurement
    if m is None:
        out.check(f"trick {row.key}: measured", False, "no measurement and no reason")
        return
    check_measurement(out, f"trick {row.key}", m, {"steps": MEASURED_STEPS})


def report_tricks(out: Outcome, tricks: Any, results: Sequence[Any]) -> None:
    """The tricks' table, data, checks and estimate errors."""
    baseline = next((r for r in results if r.key == "baseline"), None)
    rows, data = [], []
    for r in results:
        mode = "child process, alongside the in-process cases" if r.key == "compile" else "in-process"
        rec = trick_record(r, tricks.verdict(r, baseline) if baseline is not None else "", mode)
        data.append(rec)
        rows.append([r.label, rec["peak_gb"], r.step_seconds, r.first_step_seconds, rec["estimate_gb"],
                     rec["error_pct"], rec["allocator_baseline_gb"], mode, rec["verdict"]])
        if rec["error_pct"] is not None:
            out.data["estimate_errors"].append({"case": f"trick {r.key}", "error_pct": rec["error_pct"],
                                                "source": "tricks.measure_tricks"})
        judge_trick(out, r)
    out.data["tricks"] = data
    out.table(f"Notebook 05's tricks on CUDA (full fine-tuning, batch 4, seq {STEP_SEQ}, {MEASURED_STEPS} measured "
              "steps; estimate as tricks.measure_tricks makes it; torch.compile is not modelled by the estimate)",
              ["trick", "peak GB", "step s", "first step s", "estimate GB", "error %", "allocator baseline GB",
               "run", "verdict"], rows)
    eight = next((r for r in results if r.key == "adamw8bit" and r.optimizer_bytes), None)
    if eight is not None and baseline is not None and baseline.optimizer_bytes:
        ratio = eight.optimizer_bytes / baseline.optimizer_bytes
        out.check("8-bit AdamW keeps under half the optimizer bytes of AdamW", ratio < 0.5, f"ratio {ratio:.2f}")


def section_step_memory(ctx: Context, out: Outcome) -> None:
    """estimate_step vs measure_training_step (allocator peak) on CUDA, fp16 + GradScaler included, then
    tricks.measure_tricks (torch.compile's child compiling meanwhile)."""
    from course_utils import hardware, measure, tricks
    from course_utils import step_memory as sm

    native = bool(hardware.bf16_native(ctx.device))
    bnb = requirement_problem("bitsandbytes")
    base, keys = trick_plan(bnb is None)
    out.data.update(measured_steps=MEASURED_STEPS, tricks_base=base, estimate_errors=[])
    if bnb:
        out.skip_part(f"8-bit AdamW not measured: {bnb}", "library", "bitsandbytes")
    compile_run, limit = start_compile(ctx, out, tricks, base)
    measure_step_cases(ctx, out, measure, sm, step_cases(native))
    results = measure_tricks_in_process(ctx, out, tricks, base, keys)
    report_tricks(out, tricks, results + finish_compile(out, compile_run, limit))


# --------------------------------------------------------------------------------------------
# 6. QLoRA on the stand-in
# --------------------------------------------------------------------------------------------
def load_4bit(ctx: Context, models: Any, choice: Any, compute_dtype: str, default: bool) -> Any:
    """The stand-in in 4 bits: models.load_model for the GPU's own dtype; for another ``compute_dtype`` the same
    from_pretrained call with models.quantization_config(4, compute_dtype) (and that dtype for the rest)."""
    if default:
        return models.load_model(choice, bits=4, device=ctx.device)
    from transformers import AutoModelForCausalLM

    from course_utils.quiet import quiet_libraries

    dt = getattr(ctx.torch, compute_dtype)
    settings = {**models.dtype_kwargs(dt), "device_map": models.device_map(ctx.device),
                "quantization_config": models.quantization_config(4, dt)}
    with quiet_libraries():
        model = AutoModelForCausalLM.from_pretrained(choice.name, **settings)
    model.eval()
    return model


def quant_compute_dtype(model: Any) -> str:
    """The 4-bit compute dtype in the model's quantization config, as 'float16' / 'bfloat16' ('?' if none)."""
    qc = getattr(getattr(model, "config", None), "quantization_config", None)
    value = qc.get("bnb_4bit_compute_dtype") if isinstance(qc, dict) else getattr(qc, "bnb_4bit_compute_dtype", None)
    return "?" if value is None else str(value).replace("torch.", "")


def qlora_run(ctx: Context, out: Outcome, case: dict[str, Any], choice: Any) -> list[Any]:
    """One QLoRA case: 4-bit load with the case's compute dtype, LoRA, AdamW steps, generate; its table row."""
    torch = ctx.torch
    from course_utils import lora, models

    tag = case["compute_dtype"]
    free_memory(torch)
    reset_peak(ctx)
    t0 = time.monotonic()
    model = load_4bit(ctx, models, choice, tag, default=not case["forced"])
    load_s = time.monotonic() - t0
    base_footprint = model.get_memory_footprint()
    tokenizer = models.load_tokenizer(choice)
    four_bit = [m for m in model.modules() if type(m).__name__ == "Linear4bit"]
    compute = quant_compute_dtype(model)
    out.check(f"{tag}: loaded in 4 bits", bool(getattr(model, "is_loaded_in_4bit", False)) and bool(four_bit),
              f"is_loaded_in_4bit={getattr(model, 'is_loaded_in_4bit', None)}, {len(four_bit)} Linear4bit layers")
    out.check(f"{tag}: the 4-bit layers compute in {tag}", compute == tag, f"bnb_4bit_compute_dtype={compute}")
    out.check(f"{tag}: the weights are on the GPU", next(model.parameters()).device.type == "cuda",
              str(next(model.parameters()).device))
    model = lora.add_lora(model)
    trainable, total = lora.trainable_counts(model)
    batches = models.training_batches(tokenizer, models.training_texts(), batch_size=4, max_length=32,
                                      device=ctx.device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    model.train()
    losses: list[float] = []
    t0 = time.monotonic()
    for step in range(QLORA_STEPS):
        if ctx.left() < 5:
            out.skip_part(f"{tag}: training stopped after {step} steps: section time used up", "time")
            break
        loss = model(**batches[step % len(batches)]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    train_s = time.monotonic() - t0
    text, gen_s = "", None
    if ctx.left() >= 3:
        t0 = time.monotonic()
        text = models.generate_text(model, tokenizer, PROMPT, max_new_tokens=10)
        gen_s = time.monotonic() - t0
    else:
        out.skip_part(f"{tag}: generate_text not run: section time used up", "time")
    footprint, peak = model.get_memory_footprint(), peak_allocated(ctx)
    layer_dtypes = sorted({str(getattr(m, "compute_dtype", None)).replace("torch.", "") for m in four_bit})
    out.data.setdefault("cases", []).append({
        "case": case["label"], "compute_dtype": compute, "layer_compute_dtypes": layer_dtypes,
        "linear4bit_layers": len(four_bit), "trainable": trainable, "total_params": total, "losses": losses,
        "text": text, "base_footprint_gb": base_footprint / 1e9, "footprint_gb": footprint / 1e9, "peak_gb": gb(peak),
        "load_seconds": load_s, "train_seconds": train_s, "generate_seconds": gen_s})
    out.text(f"generate_text, {tag} compute (random weights: noise is expected)", text)
    out.check(f"{tag}: losses finite", bool(losses) and all(math.isfinite(v) for v in losses), str(losses))
    if gen_s is not None:
        out.check(f"{tag}: generated text is longer than the prompt", len(text) > len(PROMPT), repr(text))
    del model, optimizer, batches
    return [case["label"], load_s, base_footprint / 1e9, footprint / 1e9, f"{trainable:,} / {total:,}",
            ", ".join(f"{v:.3f}" for v in losses), train_s, gen_s, gb(peak)]


def section_qlora(ctx: Context, out: Outcome) -> None:
    """The stand-in in 4 bits + LoRA: 8 AdamW steps, then 10 generated tokens; float16 compute on every GPU."""
    from course_utils import hardware, hub, standin

    choice = hub.ModelChoice(str(standin.ensure_standin()), True, "gpu_check always uses the offline stand-in")
    out.data["model"] = choice.label
    rows = []
    for case in qlora_cases(bool(hardware.bf16_native(ctx.device))):
        if ctx.left() < 10:
            out.skip_part(f"{case['label']} not run: section time used up", "time")
            continue
        rows.append(qlora_run(ctx, out, case, choice))
        free_memory(ctx.torch)
    out.table(f"QLoRA on {choice.label}", ["case", "4-bit load s", "footprint after load GB", "footprint with LoRA GB",
                                           "trainable / all parameters", f"losses ({QLORA_STEPS} AdamW steps)",
                                           "training s", "generate 10 tokens s", "peak allocated GB"], rows)


# --------------------------------------------------------------------------------------------
# 7. gloo DDP after CUDA is initialised (notebook 03)
# --------------------------------------------------------------------------------------------
def section_ddp(ctx: Context, out: Outcome) -> None:
    """ddp.run_ddp_check with gloo, started after a CUDA tensor exists (forked ranks must not inherit CUDA)."""
    torch = ctx.torch
    if not torch.distributed.is_available():
        raise Skip("torch.distributed is not available in this torch build")
    from course_utils import ddp

    marker = torch.ones(1, device=ctx.device)  # CUDA is initialised in this process from here on
    if ctx.device.startswith("cuda"):
        torch.cuda.synchronize()
    out.data["cuda_initialised"] = bool(torch.cuda.is_initialized())
    out.check("CUDA is initialised before the ranks start", out.data["cuda_initialised"] or
              not ctx.device.startswith("cuda"))
    out.data["start_method"] = ddp.start_method()
    timeout = max(10.0, min(120.0, ctx.left() - 5))
    result = ddp.run_ddp_check(world_size=2, batch_size=64, accumulation_steps=4, backend="gloo", timeout_s=timeout)
    del marker
    out.data.update(result.__dict__)
    out.text("run_ddp_check(...).report()", result.report())
    out.table("gloo DDP, 2 processes x 4 micro-batches of 8", ["figure", "value"], [
        ["start method", ddp.start_method()], ["same gradient as one process", result.same_gradient],
        ["ranks agree", result.ranks_agree], ["largest difference", result.max_difference],
        ["all-reduces per update with no_sync()", result.allreduce_calls],
        ["all-reduces without no_sync()", result.allreduce_calls_without_no_sync], ["seconds", result.seconds]])
    out.check("same gradient as one process's batch of 64", result.same_gradient)
    out.check("all ranks hold the same gradient", result.ranks_agree)
    out.check("one all-reduce per update with no_sync()", result.allreduce_calls == 1, str(result.allreduce_calls))


# --------------------------------------------------------------------------------------------
# 8. Memory-efficient TrainingArguments with the Trainer (notebook 05)
# --------------------------------------------------------------------------------------------
def trainer_arguments(tricks: Any, folder: str, device: str, case: dict[str, Any],
                      bitsandbytes: bool) -> tuple[Any, list[str]]:
    """The lesson's TrainingArguments for ``device`` (max_steps=2); for a forced case, built from the same plan
    (tricks.training_arguments_plan) with FP16_TRAINING_KWARGS, what a T4 gets."""
    if not case["forced"]:
        return tricks.memory_efficient_training_arguments(folder, max_steps=2, device=device)
    from transformers import TrainingArguments

    from course_utils.quiet import quiet_libraries

    kwargs, changes = tricks.training_arguments_plan(folder, max_steps=2, device=device, bitsandbytes=bitsandbytes)
    kwargs.update(FP16_TRAINING_KWARGS)
    kwargs.setdefault("report_to", "none")
    changes = [*changes, "bf16=True -> fp16=True, bf16=False: forced by gpu_check, so that the T4 branch (float16 "
               "autocast with the Trainer's loss scaling) runs on this GPU too"]
    with quiet_libraries():
        return TrainingArguments(**kwargs), changes


def trainer_run(ctx: Context, out: Outcome, tricks: Any, case: dict[str, Any], bitsandbytes: bool) -> list[Any]:
    """One Trainer case: its arguments, 2 steps with tricks.run_trainer_steps, the checks; its table row."""
    folder = tempfile.mkdtemp(prefix="gpu-check-trainer-")
    tag = "fp16" if case["fp16"] else "bf16"
    try:
        args, changes = trainer_arguments(tricks, folder, ctx.device, case, bitsandbytes)
        if getattr(args, "report_to", None) not in ([], None, "none", ["none"]):
            out.note(f"{tag}: report_to was {args.report_to!r}: set to [] so that no tracker is contacted offline.")
            with contextlib.suppress(Exception):
                args.report_to = []
        optim = getattr(args.optim, "value", args.optim)
        settings = {"bf16": args.bf16, "fp16": args.fp16, "optim": optim,
                    "checkpointing": tricks.checkpointing_enabled(args),
                    "per_device_train_batch_size": args.per_device_train_batch_size,
                    "gradient_accumulation_steps": args.gradient_accumulation_steps, "max_steps": args.max_steps}
        out.text(f"{case['label']}: changes from the lesson's arguments", "\n".join(f"- {c}" for c in changes))
        out.check(f"{tag}: bf16={not case['fp16']}, fp16={case['fp16']} as planned",
                  bool(args.bf16) == (not case["fp16"]) and bool(args.fp16) == case["fp16"],
                  f"bf16={args.bf16}, fp16={args.fp16}")
        free_memory(ctx.torch)
        run = tricks.run_trainer_steps(STANDIN_CONFIG, args, batch_examples=32, seq=64)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    peak = run["peak"]
    out.data.setdefault("cases", []).append({"case": case["label"], "changes": changes, "settings": settings,
                                             "steps": run["steps"], "losses": run["losses"],
                                             "seconds": run["seconds"], "peak_gb": peak.gb, "peak_what": peak.what})
    out.check(f"{tag}: 2 optimizer steps done", run["steps"] == 2, str(run["steps"]))
    out.check(f"{tag}: losses logged and finite", bool(run["losses"]) and all(math.isfinite(v) for v in run["losses"]),
              str(run["losses"]))
    out.check(f"{tag}: peak read from the CUDA allocator", str(peak.what).startswith("CUDA"), str(peak.what))
    return [case["label"], settings["bf16"], settings["fp16"], optim, settings["checkpointing"],
            f"{settings['per_device_train_batch_size']} x {settings['gradient_accumulation_steps']}", run["steps"],
            ", ".join(map(str, run["losses"])), run["seconds"], peak.gb]


def section_trainer(ctx: Context, out: Outcome) -> None:
    """tricks.memory_efficient_training_arguments(max_steps=2) + tricks.run_trainer_steps on the stand-in; on
    Ampere+ again with fp16=True forced."""
    from course_utils import hardware, tricks

    native = bool(hardware.bf16_native(ctx.device))
    bnb = requirement_problem("bitsandbytes")
    if bnb:
        out.skip_part(f"8-bit AdamW in the Trainer (optim='adamw_torch' instead): {bnb}", "library", "bitsandbytes")
    rows = []
    for case in trainer_cases(native):
        if ctx.left() < 12:
            out.skip_part(f"{case['label']} not run: section time used up", "time")
            continue
        rows.append(trainer_run(ctx, out, tricks, case, bnb is None))
    out.table("Trainer, SmolLM2-135M architecture (random weights), 64-token random sequences, max_steps=2",
              ["case", "bf16", "fp16", "optim", "checkpointing", "batch x accumulation", "steps", "losses", "seconds",
               "peak GB"], rows)


SECTIONS: tuple[Section, ...] = (
    Section(1, "environment", "Environment and the hardware decisions", section_environment, min_s=3, cap_s=10),
    Section(2, "matmul", "Matmul speed: 4096² and 8192², float32, float16, bfloat16", section_matmul,
            min_s=10, cap_s=30),
    Section(3, "mixed_precision", "Mixed-precision training loop (notebook 02)", section_mixed_precision,
            min_s=8, cap_s=25),
    Section(4, "microbatch_sweep", "Micro-batch sweep on CUDA (notebook 03)", section_microbatch_sweep,
            min_s=5, cap_s=15),
    Section(5, "step_memory", "Whole-step estimate vs measured peak, fp16 included; notebook 05's tricks",
            section_step_memory, needs=("transformers", "peft"), min_s=40, cap_s=110),
    Section(6, "qlora", "QLoRA on the offline stand-in, float16 compute included", section_qlora,
            needs=("transformers", "peft", "accelerate", "bitsandbytes"), min_s=20, cap_s=40),
    Section(7, "ddp", "gloo DDP after CUDA is initialised (notebook 03)", section_ddp, min_s=15, cap_s=30),
    Section(8, "trainer", "Memory-efficient TrainingArguments with the Trainer, fp16 included (notebook 05)",
            section_trainer, needs=("transformers", "accelerate"), min_s=15, cap_s=32),
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
                        "cases": section_cases(s.key, native, found["bitsandbytes"] is None)})
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
# Output
# --------------------------------------------------------------------------------------------
def format_cell(value: Any) -> str:
    """A table cell: floats with sensible digits, None as n/a, no pipes or newlines."""
    if value is None:
        text = "n/a"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, float):
        if not math.isfinite(value):
            text = str(value)
        elif value == 0:
            text = "0"
        elif abs(value) >= 100:
            text = f"{value:,.0f}"
        elif abs(value) >= 1:
            text = f"{value:.2f}"
        elif abs(value) >= 0.01:
            text = f"{value:.3f}"
        else:
            text = f"{value:.2e}"
    elif isinstance(value, int):
        text = f"{value:,}" if abs(value) >= 10_000 else str(value)
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table's lines: header, rule, one line per row."""
    lines = ["| " + " | ".join(format_cell(c) for c in columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(format_cell(c) for c in row) + " |" for row in rows]
    return lines


def render_markdown(results: dict[str, Any]) -> str:
    """The summary: overall result and summary line, one line per section, what was not checked, what --strict
    found, then each section's checks, tables and notes."""
    records = results.get("sections", [])
    machine = results.get("machine", {})
    summary = summarize(results)
    lines = ["# GPU check of the course's CUDA paths", ""]
    if machine:
        lines.append(f"GPU: {machine.get('gpu', 'n/a')} (compute capability {machine.get('capability', 'n/a')}, "
                     f"{format_cell(machine.get('memory_gb'))} GB); torch {machine.get('torch', 'n/a')}, "
                     f"CUDA {machine.get('cuda', 'n/a')}; {results.get('started_utc', '')}")
        lines.append("")
    counts = {s: sum(r["status"] == s for r in records) for s in ("passed", "failed", "skipped", "not checked")}
    lines.append(f"Result: **{summary['word']}** ({counts['passed']} passed, {counts['failed']} failed, "
                 f"{counts['skipped']} skipped, {counts['not checked']} not checked) in "
                 f"{format_cell(results.get('elapsed_s'))} s of a {format_cell(results.get('budget_s'))} s budget; "
                 f"exit status {summary['exit_status']}{' (--strict)' if summary['strict'] else ''}.")
    lines += ["", f"`{summary['line']}`"]
    if results.get("stopped_by_watchdog"):
        lines += ["", "**The run was stopped by the watchdog when the time budget ran out.**"]
    if results.get("ended_children"):
        lines += ["", f"Child processes ended with the run: {', '.join(map(str, results['ended_children']))}."]
    lines += ["", *markdown_table(["#", "section", "status", "seconds", "reason"],
                                  [[r["number"], r["key"], r["status"], r["seconds"], r.get("reason") or ""]
                                   for r in records])]
    if summary["not_checked"]:
        lines += ["", "**Not checked (a missing optional library; not a failure, not a pass):**", ""]
        lines += [f"- {line}" for line in summary["not_checked"]]
    if summary["strict_problems"]:
        title = "Fails --strict" if summary["strict"] else "Would fail --strict"
        lines += ["", f"**{title}:**", ""] + [f"- {p}" for p in summary["strict_problems"]]
    for r in records:
        lines += ["", f"## {r['number']}. {r['title']}: {r['status']}"]
        if r.get("reason"):
            lines += ["", f"{'Reason' if r['status'] != 'passed' else 'Note'}: {r['reason']}"]
        if r.get("error"):
            err = r["error"]
            lines += ["", f"Error: `{err['type']}: {err['message'].splitlines()[0] if err['message'] else ''}`", "",
                      "```", err["traceback"], "```"]
        if r.get("checks"):
            lines += ["", *markdown_table(["check", "ok", "detail"],
                                          [[c["check"], c["ok"], c.get("detail", "")] for c in r["checks"]])]
        for table in r.get("tables", []):
            lines += ["", f"**{table['title']}**", "", *markdown_table(table["columns"], table["rows"])]
        for block in r.get("texts", []):
            lines += ["", f"**{block['title']}**", "", "```", block["text"], "```"]
        for note in r.get("notes", []):
            lines += ["", f"- {note}"]
    return "\n".join(lines) + "\n"


def write_outputs(results: dict[str, Any], out_dir: Path) -> tuple[Path, Path, str]:
    """Write gpu_check.json and gpu_check.md into ``out_dir``; return both paths and the markdown."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "gpu_check.json", out_dir / "gpu_check.md"
    results["summary"] = summarize(results)
    json_path.write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    markdown = render_markdown(results)
    md_path.write_text(markdown, encoding="utf-8")
    return json_path, md_path, markdown


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


def setup_environment() -> None:
    """Offline and quiet, for this process and its children; course_utils importable in child processes."""
    os.environ.update(OFFLINE_ENV)
    path = os.environ.get("PYTHONPATH", "")
    if str(REPO_ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")


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
    setup_environment()
    clock = Clock(float(args.budget_s))
    out_dir = Path(args.out).resolve()
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
