"""Plans: what each section runs on this GPU. The sections and ``--dry-run`` read the same plans.

Part of ``scripts/gpu_check.py`` (its module doc describes the whole check).
"""
from __future__ import annotations

from typing import Any

from gpu_check_core import MATMUL_DTYPES, MATMUL_SIZES, MEASURED_STEPS, STEP_SEQ


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
