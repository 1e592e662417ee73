"""Plan and budget: what each section runs on this GPU (the sections and ``--dry-run`` read the same plans), the
sections' caps fitted to the budget, and the dry run's plan as Markdown."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from .gpu import machine_summary
from .report import format_cell
from .runner import Section, not_checked_reason, requirement_problem
from .settings import (
    ESTIMATE_LIMIT_PCT,
    MATMUL_DTYPES,
    MATMUL_SIZES,
    MEASURED_STEPS,
    OPTIONAL_LIBRARIES,
    RESERVE_S,
    STANDIN_CONFIG,
    STEP_SEQ,
)


def plan_matmul(native: bool) -> list[dict[str, Any]]:
    """The matmul cases: every size x dtype; emulated bfloat16 (no native bf16) at the smallest size only."""
    cases = []
    for size in MATMUL_SIZES:
        for dtype in MATMUL_DTYPES:
            emulated = dtype == "bfloat16" and not native
            if emulated and size != MATMUL_SIZES[0]:
                continue
            cases.append(
                {
                    "label": f"{size}x{size} {dtype}" + (" (emulated: no native bfloat16)" if emulated else ""),
                    "size": size,
                    "dtype": dtype,
                    "emulated": emulated,
                    "fp16": dtype == "float16",
                    "forced": False,
                    "timer": "blocked_autorange",
                }
            )
    return cases


#: The optional libraries a step of each method needs beyond torch and transformers (full tuning needs none).
METHOD_NEEDS = {
    "full": (),
    "full-bf16": (),
    "lora": ("peft",),
    "lora-bf16": ("peft",),
    "qlora": ("peft", "bitsandbytes"),
}
#: The long-sequence case's length: where the attention backend decides the peak (math keeps the s x s scores).
LONG_SEQ = 1024


def long_seq_batch(seq: int = LONG_SEQ) -> int:
    """The largest batch (a power of two up to 32) whose LoRA step at ``seq`` tokens with 16-bit autocast fits a T4
    by the estimate (within 90 % of its usable memory; with the math attention a T4 gets), at least 1."""
    from course_utils import datasheets, memory
    from course_utils import step_memory as sm

    t4 = datasheets.lookup("T4")
    largest = 1
    for batch in (1, 2, 4, 8, 16, 32):
        est = sm.estimate_step(
            STANDIN_CONFIG, method="lora", batch=batch, seq=seq, autocast=True, device="cuda", capability=t4.capability
        )
        if memory.step_verdict(est.peak_gb, t4.usable_gb) == "fits":
            largest = batch
    return largest


def _step(label: str, method: str, batch: int, seq: int = STEP_SEQ, **more: Any) -> dict[str, Any]:
    """A planned measure_training_step case (``more``: autocast, and the flags fp16 and forced)."""
    return {
        "label": label,
        "method": method,
        "batch": batch,
        "seq": seq,
        "steps": MEASURED_STEPS,
        "fp16": False,
        "forced": False,
        **more,
        "needs": list(METHOD_NEEDS[method]),
    }


def step_cases(native: bool) -> list[dict[str, Any]]:
    """measure_training_step's cases in step_memory: LoRA/full x batch 1/4/8; fp16 autocast + GradScaler; the 16-bit
    and 4-bit bases (full-bf16, lora-bf16, qlora); LoRA at seq 1,024, batch as large as a T4 fits by the estimate.
    Each lists the optional libraries it needs (``needs``): without them it is "not checked"."""
    from course_utils import step_memory as sm

    cases = [_step(f"{method} batch {batch}", method, batch) for method in ("lora", "full") for batch in (1, 4, 8)]
    why = "forced: the T4 branch on this GPU" if native else "this GPU's 16-bit dtype"
    cases += [
        _step(
            f"{method} batch 4, fp16 autocast + GradScaler ({why})",
            method,
            4,
            autocast="fp16",
            fp16=True,
            forced=native,
        )
        for method in ("lora", "full")
    ]
    cases += [
        _step("full-bf16 batch 4 (every weight and state in bfloat16)", "full-bf16", 4),
        _step("lora-bf16 batch 4 (the base in this GPU's 16-bit dtype)", "lora-bf16", 4),
        _step("qlora batch 4 (4-bit NF4 base, notebook 01b's recipe)", "qlora", 4),
    ]
    batch = long_seq_batch()
    here = sm.estimate_step(STANDIN_CONFIG, method="lora", batch=batch, seq=LONG_SEQ, autocast=True, device="cuda")
    cases.append(
        _step(
            f"lora batch {batch} x seq {LONG_SEQ}, 16-bit autocast (the largest batch a T4 fits by the "
            f"estimate; the estimate assumes {here.attention.backend} attention on this GPU)",
            "lora",
            batch,
            seq=LONG_SEQ,
            autocast="auto",
            long_seq=True,
        )
    )
    return cases


def missing_library(case: dict[str, Any], found: dict[str, str | None]) -> str | None:
    """The first optional library ``case`` needs that is not importable here (``found``: name -> problem or None)."""
    return next((name for name in case.get("needs", ()) if found.get(name)), None)


def case_kwargs(case: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of measure_training_step in a planned case (its label and flags left out)."""
    return {k: v for k, v in case.items() if k not in ("label", "fp16", "forced", "needs", "long_seq")}


