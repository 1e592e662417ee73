"""Check the course's GPU paths on a real NVIDIA GPU, in one command, offline, in at most 8 minutes.

No development machine of this course has a GPU, so every CUDA branch of ``course_utils`` is proven here,
on whatever NVIDIA GPU is lent (a Colab T4, an L4, an A100, an H100...). Run from the repository root::

    python scripts/gpu_check.py                      # all sections, results in ./gpu_check_out/
    python scripts/gpu_check.py --out /tmp/check --sections matmul,qlora --budget-s 300

Sections, in order (``--sections`` takes their names or numbers):

1. ``environment`` - versions, GPU name, compute capability, memory; ``hardware.setup_report()`` and the
   dtype decisions (``autocast_dtype``, ``bf16_native``, ``needs_loss_scaling``).
2. ``matmul`` - 4096x4096 matmuls in float32 / float16 / bfloat16 (``precision.time_matmul``, which uses
   ``torch.utils.benchmark``), TFLOP/s and % of the datasheet peak (``hardware.datasheet_for``).
3. ``mixed_precision`` - notebook 02's loop (``precision.train_mixed_precision``) with float16 + GradScaler
   and a forced overflow (the scaler must skip that step and lower its scale), and with bfloat16 (Ampere+).
4. ``microbatch_sweep`` - notebook 03's micro-batch sweep (``accumulation.sweep_micro_batches``) on CUDA.
5. ``step_memory`` - the whole-step estimate (``step_memory.estimate_step``) against the allocator peak of a
   real step (``measure.measure_training_step``), LoRA and full x batch 1/4/8, and notebook 05's tricks
   (``tricks.measure_tricks``: gradient checkpointing, 8-bit AdamW, torch.compile).
6. ``qlora`` - the offline stand-in loaded in 4 bits, LoRA added, 8 AdamW steps, 10 generated tokens.
7. ``ddp`` - notebook 03's 2-process gloo DDP check, started after CUDA is initialised.
8. ``trainer`` - notebook 05's memory-efficient ``TrainingArguments`` for 2 Trainer steps.

The script never contacts the Hugging Face Hub (it sets ``HF_HUB_OFFLINE=1``): the model is the course's
stand-in, the SmolLM2-135M architecture from ``data/configs`` with random weights. It puts the repository
root on ``sys.path`` itself, so ``course_utils`` need not be installed, and it does not assume this
project's pinned versions. A section whose optional package (transformers, peft, accelerate, bitsandbytes)
is missing says so and is skipped; every section runs inside try/except, so one failure is recorded (type,
message, end of the traceback) and the others still run. Each section is bounded in time; when the total
budget (``--budget-s``, default 480 s) is nearly spent, the remaining sections are skipped with the reason,
and a watchdog stops the run at the budget in any case.

Output: ``gpu_check.json`` and ``gpu_check.md`` (a table per section) in ``--out``; the markdown is also
printed. Exit status: 0 when every section passed or was skipped for a stated reason, 1 when any failed,
2 when there is no CUDA GPU (one line on stderr, nothing run).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import importlib
import importlib.util
import json
import math
import os
import shutil
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
DEFAULT_BUDGET_S = 480.0
#: Seconds kept back from the budget for writing the results (sections stop planning work past it).
RESERVE_S = 8.0
MATMUL_SIZE = 4096
STANDIN_CONFIG = "smollm2-135m"
PROMPT = "The capital of France is"
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
    partial: list[str] = field(default_factory=list)

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

    def skip_part(self, reason: str) -> None:
        """Record that part of the section was skipped, and why (the section can still pass)."""
        self.partial.append(reason)


@dataclass
class Clock:
    """The run's time budget: seconds used, seconds left (before the reserve kept for writing results)."""

    budget_s: float
    start: float = field(default_factory=time.monotonic)
    reserve_s: float = RESERVE_S

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
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
    """One section: its function, the optional packages it needs, the least time worth starting it with,
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
    """None when ``package`` imports; otherwise why the sections needing it are skipped."""
    try:
        if importlib.util.find_spec(package) is None:
            return f"{package} is not installed"
        if package == "bitsandbytes":
            from course_utils.hardware import import_bitsandbytes

            return None if import_bitsandbytes() is not None else "bitsandbytes is installed but does not import here"
        importlib.import_module(package)
    except Exception as err:  # noqa: BLE001 - a broken or incompatible install: say so and skip
        return f"{package} is installed but does not import ({type(err).__name__}: {str(err)[:200]})"
    return None


def new_record(section: Section) -> dict[str, Any]:
    """The result record of a section before it runs."""
    return {"number": section.number, "key": section.key, "title": section.title, "status": "pending",
            "reason": None, "seconds": 0.0, "error": None, "data": {}, "tables": [], "texts": [], "notes": [],
            "checks": [], "partial": []}


def run_section(section: Section, ctx: Context, record: dict[str, Any] | None = None,
                problem: Callable[[str], str | None] = requirement_problem) -> dict[str, Any]:
    """Run one section inside try/except and fill its record: passed, failed (with the error or the failed
    checks) or skipped (with the reason: time budget, a missing package, or the section's own)."""
    rec = new_record(section) if record is None else record
    left = ctx.clock.left()
    if left < section.min_s:
        rec.update(status="skipped", reason=(f"time budget nearly spent: {max(left, 0):.0f} s left of the "
                                             f"{ctx.clock.budget_s:.0f} s budget, this section needs about "
                                             f"{section.min_s:.0f} s"))
        return rec
    missing = [p for p in (problem(name) for name in section.needs) if p]
    if missing:
        rec.update(status="skipped", reason="; ".join(missing))
        return rec
    rec["status"] = "running"
    ctx.deadline = time.monotonic() + min(section.cap_s, left)
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
                rec["reason"] = "partly skipped: " + "; ".join(out.partial)
    finally:
        rec["seconds"] = round(time.monotonic() - t0, 2)
        rec.update(data=out.data, tables=out.tables, texts=out.texts, notes=out.notes, checks=out.checks,
                   partial=out.partial)
    return rec


def exit_status(records: Sequence[dict[str, Any]]) -> int:
    """0 when every section passed or was skipped for a stated reason, 1 when any failed (or never finished)."""
    ok = all(r["status"] == "passed" or (r["status"] == "skipped" and r.get("reason")) for r in records)
    return 0 if ok else 1


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
    if ctx.device.startswith("cuda"):
        ctx.torch.cuda.synchronize()
        ctx.torch.cuda.reset_peak_memory_stats()


def peak_allocated(ctx: Context) -> int | None:
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
    import dataclasses

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
def section_matmul(ctx: Context, out: Outcome) -> None:
    """4096x4096 matmuls in three dtypes with precision.time_matmul (torch.utils.benchmark), vs the datasheet."""
    torch = ctx.torch
    from course_utils import hardware, precision

    name = torch.cuda.get_device_name(0)
    sheet = hardware.datasheet_for(name)
    native = bool(hardware.bf16_native(ctx.device))
    cap = torch.cuda.get_device_capability(0)
    out.data.update(size=MATMUL_SIZE, gpu=name, datasheet=as_plain(sheet),
                    allow_tf32=bool(torch.backends.cuda.matmul.allow_tf32),
                    float32_matmul_precision=torch.get_float32_matmul_precision())
    rows, timings = [], {}
    for dtype in ("float32", "float16", "bfloat16"):
        if ctx.left() < 5:
            out.skip_part(f"{dtype} not timed: section time used up")
            continue
        emulated = dtype == "bfloat16" and not native
        precision.time_matmul(MATMUL_SIZE, dtype, ctx.device, repeats=10)  # warm-up: clocks, cuBLAS heuristics
        t = precision.time_matmul(MATMUL_SIZE, dtype, ctx.device, repeats=50)
        achieved = tflops(MATMUL_SIZE, t.ms / 1e3)
        peak = peak_tflops(dtype, sheet, native)
        pct = percent_of_peak(achieved, peak)
        course_fraction = precision.fraction_of_peak(t, sheet)
        timings[dtype] = {"ms": t.ms, "tflops": achieved, "peak_tflops": peak, "percent_of_peak": pct,
                          "emulated": emulated, "course_fraction_of_peak": course_fraction}
        label = (f"emulated: compute capability {cap[0]}.{cap[1]} has no bfloat16 tensor cores, no % of peak"
                 if emulated else "")
        rows.append([dtype, t.ms, achieved, peak, pct, label])
        out.check(f"{dtype}: a positive, finite TFLOP/s", math.isfinite(achieved) and achieved > 0, f"{achieved:.2f}")
        same = (pct is None and course_fraction is None) or (
            pct is not None and course_fraction is not None and abs(pct - 100 * course_fraction) < 1e-6 * max(pct, 1))
        out.check(f"{dtype}: precision.fraction_of_peak agrees with 2n^3/t over the datasheet", same,
                  f"course {course_fraction}, here {pct}")
    out.data["timings"] = timings
    out.table(f"{MATMUL_SIZE}x{MATMUL_SIZE} matmul (mean of 50 after warm-up)",
              ["dtype", "ms", "TFLOP/s", "datasheet TFLOP/s", "% of peak", "note"], rows)
    if "float32" in timings and "float16" in timings:
        speedup = timings["float32"]["ms"] / timings["float16"]["ms"]
        out.data["float16_speedup"] = speedup
        out.check("float16 is faster than float32 (tensor cores)", speedup > 1.0, f"{speedup:.1f}x")
    if not native:
        out.skip_part(f"bfloat16 not compared with a peak: it is emulated on compute capability {cap[0]}.{cap[1]} "
                      "(hardware.bf16_native() is False); timed for the record, labelled emulated")
    pct32 = timings.get("float32", {}).get("percent_of_peak")
    if pct32 is not None and pct32 > 100:
        out.note("float32 above 100 % of the float32 datasheet peak: TF32 tensor cores are probably in use "
                 f"(allow_tf32={torch.backends.cuda.matmul.allow_tf32}, precision "
                 f"{torch.get_float32_matmul_precision()!r}).")
    if sheet is None:
        out.note(f"{name!r} is not in hardware.DATASHEETS: % of peak is n/a.")


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
                      "(torch can emulate it; the lessons use float16 + loss scaling here)")
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


