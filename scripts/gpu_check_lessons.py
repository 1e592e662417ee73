"""Sections 1-4: the environment and the hardware decisions, matmul speed, the mixed-precision loop (notebook 02) and
the micro-batch sweep (notebook 03).

Part of ``scripts/gpu_check.py`` (its module doc describes the whole check).
"""
from __future__ import annotations

import math
from typing import Any

from gpu_check_core import (
    MATMUL_MIN_RUN_S,
    MATMUL_SIZES,
    Context,
    Outcome,
    _call,
    as_plain,
    matmul_stats,
    package_versions,
    peak_tflops,
    percent_of_peak,
)
from gpu_check_plan import plan_matmul


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