def trick_plan(bitsandbytes: bool) -> tuple[dict[str, Any], list[str]]:
    """tricks.measure_tricks' base step (full, batch 4, 3 measured steps: torch and transformers only) and its
    in-process tricks, in notebook 05's order (8-bit AdamW only with bitsandbytes)."""
    base = {"method": "full", "batch": 4, "seq": STEP_SEQ, "steps": MEASURED_STEPS}
    keys = ["baseline", "checkpointing", "bf16"] + (["adamw8bit"] if bitsandbytes else []) + ["accumulation"]
    return base, keys


def qlora_cases(native: bool) -> list[dict[str, Any]]:
    """The QLoRA runs of notebook 01b's loop: the GPU's own compute dtype; on Ampere+ also float16 compute with its
    GradScaler (the T4 branch)."""
    if not native:
        return [
            {
                "label": "4-bit, float16 compute + GradScaler, notebook 01b's loop (this GPU's 16-bit dtype: the T4 "
                "branch)",
                "compute_dtype": "float16",
                "fp16": True,
                "forced": False,
            }
        ]
    return [
        {
            "label": "4-bit, bfloat16 compute, notebook 01b's loop (this GPU's 16-bit dtype)",
            "compute_dtype": "bfloat16",
            "fp16": False,
            "forced": False,
        },
        {
            "label": "4-bit, float16 compute + GradScaler, notebook 01b's loop (forced: the T4 branch on this GPU)",
            "compute_dtype": "float16",
            "fp16": True,
            "forced": True,
        },
    ]


def trainer_cases(native: bool) -> list[dict[str, Any]]:
    """The Trainer runs: the lesson's arguments for this GPU; on Ampere+ also with fp16=True forced."""
    if not native:
        return [
            {"label": "the lesson's arguments for this GPU: fp16=True (the T4 branch)", "fp16": True, "forced": False}
        ]
    return [
        {"label": "the lesson's arguments for this GPU: bf16=True", "fp16": False, "forced": False},
        {"label": "fp16=True forced, bf16=False (the T4 branch on this GPU)", "fp16": True, "forced": True},
    ]


def plain_case(label: str) -> dict[str, Any]:
    """A planned case with nothing but its label."""
    return {"label": label, "fp16": False, "forced": False}


def step_memory_cases(native: bool, found: dict[str, str | None]) -> list[dict[str, Any]]:
    """Section 5's planned cases: the measured steps (those whose library is missing say so), then the tricks."""
    base, keys = trick_plan(found.get("bitsandbytes") is None)
    cases = []
    for case in step_cases(native):
        lib = missing_library(case, found)
        cases.append({**case, "label": f"{case['label']}: not checked: {lib} missing"} if lib else case)
    steps = f"full batch 4, {base['steps']} measured steps"
    for key in keys:
        cases.append({**plain_case(f"trick {key}: {steps}"), "steps": base["steps"], "trick": key})
    compile_label = f"trick compile: {steps}, in a bounded child process after the in-process cases"
    cases.append({**plain_case(compile_label), "steps": base["steps"], "trick": "compile"})
    if found.get("bitsandbytes"):
        cases.append(plain_case("trick adamw8bit: not checked: bitsandbytes missing"))
    return cases


def section_cases(key: str, native: bool, found: dict[str, str | None]) -> list[dict[str, Any]]:
    """What section ``key`` runs on a GPU with (or without) native bfloat16, as planned cases; ``found``: each
    optional library's problem (None: importable). A case whose library is missing says "not checked"."""
    if key == "matmul":
        return plan_matmul(native) + [
            {**plain_case("4096x4096 float16 with precision.time_matmul (the lessons' helper)"), "fp16": True}
        ]
    if key == "step_memory":
        return step_memory_cases(native, found)
    if key == "qlora":
        return qlora_cases(native)
    if key == "trainer":
        return trainer_cases(native)
    fixed = {
        "environment": ["versions, GPU, hardware.setup_report() and the dtype decisions"],
        "mixed_precision": [
            "float32 loop, 200 steps",
            "float16 + GradScaler loop, 100 steps, overflow forced at step 60",
            "bfloat16 loop, 200 steps" if native else "bfloat16 loop: n/a (no native bfloat16)",
            "one float16 step with the loss x 1e6: skipped by the scaler",
        ],
        "microbatch_sweep": ["micro-batches 1..64 of a batch of 64: same gradient, activation memory, time"],
        "ddp": ["2-process gloo DDP, 4 micro-batches of 8 each, started after CUDA is initialised"],
        "timeline": [
            "notebook 05's baseline step (miniature, full, batch 4 x 256) over time: measured (profiler, "
            "allocator history saved for memory_viz) against predicted, peaks within 5 %, same phase"
        ],
    }
    if key not in fixed:
        raise ValueError(f"key must be a section name, got {key!r}")
    cases = [plain_case(label) for label in fixed[key]]
    if key == "mixed_precision":
        cases[1].update(fp16=True)
        cases[3].update(fp16=True)
    return cases