def cuda_estimate(sm: Any, kwargs: dict[str, Any], baseline_bytes: int) -> Any:
    """step_memory.estimate_step for the same arguments as a CUDA measurement, with its allocator baseline."""
    return sm.estimate_step(STANDIN_CONFIG, autocast=bool(kwargs.get("autocast")), device="cuda",
                            baseline_bytes=int(baseline_bytes), **{k: kwargs[k] for k in ESTIMATE_KEYS if k in kwargs})


def section_step_memory(ctx: Context, out: Outcome) -> None:
    """estimate_step vs measure_training_step (allocator peak) on CUDA, then tricks.measure_tricks."""
    torch = ctx.torch
    from course_utils import measure
    from course_utils import step_memory as sm

    rows, cases = [], []
    for method in ("lora", "full"):
        for batch in (1, 4, 8):
            if ctx.left() < 20:
                out.skip_part(f"{method} batch {batch} not measured: section time used up")
                rows.append([method, batch, None, None, None, None, None, "skipped: time"])
                continue
            free_memory(torch)
            try:
                m = measure.measure_training_step(STANDIN_CONFIG, method=method, batch=batch, seq=128,
                                                  device=ctx.device)
                est = cuda_estimate(sm, {"method": method, "batch": batch, "seq": 128}, m.baseline_bytes)
            except Exception as err:  # noqa: BLE001 - record this case, measure the others
                info = describe_error(err)
                out.data.setdefault("case_errors", []).append({"method": method, "batch": batch, **info})
                out.check(f"{method} batch {batch}: measured", False, f"{info['type']}: {info['message'][:300]}")
                rows.append([method, batch, None, None, None, None, None, f"failed: {info['type']}"])
                continue
            err = error_pct(est.peak_bytes, m.peak_bytes)
            cases.append({"method": method, "batch": batch, "seq": 128, "estimate_gb": est.peak_gb,
                          "measured_gb": m.peak_gb, "error_pct": err, "estimate_moment": est.peak_moment,
                          "baseline_gb": gb(m.baseline_bytes), "reserved_gb": gb(m.reserved_bytes),
                          "step_seconds": m.step_seconds, "what": m.what,
                          "saved_activations_gb": gb(m.saved_activations_bytes)})
            rows.append([method, batch, est.peak_gb, m.peak_gb, err, gb(m.reserved_bytes), m.step_seconds,
                         est.peak_moment])
            out.check(f"{method} batch {batch}: measured on the CUDA allocator", m.device.startswith("cuda")
                      and m.peak_bytes > 0, m.what)
    out.data["estimate_vs_measured"] = cases
    out.table("Whole-step estimate vs measured CUDA allocator peak (SmolLM2-135M architecture, seq 128, in-process "
              "as the notebooks run it on a GPU; the estimate gets the measured allocator baseline)",
              ["method", "batch", "estimate GB", "measured GB", "error %", "reserved GB", "step s",
               "estimated peak moment"], rows)
    if cases:
        worst = max(cases, key=lambda c: abs(c["error_pct"]))
        out.note(f"largest estimate error: {worst['error_pct']:+.1f} % ({worst['method']} batch {worst['batch']}).")
    measure_tricks_part(ctx, out, sm)


