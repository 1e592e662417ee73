"""Sections 6 to 8: QLoRA on the offline stand-in (notebook 01b's loop), gloo DDP after CUDA is initialised
(notebook 03), and the memory-efficient TrainingArguments with the Trainer (notebook 05)."""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
import time
from typing import Any

from ..gpu import free_memory, gb
from ..plan import qlora_cases, trainer_cases
from ..runner import Context, Outcome, Skip, requirement_problem
from ..settings import FP16_TRAINING_KWARGS, PROMPT, QLORA_STEPS, STANDIN_CONFIG


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
    settings = {
        **models.dtype_kwargs(dt),
        "device_map": models.device_map(ctx.device),
        "quantization_config": models.quantization_config(4, dt),
    }
    with quiet_libraries():
        model = AutoModelForCausalLM.from_pretrained(choice.name, **settings)
    model.eval()
    return model


def quant_compute_dtype(model: Any) -> str:
    """The 4-bit compute dtype in the model's quantization config, as 'float16' / 'bfloat16' ('?' if none)."""
    qc = getattr(getattr(model, "config", None), "quantization_config", None)
    value = qc.get("bnb_4bit_compute_dtype") if isinstance(qc, dict) else getattr(qc, "bnb_4bit_compute_dtype", None)
    return "?" if value is None else str(value).replace("torch.", "")


def train_qlora(ctx: Context, out: Outcome, model: Any, batches: list[Any], tag: str) -> tuple[list[float], float, Any]:
    """Notebook 01b's loop: one AdamW step per ticket, with 01b's GradScaler (on for float16 compute), while the
    section has time; the losses, the seconds it took and the scaler."""
    torch = ctx.torch
    from course_utils import hardware

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    scaler = torch.amp.GradScaler("cuda", enabled=hardware.needs_loss_scaling(getattr(torch, tag)))  # as 01b
    model.train()
    losses: list[float] = []
    t0 = time.monotonic()
    for step in range(QLORA_STEPS):
        if ctx.left() < 5:
            out.skip_part(f"{tag}: training stopped after {step} steps: section time used up", "time")
            break
        loss = model(**batches[step % len(batches)]).loss
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses, time.monotonic() - t0, scaler


def qlora_run(ctx: Context, out: Outcome, case: dict[str, Any], choice: Any) -> list[Any]:
    """One QLoRA case, notebook 01b's loop: 4-bit load with the case's compute dtype, LoRA (with peft's k-bit
    preparation), AdamW steps of one ticket each with 01b's GradScaler (on for float16 compute), generate; its row."""
    from course_utils import lora, models, tickets

    tag = case["compute_dtype"]
    free_memory(ctx.torch)
    reset_peak(ctx)
    t0 = time.monotonic()
    model = load_4bit(ctx, models, choice, tag, default=not case["forced"])
    load_s = time.monotonic() - t0
    base_footprint = model.get_memory_footprint()
    tokenizer = models.load_tokenizer(choice)
    four_bit = [m for m in model.modules() if type(m).__name__ == "Linear4bit"]
    compute = quant_compute_dtype(model)
    out.check(
        f"{tag}: loaded in 4 bits",
        bool(getattr(model, "is_loaded_in_4bit", False)) and bool(four_bit),
        f"is_loaded_in_4bit={getattr(model, 'is_loaded_in_4bit', None)}, {len(four_bit)} Linear4bit layers",
    )
    out.check(f"{tag}: the 4-bit layers compute in {tag}", compute == tag, f"bnb_4bit_compute_dtype={compute}")
    out.check(
        f"{tag}: the weights are on the GPU",
        next(model.parameters()).device.type == "cuda",
        str(next(model.parameters()).device),
    )
    model = lora.add_lora(model)
    trainable, total = lora.trainable_counts(model)
    batches = [
        tickets.training_example(tokenizer, ticket, ctx.device)  # 01b's examples: one ticket per step
        for ticket in tickets.load_tickets("train")[:QLORA_STEPS]
    ]
    losses, train_s, scaler = train_qlora(ctx, out, model, batches, tag)
    out.check(
        f"{tag}: GradScaler {'on' if tag == 'float16' else 'off'}, as notebook 01b sets it",
        scaler.is_enabled() == (tag == "float16"),
        f"enabled={scaler.is_enabled()}",
    )
    if scaler.is_enabled():
        out.check(
            f"{tag}: the loss scale stayed usable",
            0 < scaler.get_scale() < float("inf"),
            f"scale {scaler.get_scale():g}",
        )
    text, gen_s = "", None
    if ctx.left() >= 3:
        t0 = time.monotonic()
        text = models.generate_text(model, tokenizer, PROMPT, max_new_tokens=10)
        gen_s = time.monotonic() - t0
    else:
        out.skip_part(f"{tag}: generate_text not run: section time used up", "time")
    footprint, peak = model.get_memory_footprint(), peak_allocated(ctx)
    layer_dtypes = sorted({str(getattr(m, "compute_dtype", None)).replace("torch.", "") for m in four_bit})
    out.data.setdefault("cases", []).append(
        {
            "case": case["label"],
            "compute_dtype": compute,
            "layer_compute_dtypes": layer_dtypes,
            "grad_scaler": scaler.is_enabled(),
            "loss_scale": scaler.get_scale() if scaler.is_enabled() else None,
            "linear4bit_layers": len(four_bit),
            "trainable": trainable,
            "total_params": total,
            "losses": losses,
            "text": text,
            "base_footprint_gb": base_footprint / 1e9,
            "footprint_gb": footprint / 1e9,
            "peak_gb": gb(peak),
            "load_seconds": load_s,
            "train_seconds": train_s,
            "generate_seconds": gen_s,
        }
    )
    out.text(f"generate_text, {tag} compute (random weights: noise is expected)", text)
    out.check(f"{tag}: losses finite", bool(losses) and all(math.isfinite(v) for v in losses), str(losses))
    if gen_s is not None:
        out.check(f"{tag}: generated text is longer than the prompt", len(text) > len(PROMPT), repr(text))
    del model, batches
    return [
        case["label"],
        load_s,
        base_footprint / 1e9,
        footprint / 1e9,
        f"{trainable:,} / {total:,}",
        ", ".join(f"{v:.3f}" for v in losses),
        train_s,
        gen_s,
        gb(peak),
    ]