# --------------------------------------------------------------------------------------------
# The budget, and the plan a dry run prints
# --------------------------------------------------------------------------------------------
def plan_budget(sections: Sequence[Section], budget_s: float) -> list[Section]:
    """``sections`` with their caps scaled down, if need be, to fit in ``budget_s`` less the reserve."""
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or budget_s <= RESERVE_S:
        raise ValueError(f"budget_s must be a number of seconds above {RESERVE_S:g}, got {budget_s!r}")
    room = float(budget_s) - RESERVE_S
    total = sum(s.cap_s for s in sections)
    if total <= room:
        return list(sections)
    return [dataclasses.replace(s, cap_s=round(s.cap_s * room / total, 1)) for s in sections]


def build_plan(
    torch: Any,
    sections: Sequence[Section],
    budget_s: float,
    strict: bool = False,
    problem: Callable[[str], str | None] | None = None,
) -> dict[str, Any]:
    """What a run would do on this GPU, decided without running anything on it (--dry-run)."""
    from course_utils import hardware

    problem = requirement_problem if problem is None else problem
    native = bool(hardware.bf16_native("cuda"))
    found = {name: problem(name) for name in OPTIONAL_LIBRARIES}
    planned = []
    for s in plan_budget(sections, budget_s):
        why = {name: found[name] if name in found else problem(name) for name in s.needs}
        missing = [name for name in s.needs if why[name]]
        planned.append(
            {
                "number": s.number,
                "key": s.key,
                "title": s.title,
                "cap_s": s.cap_s,
                "min_s": s.min_s,
                "needs": list(s.needs),
                "not_checked": (not_checked_reason(missing, [why[n] for n in missing]) if missing else None),
                "cases": section_cases(s.key, native, found),
            }
        )
    return {
        "machine": machine_summary(torch),
        "bf16_native": native,
        "budget_s": float(budget_s),
        "reserve_s": RESERVE_S,
        "planned_s": round(sum(p["cap_s"] for p in planned), 1),
        "strict": strict,
        "estimate_limit_pct": ESTIMATE_LIMIT_PCT,
        "measured_steps": MEASURED_STEPS,
        "matmul_sizes": list(MATMUL_SIZES),
        "libraries": found,
        "sections": planned,
    }


def render_plan(plan: dict[str, Any]) -> str:
    """The dry run's plan as Markdown: the GPU, the budget, and each section's cap and cases."""
    m = plan["machine"]
    lines = [
        "# gpu_check dry run: the plan (nothing was run on the GPU)",
        "",
        f"GPU: {m['gpu']} (compute capability {m['capability']}, {format_cell(m['memory_gb'])} GB, native "
        f"bfloat16: {format_cell(plan['bf16_native'])}); torch {m['torch']}, CUDA {m['cuda']}.",
        "",
        f"Budget {format_cell(plan['budget_s'])} s: sections planned within {format_cell(plan['planned_s'])} s, "
        f"{plan['reserve_s']:g} s kept for writing the results; {plan['measured_steps']} measured "
        f"steps per case and per trick; --strict {'on' if plan['strict'] else 'off'} (estimate errors over "
        f"{plan['estimate_limit_pct']:g} % and skips fail it; a missing optional library is 'not checked').",
    ]
    for s in plan["sections"]:
        lines += ["", f"## {s['number']}. {s['title']} (cap {format_cell(s['cap_s'])} s)"]
        if s["not_checked"]:
            lines += ["", f"**{s['not_checked']}**"]
        lines += [""] + [f"- {c['label']}" for c in s["cases"]]
    return "\n".join(lines) + "\n"


def parse_sections(text: str | None, sections: Sequence[Section]) -> list[Section]:
    """The ``sections`` named (or numbered) in a comma list, in their order; all of them for None/empty."""
    if not text:
        return list(sections)
    wanted = {w.strip().lower() for w in text.split(",") if w.strip()}
    known = {s.key: s for s in sections} | {str(s.number): s for s in sections}
    unknown = sorted(wanted - set(known))
    if unknown:
        choices = ", ".join(f"{s.number}={s.key}" for s in sections)
        raise ValueError(f"unknown section(s) {', '.join(unknown)}; choose from {choices}")
    chosen = {known[w].key for w in wanted}
    return [s for s in sections if s.key in chosen]