def accepts(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` takes a keyword argument ``name`` (course_utils is being changed: ask, don't assume)."""
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def measure_tricks_part(ctx: Context, out: Outcome, sm: Any) -> None:
    """tricks.measure_tricks on CUDA: baseline, checkpointing, 8-bit AdamW in-process (as the notebook runs them
    on a GPU); torch.compile in a child process bounded by the time left (compiling can take minutes, and
    in-process it could not be stopped)."""
    torch = ctx.torch
    from course_utils import tricks

    base: dict[str, Any] = {"method": "full", "batch": 4, "seq": 128}
    on_device: dict[str, Any] = {"device": ctx.device} if accepts(tricks.measure_tricks, "device") else {}
    if not on_device:
        base["device"] = ctx.device  # older signature: the device travels with the step's arguments
    out.data["tricks_device_argument"] = bool(on_device)
    keys = ["baseline", "checkpointing"]
    bnb_problem = requirement_problem("bitsandbytes")
    if bnb_problem is None:
        keys.append("adamw8bit")
    else:
        out.skip_part(f"8-bit AdamW not measured: {bnb_problem}")
    if ctx.left() < 30:
        out.skip_part("tricks not measured: section time used up")
        return
    free_memory(torch)
    results = tricks.measure_tricks(STANDIN_CONFIG, base, keys, timeout_s=max(1.0, min(600.0, ctx.left())),
                                    **on_device)
    mode = {k: "in-process" for k in keys}
    compile_limit = ctx.left() - 5
    if compile_limit >= 30:
        free_memory(torch)
        results += tricks.measure_tricks(STANDIN_CONFIG, {**base, "subprocess_": True}, ["compile"],
                                         compile_timeout_s=min(240.0, compile_limit), **on_device)
        mode["compile"] = "child process"
    else:
        out.skip_part(f"torch.compile not measured: {max(compile_limit, 0):.0f} s left in the section")
    baseline = next((r for r in results if r.key == "baseline"), None)
    rows, data = [], []
    for r in results:
        m = r.measurement
        est = getattr(r, "estimate_bytes", None)
        err = error_pct(est, r.peak_bytes) if (est and r.peak_bytes and r.key != "compile") else None
        verdict = tricks.verdict(r, baseline) if baseline is not None else ""
        base_gb = gb(m.baseline_bytes) if m is not None else None
        rows.append([r.label, r.peak_gb, r.step_seconds, r.first_step_seconds,
                     gb(est) if r.key != "compile" else None, err, base_gb, mode.get(r.key), verdict])
        data.append({"key": r.key, "peak_gb": r.peak_gb, "step_seconds": r.step_seconds,
                     "first_step_seconds": r.first_step_seconds, "compile_seconds": r.compile_seconds,
                     "optimizer_bytes": r.optimizer_bytes, "trained_params": r.trained_params,
                     "estimate_gb": gb(est), "estimate_device": getattr(r, "estimate_device", None),
                     "measured_device": getattr(r, "device", None) or (m.device if m is not None else None),
                     "error_pct": err, "allocator_baseline_gb": base_gb, "skipped": r.skipped, "verdict": verdict,
                     "mode": mode.get(r.key)})
        failed_step = bool(r.skipped) and "the step failed" in r.skipped
        out.check(f"trick {r.key}: measured (or skipped for time)", not failed_step, r.skipped or "measured")
        if r.skipped and not failed_step:
            out.skip_part(f"{r.key}: {r.skipped}")
        if m is not None:
            out.check(f"trick {r.key}: measured on the CUDA allocator", str(m.device).startswith("cuda"), m.what)
    out.data["tricks"] = data
    out.table("Notebook 05's tricks on CUDA (full fine-tuning, batch 4, seq 128; estimate as tricks.measure_tricks "
              "makes it; torch.compile is not modelled by the estimate)",
              ["trick", "peak GB", "step s", "first step s", "estimate GB", "error %", "allocator baseline GB",
               "run", "verdict"], rows)
    eight = next((r for r in results if r.key == "adamw8bit" and r.optimizer_bytes), None)
    if eight is not None and baseline is not None and baseline.optimizer_bytes:
        ratio = eight.optimizer_bytes / baseline.optimizer_bytes
        out.check("8-bit AdamW keeps under half the optimizer bytes of AdamW", ratio < 0.5, f"ratio {ratio:.2f}")


# --------------------------------------------------------------------------------------------
# 6. QLoRA on the stand-in
# --------------------------------------------------------------------------------------------
def section_qlora(ctx: Context, out: Outcome) -> None:
    """The stand-in in 4 bits + LoRA: 8 AdamW steps on the course's training texts, then 10 generated tokens."""
    torch = ctx.torch
    from course_utils import lora, models, standin

    choice = standin.ModelChoice(str(standin.ensure_standin()), True, "gpu_check always uses the offline stand-in")
    free_memory(torch)
    reset_peak(ctx)
    t0 = time.monotonic()
    model = models.load_model(choice, bits=4, device=ctx.device)
    load_s = time.monotonic() - t0
    base_footprint = model.get_memory_footprint()
    tokenizer = models.load_tokenizer(choice)
    four_bit = sum(type(m).__name__ == "Linear4bit" for m in model.modules())
    out.data["linear4bit_layers"] = four_bit
    out.check("loaded in 4 bits", bool(getattr(model, "is_loaded_in_4bit", False)) and four_bit > 0,
              f"is_loaded_in_4bit={getattr(model, 'is_loaded_in_4bit', None)}, {four_bit} Linear4bit layers")
    out.check("the weights are on the GPU", next(model.parameters()).device.type == "cuda",
              str(next(model.parameters()).device))
    model = lora.add_lora(model)
    trainable, total = lora.trainable_counts(model)
    batches = models.training_batches(tokenizer, models.training_texts(), batch_size=4, max_length=32,
                                      device=ctx.device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    model.train()
    losses: list[float] = []
    t0 = time.monotonic()
    for step in range(8):
        if ctx.left() < 5:
            out.skip_part(f"training stopped after {step} steps: section time used up")
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
        out.skip_part("generate_text not run: section time used up")
    footprint = model.get_memory_footprint()
    peak = peak_allocated(ctx)
    out.data.update(model=choice.label, trainable=trainable, total_params=total, losses=losses, text=text,
                    base_footprint_gb=base_footprint / 1e9, footprint_gb=footprint / 1e9, peak_gb=gb(peak),
                    load_seconds=load_s, train_seconds=train_s, generate_seconds=gen_s)
    out.table(f"QLoRA on {choice.label}", ["figure", "value"], [
        ["4-bit load, s", load_s], ["footprint after load, GB", base_footprint / 1e9],
        ["footprint with LoRA, GB", footprint / 1e9], ["trainable / all parameters", f"{trainable:,} / {total:,}"],
        ["losses (8 AdamW steps)", ", ".join(f"{v:.3f}" for v in losses)], ["training, s", train_s],
        ["generate 10 tokens, s", gen_s], ["peak allocated, GB", gb(peak)]])
    out.text("generate_text (random weights: noise is expected)", text)
    out.check("losses finite", bool(losses) and all(math.isfinite(v) for v in losses), str(losses))
    if gen_s is not None:
        out.check("generated text is longer than the prompt", len(text) > len(PROMPT), repr(text))


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
def section_trainer(ctx: Context, out: Outcome) -> None:
    """tricks.memory_efficient_training_arguments(max_steps=2) + tricks.run_trainer_steps on the stand-in."""
    torch = ctx.torch
    from course_utils import hardware, tricks

    folder = tempfile.mkdtemp(prefix="gpu-check-trainer-")
    try:
        where = ({"device": ctx.device} if accepts(tricks.memory_efficient_training_arguments, "device")
                 else {"cuda": ctx.device.startswith("cuda")})
        args, changes = tricks.memory_efficient_training_arguments(folder, max_steps=2, **where)
        if getattr(args, "report_to", None) not in ([], None, "none", ["none"]):
            out.note(f"report_to was {args.report_to!r}: set to [] here so that no tracker is contacted offline.")
            with contextlib.suppress(Exception):
                args.report_to = []
        checkpointing = tricks.checkpointing_enabled(args)
        optim = getattr(args.optim, "value", args.optim)
        settings = {"bf16": args.bf16, "fp16": args.fp16, "optim": optim, "checkpointing": checkpointing,
                    "per_device_train_batch_size": args.per_device_train_batch_size,
                    "gradient_accumulation_steps": args.gradient_accumulation_steps, "max_steps": args.max_steps}
        out.data.update(changes=changes, settings=settings)
        out.text("changes from the lesson's arguments", "\n".join(f"- {c}" for c in changes))
        if ctx.device.startswith("cuda"):
            native = bool(hardware.bf16_native(ctx.device))
            want = {"bf16": True, "fp16": False} if native else {"bf16": False, "fp16": True}
            out.check("mixed precision follows the compute capability (bf16 on Ampere+, fp16 + scaling before)",
                      bool(args.bf16) == want["bf16"] and bool(args.fp16) == want["fp16"],
                      f"bf16={args.bf16}, fp16={args.fp16}, bf16_native={native}")
        free_memory(torch)
        run = tricks.run_trainer_steps(STANDIN_CONFIG, args, batch_examples=32, seq=64)
        peak = run["peak"]
        out.data.update(steps=run["steps"], losses=run["losses"], seconds=run["seconds"], peak_gb=peak.gb,
                        peak_what=peak.what)
        out.table("Trainer, SmolLM2-135M architecture (random weights), 64-token random sequences", ["figure", "value"],
                  [*([k, v] for k, v in settings.items()), ["optimizer steps done", run["steps"]],
                   ["losses", ", ".join(map(str, run["losses"]))], ["seconds", run["seconds"]],
                   ["peak GB", peak.gb], ["peak measured as", peak.what]])
        out.check("2 optimizer steps done", run["steps"] == 2, str(run["steps"]))
        out.check("losses logged and finite", bool(run["losses"]) and all(math.isfinite(v) for v in run["losses"]),
                  str(run["losses"]))
        out.check("peak read from the CUDA allocator", str(peak.what).startswith("CUDA"), str(peak.what))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


SECTIONS: tuple[Section, ...] = (
    Section(1, "environment", "Environment and the hardware decisions", section_environment, min_s=3, cap_s=20),
    Section(2, "matmul", "Matmul speed: float32, float16, bfloat16", section_matmul, min_s=10, cap_s=30),
    Section(3, "mixed_precision", "Mixed-precision training loop (notebook 02)", section_mixed_precision,
            min_s=10, cap_s=40),
    Section(4, "microbatch_sweep", "Micro-batch sweep on CUDA (notebook 03)", section_microbatch_sweep,
            min_s=8, cap_s=30),
    Section(5, "step_memory", "Whole-step estimate vs measured peak; notebook 05's tricks", section_step_memory,
            needs=("transformers", "peft"), min_s=40, cap_s=200),
    Section(6, "qlora", "QLoRA on the offline stand-in", section_qlora,
            needs=("transformers", "peft", "accelerate", "bitsandbytes"), min_s=25, cap_s=60),
    Section(7, "ddp", "gloo DDP after CUDA is initialised (notebook 03)", section_ddp, min_s=15, cap_s=45),
    Section(8, "trainer", "Memory-efficient TrainingArguments with the Trainer (notebook 05)", section_trainer,
            needs=("transformers", "accelerate"), min_s=20, cap_s=50),
)


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
    lines = ["| " + " | ".join(format_cell(c) for c in columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(format_cell(c) for c in row) + " |" for row in rows]
    return lines


def render_markdown(results: dict[str, Any]) -> str:
    """The summary: overall result, one line per section, then each section's checks, tables and notes."""
    records = results.get("sections", [])
    machine = results.get("machine", {})
    counts = {s: sum(r["status"] == s for r in records) for s in ("passed", "failed", "skipped")}
    status = results.get("exit_status", exit_status(records))
    lines = ["# GPU check of the course's CUDA paths", ""]
    if machine:
        lines.append(f"GPU: {machine.get('gpu', 'n/a')} (compute capability {machine.get('capability', 'n/a')}, "
                     f"{format_cell(machine.get('memory_gb'))} GB); torch {machine.get('torch', 'n/a')}, "
                     f"CUDA {machine.get('cuda', 'n/a')}; {results.get('started_utc', '')}")
        lines.append("")
    lines.append(f"Result: **{'PASSED' if status == 0 else 'FAILED'}** ({counts['passed']} passed, "
                 f"{counts['failed']} failed, {counts['skipped']} skipped) in "
                 f"{format_cell(results.get('elapsed_s'))} s of a {format_cell(results.get('budget_s'))} s budget; "
                 f"exit status {status}.")
    if results.get("stopped_by_watchdog"):
        lines.append("")
        lines.append("**The run was stopped by the watchdog when the time budget ran out.**")
    lines += ["", *markdown_table(["#", "section", "status", "seconds", "reason"],
                                  [[r["number"], r["key"], r["status"], r["seconds"], r.get("reason") or ""]
                                   for r in records])]
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
    parser = argparse.ArgumentParser(prog="python scripts/gpu_check.py",
                                     description="Check the course's GPU paths on a real NVIDIA GPU, offline.")
    parser.add_argument("--out", default="gpu_check_out", help="folder for gpu_check.json and gpu_check.md "
                        "(default: gpu_check_out/ in the current directory)")
    parser.add_argument("--sections", default=None, help="comma list of sections to run, by name or number "
                        "(default: all): " + ", ".join(f"{s.number}={s.key}" for s in SECTIONS))
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help="total time budget in seconds (default 480 = 8 minutes)")
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
    cap = torch.cuda.get_device_capability(0)
    return {"gpu": torch.cuda.get_device_name(0), "capability": f"{cap[0]}.{cap[1]}",
            "memory_gb": torch.cuda.get_device_properties(0).total_memory / 1e9, "torch": torch.__version__,
            "cuda": torch.version.cuda}


class Watchdog:
    """Stops the whole run when the budget is spent, after writing what was found so far (exit status 1)."""

    def __init__(self, results: dict[str, Any], out_dir: Path, clock: Clock) -> None:
        self.results, self.out_dir, self.clock = results, out_dir, clock
        self.lock = threading.Lock()
        self.done = False
        self.timer = threading.Timer(max(1.0, clock.budget_s - clock.elapsed()), self.fire)
        self.timer.daemon = True

    def start(self) -> None:
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
            self.results.update(stopped_by_watchdog=True, elapsed_s=round(self.clock.elapsed(), 1))
            self.results["exit_status"] = 1
            try:
                _, md_path, markdown = write_outputs(self.results, self.out_dir)
                sys.stdout.write(markdown + f"\nResults: {md_path} and {md_path.with_suffix('.json')}\n")
                sys.stdout.flush()
            finally:
                os._exit(1)


def run_all(sections: Sequence[Section], ctx: Context, results: dict[str, Any]) -> None:
    """Run the sections in order, each recorded in ``results['sections']`` before it starts."""
    records = [new_record(s) for s in sections]
    results["sections"] = records
    for section, record in zip(sections, records):
        try:
            run_section(section, ctx, record)
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
    args = parse_args(argv)
    setup_environment()
    torch, why = cuda_torch()
    if torch is None:
        print(NO_CUDA_MESSAGE.format(why=why), file=sys.stderr)
        return 2
    clock = Clock(float(args.budget_s))
    out_dir = Path(args.out).resolve()
    results: dict[str, Any] = {
        "script": "scripts/gpu_check.py",
        "started_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "budget_s": clock.budget_s, "machine": machine_summary(torch), "sections": [],
        "requested_sections": [s.key for s in args.section_list]}
    watchdog = Watchdog(results, out_dir, clock)
    watchdog.start()
    run_all(args.section_list, Context(torch=torch, clock=clock, out_dir=out_dir), results)
    if not watchdog.finish():  # pragma: no cover - the watchdog is writing and exiting
        time.sleep(60)
    results["elapsed_s"] = round(clock.elapsed(), 1)
    results["exit_status"] = exit_status(results["sections"])
    json_path, md_path, markdown = write_outputs(results, out_dir)
    print(markdown)
    print(f"Results: {md_path} and {json_path}")
    return int(results["exit_status"])


if __name__ == "__main__":
    sys.exit(main())
