"""Section 5: the whole-step estimate against the allocator's measured peak, and notebook 05's tricks.

Part of ``scripts/gpu_check.py`` (its module doc describes the whole check).
"""
from __future__ import annotations

import dataclasses
import math
import threading
import time
from typing import Any, Callable, Sequence

from gpu_check_core import (
    ESTIMATE_LIMIT_PCT,
    MEASURED_STEPS,
    STANDIN_CONFIG,
    STEP_SEQ,
    Context,
    Outcome,
    describe_error,
    error_pct,
    free_memory,
    gb,
    requirement_problem,
)
from gpu_check_plan import case_kwargs, step_cases, trick_plan

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
