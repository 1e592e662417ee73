"""Sections 1 and 2: the environment and the hardware decisions every notebook's setup cell prints, and matmul
speed (4096² and 8192² in float32, float16 and bfloat16, timed with ``blocked_autorange``, against the datasheet)."""

from __future__ import annotations

import dataclasses
import math
import platform
import statistics
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Sequence

from ..plan import plan_matmul
from ..runner import Context, Outcome
from ..settings import MATMUL_MIN_RUN_S, MATMUL_SIZES


# --------------------------------------------------------------------------------------------
# Matmul arithmetic (unit-tested without a GPU)
# --------------------------------------------------------------------------------------------
def tflops(n: int, seconds: float) -> float:
    """Achieved TFLOP/s of one n x n by n x n matmul that took ``seconds``: 2 n^3 / seconds / 1e12."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return 2 * n**3 / seconds / 1e12


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


def matmul_stats(size: int, times: Sequence[float]) -> dict[str, Any]:
    """Median, quartiles, min and max (ms) of per-matmul ``times`` (s), and TFLOP/s at the median and the best."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive integer, got {size!r}")
    values = [float(t) for t in times]
    if not values or any(not math.isfinite(t) or t <= 0 for t in values):
        raise ValueError(f"times must be positive seconds, at least one, got {list(times)!r}")
    median = statistics.median(values)
    q1, q3 = statistics.quantiles(values, n=4, method="inclusive")[::2] if len(values) > 1 else (median, median)
    return {
        "size": size,
        "runs": len(values),
        "median_ms": median * 1e3,
        "q1_ms": q1 * 1e3,
        "q3_ms": q3 * 1e3,
        "iqr_ms": (q3 - q1) * 1e3,
        "min_ms": min(values) * 1e3,
        "max_ms": max(values) * 1e3,
        "tflops": tflops(size, median),
        "best_tflops": tflops(size, min(values)),
    }


def package_versions(torch: Any) -> dict[str, str]:
    """Versions of Python, torch (and its CUDA) and the optional packages, read from their metadata."""
    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch.version.cuda": str(torch.version.cuda),
    }
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
    sheet = hardware.datasheet_for(name)
    native = hardware.bf16_native(ctx.device)
    dtype = hardware.autocast_dtype(ctx.device)
    scaling = hardware.needs_loss_scaling(dtype)
    mem_gb = hardware.gpu_memory_gb(ctx.device)
    gpu = {
        "name": name,
        "compute_capability": f"{cap[0]}.{cap[1]}",
        "total_memory_gb": props.total_memory / 1e9,
        "multiprocessors": getattr(props, "multi_processor_count", None),
        "torch.cuda.is_bf16_supported() (includes emulation)": bool(torch.cuda.is_bf16_supported()),
        "hardware.bf16_native()": native,
        "hardware.autocast_dtype()": str(dtype),
        "hardware.needs_loss_scaling(autocast dtype)": scaling,
        "hardware.gpu_memory_gb()": mem_gb,
        "hardware.datasheet_for(name)": as_plain(sheet),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "TF32 matmul allowed": bool(torch.backends.cuda.matmul.allow_tf32),
    }
    out.data["gpu"] = gpu
    out.table("GPU and the course's decisions", ["property", "value"], list(gpu.items()))
    out.text("hardware.setup_report() (what every notebook's setup cell prints)", hardware.setup_report())
    for line in hardware.version_notes():
        out.note(f"hardware.version_notes(): {line}")

    out.check(
        "bf16_native follows the compute capability (>= 8.0)",
        native == (cap >= (8, 0)),
        f"capability {cap[0]}.{cap[1]}, bf16_native={native}",
    )
    want = torch.bfloat16 if cap >= (8, 0) else torch.float16
    out.check("autocast_dtype is bfloat16 on Ampere+, float16 before", dtype == want, f"got {dtype}, want {want}")
    out.check("needs_loss_scaling is True exactly for float16", scaling == (dtype == torch.float16), f"got {scaling}")
    if mem_gb is not None:
        close = abs(mem_gb - props.total_memory / 1e9) < 0.01
        out.check("gpu_memory_gb matches get_device_properties", close, f"{mem_gb:.2f} GB")
    summary = hardware.hardware_summary()
    out.check("the hardware line names this GPU", name in summary, summary)
    if sheet is None:
        out.note(f"{name!r} is not in hardware.DATASHEETS: no % of peak in the matmul section.")


# --------------------------------------------------------------------------------------------
# 2. Matmul speed
# --------------------------------------------------------------------------------------------
def square_pair(torch: Any, size: int, dtype: str, device: str) -> tuple[Any, Any]:
    """Two random ``size x size`` matrices of ``dtype`` on ``device`` (seeded)."""
    gen = torch.Generator(device=device).manual_seed(0)
    dt = getattr(torch, dtype)
    return (
        torch.randn(size, size, generator=gen, device=device, dtype=dt),
        torch.randn(size, size, generator=gen, device=device, dtype=dt),
    )