def section_qlora(ctx: Context, out: Outcome) -> None:
    """The stand-in in 4 bits + LoRA: 8 AdamW steps, then 10 generated tokens; float16 compute on every GPU."""
    from course_utils import hardware, hub, standin

    folder = standin.ensure_standin(folder=ctx.out_dir / "standin")  # --out holds every file the check writes
    choice = hub.ModelChoice(str(folder), True, "gpu_check always uses the offline stand-in")
    out.data["model"] = choice.label
    rows = []
    for case in qlora_cases(bool(hardware.bf16_native(ctx.device))):
        if ctx.left() < 10:
            out.skip_part(f"{case['label']} not run: section time used up", "time")
            continue
        rows.append(qlora_run(ctx, out, case, choice))
        free_memory(ctx.torch)
    out.table(
        f"QLoRA on {choice.label}, notebook 01b's loop",
        [
            "case",
            "4-bit load s",
            "footprint after load GB",
            "footprint with LoRA GB",
            "trainable / all parameters",
            f"losses ({QLORA_STEPS} AdamW steps, one ticket each)",
            "training s",
            "generate 10 tokens s",
            "peak allocated GB",
        ],
        rows,
    )


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
    out.check(
        "CUDA is initialised before the ranks start", out.data["cuda_initialised"] or not ctx.device.startswith("cuda")
    )
    out.data["start_method"] = ddp.start_method()
    timeout = max(10.0, min(120.0, ctx.left() - 5))
    result = ddp.run_ddp_check(world_size=2, batch_size=64, accumulation_steps=4, backend="gloo", timeout_s=timeout)
    del marker
    out.data.update(result.__dict__)
    out.text("run_ddp_check(...).report()", result.report())
    out.table(
        "gloo DDP, 2 processes x 4 micro-batches of 8",
        ["figure", "value"],
        [
            ["start method", ddp.start_method()],
            ["same gradient as one process", result.same_gradient],
            ["ranks agree", result.ranks_agree],
            ["largest difference", result.max_difference],
            ["all-reduces per update with no_sync()", result.allreduce_calls],
            ["all-reduces without no_sync()", result.allreduce_calls_without_no_sync],
            ["seconds", result.seconds],
        ],
    )
    out.check("same gradient as one process's batch of 64", result.same_gradient)
    out.check("all ranks hold the same gradient", result.ranks_agree)
    out.check("one all-reduce per update with no_sync()", result.allreduce_calls == 1, str(result.allreduce_calls))


