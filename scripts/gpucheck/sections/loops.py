"""Sections 3 and 4: notebook 02's mixed-precision loop (float16 with GradScaler and a forced overflow, bfloat16
where native) and notebook 03's micro-batch sweep, on CUDA."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..runner import Context, Outcome


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
    runs["float16"] = fp16 = precision.train_mixed_precision(
        "float16", device=ctx.device, steps=100, spike_at=(spike,), task=task
    )
    if hardware.bf16_native(ctx.device):
        runs["bfloat16"] = precision.train_mixed_precision("bfloat16", device=ctx.device, steps=200, task=task)
    else:
        cap = torch.cuda.get_device_capability(0)
        out.skip_part(
            f"bfloat16 loop not run: compute capability {cap[0]}.{cap[1]} has no native bfloat16 "
            "(torch can emulate it; the lessons use float16 + loss scaling here)",
            "n/a",
        )
    rows = []
    for name, r in runs.items():
        losses = [h.loss for h in r.history]
        skipped = [h.step for h in r.history if h.skipped]
        rows.append(
            [
                name,
                r.loss_scaling,
                len(r.history),
                losses[0],
                losses[-1],
                r.test_accuracy,
                ", ".join(map(str, skipped)) or "none",
            ]
        )
        out.check(
            f"{name}: losses finite",
            all(math.isfinite(v) for v in losses),
            f"first {losses[0]:.3f}, last {losses[-1]:.3f}",
        )
        out.check(f"{name}: loss went down", losses[-1] < losses[0], f"{losses[0]:.3f} -> {losses[-1]:.3f}")
    out.table(
        "Training runs (precision.train_mixed_precision on CUDA)",
        ["dtype", "loss scaling", "steps", "first loss", "last loss", "test accuracy", "skipped steps"],
        rows,
    )
    around = [h for h in fp16.history if spike - 2 <= h.step <= spike + 2]
    out.table(
        f"float16 around the forced overflow (loss x 1e4 at step {spike})",
        ["step", "loss", "scale after the step", "skipped"],
        [[h.step, h.loss, h.scale, h.skipped] for h in around],
    )
    before = fp16.history[spike - 2].scale
    at = fp16.history[spike - 1]
    out.data["float16_spike"] = {"step": spike, "scale_before": before, "scale_after": at.scale, "skipped": at.skipped}
    out.check("float16: the GradScaler is on", fp16.loss_scaling)
    out.check(
        "float16: the overflowing step was skipped and the scale reduced",
        at.skipped and at.scale < before,
        f"scale {before:,.0f} -> {at.scale:,.0f}",
    )
    if "bfloat16" in runs:
        out.check("bfloat16: no loss scaling", not runs["bfloat16"].loss_scaling)
    unchanged, s0, s1 = overflow_step_leaves_weights(ctx, precision, task)
    out.data["direct_overflow_step"] = {"weights_unchanged": unchanged, "scale_before": s0, "scale_after": s1}
    out.check(
        "a float16 step with loss x 1e6: weights untouched, scale halved",
        unchanged and s1 == s0 / 2,
        f"weights unchanged={unchanged}, scale {s0:,.0f} -> {s1:,.0f}",
    )
    kept = autocast_float32_ops(torch, ctx.device, hardware.autocast_dtype(ctx.device))
    out.check(
        "CUDA autocast keeps softmax and layer_norm in float32 (notebook 02, rule 2)",
        all(d == torch.float32 for d in kept.values()),
        str(kept),
    )


def autocast_float32_ops(torch: Any, device: Any, dtype: Any) -> dict[str, Any]:
    """The dtypes softmax and layer_norm give under autocast on ``device`` (CUDA keeps both in float32)."""
    with torch.autocast(device_type=torch.device(device).type, dtype=dtype):
        h = torch.nn.Linear(8, 8).to(device)(torch.randn(4, 8, device=device))
        return {
            "softmax": torch.softmax(h, dim=-1).dtype,
            "layer_norm": torch.nn.functional.layer_norm(h, h.shape[-1:]).dtype,
        }


# --------------------------------------------------------------------------------------------
# 4. Micro-batch sweep (notebook 03)
# --------------------------------------------------------------------------------------------
def section_microbatch_sweep(ctx: Context, out: Outcome) -> None:
    """accumulation.sweep_micro_batches on CUDA: same gradient, activation memory (allocator) and time."""
    from course_utils import accumulation as acc

    rows = acc.sweep_micro_batches(acc.MICRO_BATCH_SIZES, batch_size=64, device=ctx.device)
    out.data["memory_what"] = rows[0].memory_what
    out.data["rows"] = [dataclasses.asdict(r) for r in rows]
    out.table(
        "Micro-batch sweep, batch 64 (" + rows[0].memory_what + ")",
        ["micro-batch", "steps", "same gradient", "largest diff", "activation MB", "ms per batch"],
        [
            [
                r.micro_batch_size,
                r.accumulation_steps,
                r.same_gradient,
                r.max_difference,
                r.activation_bytes / 1e6,
                r.seconds * 1e3,
            ]
            for r in rows
        ],
    )
    out.check("the CUDA allocator was measured", rows[0].memory_what.startswith("CUDA"), rows[0].memory_what)
    bad = [r.micro_batch_size for r in rows if not r.same_gradient]
    out.check("every micro-batch size gives the batch's gradient", not bad, f"differs at {bad}" if bad else "")
    small, big = min(rows, key=lambda r: r.micro_batch_size), max(rows, key=lambda r: r.micro_batch_size)
    out.check(
        "activation memory grows with the micro-batch",
        big.activation_bytes > small.activation_bytes,
        f"{small.activation_bytes / 1e6:.2f} MB at {small.micro_batch_size}, "
        f"{big.activation_bytes / 1e6:.2f} MB at {big.micro_batch_size}",
    )
