"""Section 5: the whole-step estimate against the allocator's measured peak, and notebook 05's tricks.

Full tuning and the tricks need torch and transformers only; a case that needs peft or bitsandbytes is "not
checked" without them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from ..gpu import free_memory, gb
from ..plan import LONG_SEQ, case_kwargs, missing_library, step_cases, trick_plan
from ..runner import Context, Outcome, describe_error, requirement_problem
from ..settings import ESTIMATE_LIMIT_PCT, MEASURED_STEPS, STANDIN_CONFIG, STEP_SEQ

#: The measured case's arguments that estimate_step takes too.
ESTIMATE_KEYS = ("method", "batch", "seq", "lora_rank", "targets", "checkpointing", "optimizer", "accumulation")
#: Least seconds left in the section to start one more measured case, the tricks, and torch.compile.
CASE_MIN_S = 6.0
TRICKS_MIN_S = 15.0
COMPILE_MIN_S = 30.0
COMPILE_MAX_S = 240.0
#: Words of a trick's ``skipped`` reason that mean it ran out of time (anything else is a failure).
TIME_WORDS = ("did not finish within", "budget", "timed out", "timeout")


def cuda_estimate(sm: Any, kwargs: dict[str, Any], baseline_bytes: int) -> Any:
    """step_memory.estimate_step for the same arguments as a CUDA measurement, with its allocator baseline."""
    return sm.estimate_step(
        STANDIN_CONFIG,
        autocast=bool(kwargs.get("autocast")),
        device="cuda",
        baseline_bytes=int(baseline_bytes),
        **{k: kwargs[k] for k in ESTIMATE_KEYS if k in kwargs},
    )


def check_measurement(out: Outcome, label: str, m: Any, case: dict[str, Any]) -> None:
    """The checks every measured case gets: CUDA allocator, the planned steps, fp16 autocast with GradScaler."""
    out.check(f"{label}: measured on the CUDA allocator", str(m.device).startswith("cuda") and m.peak_bytes > 0, m.what)
    want = case.get("steps", MEASURED_STEPS)
    out.check(f"{label}: {want} measured steps", m.steps == want, f"steps={m.steps}")
    if case.get("fp16"):
        scaling = (m.extra or {}).get("loss_scaling")
        out.check(
            f"{label}: float16 autocast with loss scaling (GradScaler on)",
            m.autocast == "float16" and scaling is True,
            f"autocast={m.autocast}, loss_scaling={scaling}",
        )


def attention_pair(m: Any, est: Any) -> tuple[str, str | None]:
    """(the SDPA backend(s) that ran, from the measurement's extra; the backend the estimate assumed)."""
    ran = str((m.extra or {}).get("attention", "unknown")) if m is not None else "n/a"
    assumed = getattr(getattr(est, "attention", None), "backend", None)
    return ran, assumed


def note_attention(out: Outcome, label: str, ran: str, assumed: str | None) -> None:
    """Keep a case whose estimate assumed another attention backend than the one that ran (--strict fails on it)."""
    if assumed is not None and ran not in ("unknown", "n/a") and ran != assumed:
        out.data.setdefault("attention_mismatches", []).append({"case": label, "ran": ran, "assumed": assumed})


def measure_step_cases(ctx: Context, out: Outcome, measure: Any, sm: Any, cases: Sequence[dict[str, Any]]) -> None:
    """measure_training_step for each planned case, in this process as the notebooks run it on a GPU, against
    estimate_step given the measured allocator baseline (and the attention backend this GPU gets)."""
    rows, records = [], []
    for case in cases:
        label, kwargs = case["label"], case_kwargs(case)
        if ctx.left() < CASE_MIN_S:
            out.skip_part(f"{label} not measured: section time used up", "time")
            rows.append([label, None, None, None, None, None, None, None, "skipped: time"])
            continue
        free_memory(ctx.torch)
        try:
            m = measure.measure_training_step(
                STANDIN_CONFIG, device=ctx.device, timeout_s=max(1.0, min(600.0, ctx.left())), **kwargs
            )
            est = cuda_estimate(sm, kwargs, m.baseline_bytes)
        except Exception as err:  # noqa: BLE001 - record this case, measure the others
            info = describe_error(err)
            out.data.setdefault("case_errors", []).append({"case": label, **info})
            out.check(f"{label}: measured", False, f"{info['type']}: {info['message'][:300]}")
            rows.append([label, None, None, None, None, None, None, None, f"failed: {info['type']}"])
            continue
        err = sm.error_percent(est.peak_bytes, m.peak_bytes)
        ran, assumed = attention_pair(m, est)
        note_attention(out, label, ran, assumed)
        records.append(
            {
                "case": label,
                "kwargs": kwargs,
                "estimate_bytes": est.peak_bytes,
                "estimate_gb": gb(est.peak_bytes),
                "estimate_moment": est.peak_moment,
                "error_pct": err,
                "attention_ran": ran,
                "estimate_attention": assumed,
                "measurement": m.to_dict(),
            }
        )
        out.data["estimate_errors"].append({"case": label, "error_pct": err, "source": "step_memory.estimate_step"})
        rows.append(
            [
                label,
                gb(est.peak_bytes),
                gb(m.peak_bytes),
                err,
                gb(m.reserved_bytes),
                m.step_seconds,
                ran,
                assumed,
                est.peak_moment,
            ]
        )
        check_measurement(out, label, m, case)
    out.data["estimate_vs_measured"] = records
    out.table(
        f"Whole-step estimate vs measured CUDA allocator peak (SmolLM2-135M architecture, seq {STEP_SEQ} but "
        f"the {LONG_SEQ}-token case, {MEASURED_STEPS} timed steps after a warm-up, in-process as the notebooks "
        "run it on a GPU; the estimate gets the measured allocator baseline and this GPU's attention backend)",
        [
            "case",
            "estimate GB",
            "measured GB",
            "error %",
            "reserved GB",
            "step s",
            "attention ran",
            "estimate assumes",
            "estimated peak moment",
        ],
        rows,
    )
    if records:
        worst = max(records, key=lambda c: abs(c["error_pct"]))
        out.note(
            f"largest estimate error: {worst['error_pct']:+.1f} % ({worst['case']}); --strict fails above "
            f"{ESTIMATE_LIMIT_PCT:g} %."
        )
    for miss in out.data.get("attention_mismatches", []):
        out.note(f"{miss['case']}: the estimate assumed {miss['assumed']} attention, {miss['ran']} ran.")


def measure_compile(ctx: Context, out: Outcome, tricks: Any, base: dict[str, Any]) -> list[Any]:
    """tricks.measure_tricks(['compile']) once the in-process cases are done (its compiler workers would compete for
    the CPU with the timed eager steps): a bounded child process, limited by the section's time left."""
    limit = min(COMPILE_MAX_S, ctx.left() - 5)
    if limit < COMPILE_MIN_S:
        out.skip_part(f"torch.compile not measured: {max(limit, 0):.0f} s left in the section", "time")
        return []
    free_memory(ctx.torch)
    try:
        return list(
            tricks.measure_tricks(STANDIN_CONFIG, base, ["compile"], compile_timeout_s=limit, device=ctx.device)
        )
    except Exception as err:  # noqa: BLE001 - a fault outside the measured step: record it
        info = describe_error(err)
        out.check("trick compile: tricks.measure_tricks ran", False, f"{info['type']}: {info['message'][:300]}")
        return []


def measure_tricks_in_process(
    ctx: Context, out: Outcome, tricks: Any, base: dict[str, Any], keys: Sequence[str]
) -> list[Any]:
    """tricks.measure_tricks for the in-process tricks on CUDA (a failed case comes back as a skipped row)."""
    if ctx.left() < TRICKS_MIN_S:
        out.skip_part(f"tricks {', '.join(keys)} not measured: section time used up", "time")
        return []
    free_memory(ctx.torch)
    try:
        return list(
            tricks.measure_tricks(
                STANDIN_CONFIG, base, list(keys), timeout_s=max(1.0, min(600.0, ctx.left())), device=ctx.device
            )
        )
    except Exception as err:  # noqa: BLE001 - a fault outside the measured steps (those come back as rows)
        info = describe_error(err)
        out.check("tricks.measure_tricks ran on CUDA", False, f"{info['type']}: {info['message'][:300]}")
        return []


def trick_record(row: Any, verdict: str, mode: str) -> dict[str, Any]:
    """A TrickResult as plain data: its own fields (the measurement as StepMeasurement.to_dict()), the estimate
    error (torch.compile is not modelled by the estimate), the attention backend that ran, the verdict and how it
    ran."""
    from course_utils.step_memory import error_percent

    if not dataclasses.is_dataclass(row) or isinstance(row, type):
        raise TypeError(f"row must be a tricks.TrickResult, got {type(row).__name__}")
    data = {f.name: getattr(row, f.name) for f in dataclasses.fields(row) if f.name != "measurement"}
    m = row.measurement
    data["measurement"] = m.to_dict() if hasattr(m, "to_dict") else None
    modelled = row.key != "compile"
    est, peak = row.estimate_bytes, row.peak_bytes
    data.update(
        peak_gb=gb(peak),
        estimate_gb=gb(est) if modelled else None,
        error_pct=error_percent(est, peak) if (modelled and est and peak) else None,
        attention_ran=attention_pair(m, None)[0],
        verdict=verdict,
        mode=mode,
    )
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
        mode = "child process, after the in-process cases" if r.key == "compile" else "in-process"
        rec = trick_record(r, tricks.verdict(r, baseline) if baseline is not None else "", mode)
        data.append(rec)
        assumed = rec.get("estimate_attention") if rec["estimate_gb"] is not None else None
        rows.append(
            [
                r.label,
                rec["peak_gb"],
                r.step_seconds,
                r.first_step_seconds,
                rec["estimate_gb"],
                rec["error_pct"],
                rec["attention_ran"],
                assumed,
                mode,
                rec["verdict"],
            ]
        )
        if rec["error_pct"] is not None:
            out.data["estimate_errors"].append(
                {"case": f"trick {r.key}", "error_pct": rec["error_pct"], "source": "tricks.measure_tricks"}
            )
            note_attention(out, f"trick {r.key}", rec["attention_ran"], assumed)
        judge_trick(out, r)
    out.data["tricks"] = data
    out.table(
        f"Notebook 05's tricks on CUDA (full fine-tuning, batch 4, seq {STEP_SEQ}, {MEASURED_STEPS} timed "
        "steps; estimate as tricks.measure_tricks makes it; torch.compile is not modelled by the estimate)",
        [
            "trick",
            "peak GB",
            "step s",
            "first step s",
            "estimate GB",
            "error %",
            "attention ran",
            "estimate assumes",
            "run",
            "verdict",
        ],
        rows,
    )
    eight = next((r for r in results if r.key == "adamw8bit" and r.optimizer_bytes), None)
    if eight is not None and baseline is not None and baseline.optimizer_bytes:
        ratio = eight.optimizer_bytes / baseline.optimizer_bytes
        out.check("8-bit AdamW keeps under half the optimizer bytes of AdamW", ratio < 0.5, f"ratio {ratio:.2f}")


def section_step_memory(ctx: Context, out: Outcome) -> None:
    """estimate_step vs measure_training_step (allocator peak) on CUDA, fp16 + GradScaler and the 16-bit and 4-bit
    bases included, then tricks.measure_tricks in this process, then torch.compile's bounded child. Cases that need
    peft or bitsandbytes are "not checked" without them; full tuning and the tricks need neither."""
    from course_utils import hardware, measure, tricks
    from course_utils import step_memory as sm

    native = bool(hardware.bf16_native(ctx.device))
    found = {name: requirement_problem(name) for name in ("peft", "bitsandbytes")}
    base, keys = trick_plan(found["bitsandbytes"] is None)
    out.data.update(measured_steps=MEASURED_STEPS, tricks_base=base, estimate_errors=[])
    cases = []
    for case in step_cases(native):
        lib = missing_library(case, found)
        if lib:
            out.skip_part(f"{case['label']}: not checked: {lib} missing ({found[lib]})", "library", lib)
        else:
            cases.append(case)
    if found["bitsandbytes"]:
        out.skip_part(
            f"trick adamw8bit: not checked: bitsandbytes missing ({found['bitsandbytes']})", "library", "bitsandbytes"
        )
    measure_step_cases(ctx, out, measure, sm, cases)
    results = measure_tricks_in_process(ctx, out, tricks, base, keys)
    report_tricks(out, tricks, results + measure_compile(ctx, out, tricks, base))