# --------------------------------------------------------------------------------------------
# 8. Memory-efficient TrainingArguments with the Trainer (notebook 05)
# --------------------------------------------------------------------------------------------
def trainer_arguments(
    tricks: Any, folder: str, device: str, case: dict[str, Any], bitsandbytes: bool
) -> tuple[Any, list[str]]:
    """The lesson's TrainingArguments for ``device`` (max_steps=2); for a forced case, built from the same plan
    (tricks.training_arguments_plan) with FP16_TRAINING_KWARGS, what a T4 gets."""
    if not case["forced"]:
        return tricks.memory_efficient_training_arguments(folder, max_steps=2, device=device)
    from transformers import TrainingArguments

    from course_utils.quiet import quiet_libraries

    kwargs, changes = tricks.training_arguments_plan(folder, max_steps=2, device=device, bitsandbytes=bitsandbytes)
    kwargs.update(FP16_TRAINING_KWARGS)
    kwargs.setdefault("report_to", "none")
    changes = [
        *changes,
        "bf16=True -> fp16=True, bf16=False: forced by gpu_check, so that the T4 branch (float16 "
        "autocast with the Trainer's loss scaling) runs on this GPU too",
    ]
    with quiet_libraries():
        return TrainingArguments(**kwargs), changes


def trainer_run(ctx: Context, out: Outcome, tricks: Any, case: dict[str, Any], bitsandbytes: bool) -> list[Any]:
    """One Trainer case: its arguments, 2 steps with tricks.run_trainer_steps, the checks; its table row."""
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="gpu-check-trainer-", dir=ctx.out_dir)
    tag = "fp16" if case["fp16"] else "bf16"
    try:
        args, changes = trainer_arguments(tricks, folder, ctx.device, case, bitsandbytes)
        if getattr(args, "report_to", None) not in ([], None, "none", ["none"]):
            out.note(f"{tag}: report_to was {args.report_to!r}: set to [] so that no tracker is contacted offline.")
            with contextlib.suppress(Exception):
                args.report_to = []
        optim = getattr(args.optim, "value", args.optim)
        settings = {
            "bf16": args.bf16,
            "fp16": args.fp16,
            "optim": optim,
            "checkpointing": tricks.checkpointing_enabled(args),
            "per_device_train_batch_size": args.per_device_train_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "max_steps": args.max_steps,
        }
        out.text(f"{case['label']}: changes from the lesson's arguments", "\n".join(f"- {c}" for c in changes))
        out.check(
            f"{tag}: bf16={not case['fp16']}, fp16={case['fp16']} as planned",
            bool(args.bf16) == (not case["fp16"]) and bool(args.fp16) == case["fp16"],
            f"bf16={args.bf16}, fp16={args.fp16}",
        )
        free_memory(ctx.torch)
        run = tricks.run_trainer_steps(STANDIN_CONFIG, args, batch_examples=32, seq=64)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    peak = run["peak"]
    out.data.setdefault("cases", []).append(
        {
            "case": case["label"],
            "changes": changes,
            "settings": settings,
            "steps": run["steps"],
            "losses": run["losses"],
            "seconds": run["seconds"],
            "peak_gb": peak.gb,
            "peak_what": peak.what,
        }
    )
    out.check(f"{tag}: 2 optimizer steps done", run["steps"] == 2, str(run["steps"]))
    out.check(
        f"{tag}: losses logged and finite",
        bool(run["losses"]) and all(math.isfinite(v) for v in run["losses"]),
        str(run["losses"]),
    )
    out.check(f"{tag}: peak read from the CUDA allocator", str(peak.what).startswith("CUDA"), str(peak.what))
    return [
        case["label"],
        settings["bf16"],
        settings["fp16"],
        optim,
        settings["checkpointing"],
        f"{settings['per_device_train_batch_size']} x {settings['gradient_accumulation_steps']}",
        run["steps"],
        ", ".join(map(str, run["losses"])),
        run["seconds"],
        peak.gb,
    ]


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
    out.table(
        "Trainer, SmolLM2-135M architecture (random weights), 64-token random sequences, max_steps=2",
        [
            "case",
            "bf16",
            "fp16",
            "optim",
            "checkpointing",
            "batch x accumulation",
            "steps",
            "losses",
            "seconds",
            "peak GB",
        ],
        rows,
    )