def time_square_matmul(
    torch: Any, size: int, dtype: str, device: str, min_run_time: float = MATMUL_MIN_RUN_S
) -> dict[str, Any]:
    """``a @ b`` timed with ``Timer(...).blocked_autorange(min_run_time)`` after 3 untimed runs: matmul_stats."""
    from torch.utils import benchmark

    if not isinstance(min_run_time, (int, float)) or isinstance(min_run_time, bool) or min_run_time <= 0:
        raise ValueError(f"min_run_time must be a positive number of seconds, got {min_run_time!r}")
    a, b = square_pair(torch, size, dtype, device)
    timer = benchmark.Timer(stmt="a @ b", globals={"a": a, "b": b}, label=f"{size}x{size} matmul", description=dtype)
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
    out.data.update(
        sizes=list(MATMUL_SIZES),
        gpu=name,
        datasheet=as_plain(sheet),
        min_run_time_s=MATMUL_MIN_RUN_S,
        allow_tf32=bool(torch.backends.cuda.matmul.allow_tf32),
        float32_matmul_precision=torch.get_float32_matmul_precision(),
    )
    rows, timings = [], []
    for case in plan_matmul(native):
        size, dtype = case["size"], case["dtype"]
        if ctx.left() < 5:
            out.skip_part(f"{size}x{size} {dtype} not timed: section time used up", "time")
            continue
        stats = time_square_matmul(torch, size, dtype, ctx.device)
        peak = peak_tflops(dtype, sheet, native)
        pct = percent_of_peak(stats["tflops"], peak)
        course = precision.fraction_of_peak(
            precision.MatmulTiming(size, dtype, ctx.device, stats["median_ms"], stats["tflops"]), sheet
        )
        timings.append(
            {
                **stats,
                "dtype": dtype,
                "emulated": case["emulated"],
                "peak_tflops": peak,
                "percent_of_peak": pct,
                "course_fraction_of_peak": course,
            }
        )
        note = (
            f"emulated: compute capability {cap[0]}.{cap[1]} has no bfloat16 tensor cores, no % of peak"
            if case["emulated"]
            else ""
        )
        rows.append(
            [
                size,
                dtype,
                stats["median_ms"],
                stats["iqr_ms"],
                f"{stats['min_ms']:.3f}-{stats['max_ms']:.3f}",
                stats["runs"],
                stats["tflops"],
                stats["best_tflops"],
                peak,
                pct,
                note,
            ]
        )
        out.check(
            f"{size} {dtype}: a positive, finite TFLOP/s",
            math.isfinite(stats["tflops"]) and stats["tflops"] > 0,
            f"{stats['tflops']:.2f}",
        )
        same = (pct is None and course is None) or (
            pct is not None and course is not None and abs(pct - 100 * course) < 1e-6 * max(pct, 1)
        )
        out.check(
            f"{size} {dtype}: precision.fraction_of_peak agrees with 2n^3/t over the datasheet",
            same,
            f"course {course}, here {pct}",
        )
    out.data["timings"] = timings
    out.table(
        f"Square matmuls, torch.utils.benchmark blocked_autorange(min_run_time={MATMUL_MIN_RUN_S:g}) after 3 "
        "warm-up runs; TFLOP/s at the median",
        [
            "size",
            "dtype",
            "median ms",
            "IQR ms",
            "min-max ms",
            "measurements",
            "TFLOP/s",
            "best TFLOP/s",
            "datasheet TFLOP/s",
            "% of peak",
            "note",
        ],
        rows,
    )
    for size in MATMUL_SIZES:
        ms = {t["dtype"]: t["median_ms"] for t in timings if t["size"] == size}
        if "float32" in ms and "float16" in ms:
            speedup = ms["float32"] / ms["float16"]
            out.data[f"float16_speedup_{size}"] = speedup
            out.check(f"{size}: float16 is faster than float32 (tensor cores)", speedup > 1.0, f"{speedup:.1f}x")
    if not native:
        out.skip_part(
            f"bfloat16 not compared with a peak, and not timed at {MATMUL_SIZES[-1]}: it is emulated on "
            f"compute capability {cap[0]}.{cap[1]} (hardware.bf16_native() is False)",
            "n/a",
        )
    lesson_matmul(ctx, out, precision)
    if any(t["dtype"] == "float32" and (t["percent_of_peak"] or 0) > 100 for t in timings):
        out.note(
            "float32 above 100 % of the float32 datasheet peak: TF32 tensor cores are probably in use "
            f"(allow_tf32={torch.backends.cuda.matmul.allow_tf32}, precision "
            f"{torch.get_float32_matmul_precision()!r})."
        )
    if sheet is None:
        out.note(f"{name!r} is not in hardware.DATASHEETS: % of peak is n/a.")


def lesson_matmul(ctx: Context, out: Outcome, precision: Any) -> None:
    """The lessons' own helper, precision.time_matmul, once on CUDA (4096², float16)."""
    if ctx.left() < 3:
        out.skip_part("precision.time_matmul not run: section time used up", "time")
        return
    t = precision.time_matmul(MATMUL_SIZES[0], "float16", ctx.device, min_run_time=MATMUL_MIN_RUN_S)
    out.data["lesson_time_matmul"] = {
        "size": t.size,
        "dtype": t.dtype,
        "device": t.device,
        "ms": t.ms,
        "tflops": t.tflops,
    }
    out.check(
        "precision.time_matmul on CUDA: a positive, finite TFLOP/s on the GPU",
        math.isfinite(t.tflops) and t.tflops > 0 and str(t.device).startswith("cuda"),
        f"{t.tflops:.2f} TFLOP/s on {t.device}",
    )
