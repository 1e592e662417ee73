"""Notebook 02 (mixed precision): its charts, live demos and auto-checked exercises.

The arithmetic is in :mod:`course_utils.precision` (real torch arithmetic and ``torch.finfo``). Each widget
wires bounded controls to one of its report functions, whose text it prints, so nothing can hang.
"""

import functools
import math
from typing import Any, Mapping, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from course_utils import checks, digits, hardware, precision
from course_utils.lessons import kit
from course_utils.lessons.kit import COLORS, Feedback

#: float16's limits, from ``torch.finfo``: the gradient chart draws them.
_F16 = torch.finfo(torch.float16)


def gradient_histogram(grads: torch.Tensor, scale: float = 65536.0) -> Any:
    """Histogram of log10|gradient| before and after multiplying by ``scale``, over float16's limits.

    Shaded: the band that float16 flushes to zero (below half its smallest subnormal), the subnormal band
    (kept with fewer bits), and the overflow band (above 65,504), in 80 bins. Returns the figure.
    """
    if not isinstance(grads, torch.Tensor) or grads.numel() == 0:
        raise ValueError("grads must be a non-empty torch.Tensor")
    scale = checks.positive(scale, "scale")
    flush = math.log10(_F16.smallest_normal * _F16.eps / 2)  # below this, float16 rounds to 0
    normal = math.log10(_F16.smallest_normal)
    overflow = math.log10(_F16.max)
    mags = grads.detach().double().abs()
    before = torch.log10(mags[mags > 0]).numpy()
    after = before + math.log10(scale)
    lo, hi = min(before.min(), flush) - 1, max(after.max(), overflow) + 1
    title = f"Loss scaling moves small gradients into float16's range (scale {scale:,.0f})"
    fig, ax = kit.new_figure(title, "log10 |gradient|", "number of gradients", figsize=(10.0, 3.8))
    ax.axvspan(lo, flush, color=COLORS["float16"], alpha=0.15, label="float16 stores 0 (underflow)")
    ax.axvspan(flush, normal, color=COLORS["int4"], alpha=0.18, label="float16 subnormal (fewer bits)")
    ax.axvspan(overflow, hi, color="black", alpha=0.12, label="float16 overflows to inf")
    bins = {"bins": 80, "range": (lo, hi), "histtype": "step", "linewidth": 1.6}
    ax.hist(before, color=COLORS["float32"], label="gradients as computed", **bins)
    ax.hist(after, color=COLORS["bfloat16"], label=f"gradients × {scale:,.0f}", **bins)
    ax.set_xlim(lo, hi)
    return kit.finish(fig, ax, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)


def loss_curves(curves: Mapping[str, list[float]]) -> Any:
    """Training loss per step for each labelled run, smoothed by a running mean over 10 steps (or all of a shorter
    run's)."""
    if not curves:
        raise ValueError("curves must map at least one label to a list of losses")
    title = "Training loss: float32 and mixed precision (running mean of 10 steps)"
    fig, ax = kit.new_figure(title, "step", "cross-entropy loss")
    palette = [COLORS["float32"], COLORS["bfloat16"], COLORS["float16"], COLORS["measured"]]
    for i, (label, losses) in enumerate(curves.items()):
        if len(losses) == 0:
            raise ValueError(f"curve {label!r} has no losses")
        kernel = min(10, len(losses))
        running = torch.tensor(losses, dtype=torch.float64).unfold(0, kernel, 1).mean(1)  # each window's mean
        steps = list(range(kernel, len(losses) + 1))
        style = "-" if i == 0 else "--"  # the first run (float32) solid, the 16-bit runs dashed
        ax.plot(steps, running.tolist(), style, color=palette[i % len(palette)], label=label, linewidth=1.8)
    ax.set_ylim(bottom=0)
    return kit.finish(fig, ax)


#: Formats offered by the dropdowns, in the lesson's order.
_DTYPE_OPTIONS = ("float32", "bfloat16", "float16")


def tiny_update_widget(update: float = 1e-4) -> Any:
    """A dtype dropdown and a log slider for ``lr * grad`` (1e-9 .. 1e-1): does the update survive?

    Each change prints :func:`course_utils.precision.update_report`: one step ``w - update`` in the chosen dtype
    next to float32.
    """
    import ipywidgets as w

    update = checks.number(update, "update", 1e-9, 1e-1)
    dtype = w.Dropdown(options=_DTYPE_OPTIONS, value="bfloat16", description="weight in")
    slider = w.FloatLogSlider(value=update, min=-9, max=-1, step=0.05, description="lr × grad", readout_format=".2e")
    return kit.view_panel(precision.update_report, dtype=dtype, update=slider)


def matmul_sizes(device: torch.device | str | None = None) -> tuple[int, ...]:
    """Matrix sides the size slider offers: 256 .. 4096 on a CPU, 256 .. 8192 on a GPU."""
    top = 8192 if hardware.as_device(device).type == "cuda" else precision.MAX_CPU_WIDGET_SIZE
    return tuple(2**k for k in range(8, top.bit_length()))  # 2**8 = 256 up to top, a power of two


def matmul_widget(device: torch.device | str | None = None) -> Any:
    """A dtype dropdown and a size slider; each change times one float32 and one 16-bit matmul and prints
    :func:`course_utils.precision.matmul_report`.

    The slider updates on release only (each move starts real timings). It starts at the side where all three
    formats are timed (:func:`course_utils.precision.all_formats_size`). On a CPU, float16 above
    :data:`course_utils.precision.CPU_FLOAT16_MAX_SIZE` prints why it is not timed instead of running for minutes.
    """
    import ipywidgets as w

    dev = hardware.as_device(device)
    dtype = w.Dropdown(options=_DTYPE_OPTIONS, value=dtype_name_16(dev), description="16-bit type")
    sides = matmul_sizes(dev)
    slider = w.SelectionSlider(options=sides, value=precision.all_formats_size(dev), description="matrix side")
    slider.continuous_update = False  # each move times real matmuls: on release only
    return kit.view_panel(functools.partial(precision.matmul_report, device=str(dev)), dtype=dtype, size=slider)


def dtype_name_16(device: torch.device | str | None = None) -> str:
    """Name of the lesson's 16-bit dtype on ``device`` (the dropdown's starting value)."""
    return precision.dtype_name(hardware.autocast_dtype(device))


# ------------------------------------------------------------------------------ 1. a tiny update on a small weight
#: The exercise: an update of UPDATE on a weight of WEIGHT (a typical initial weight), in the two 16-bit formats.
WEIGHT, UPDATE = 0.02, 1e-5
#: The answers offered, each naming the 16-bit formats in which the update survives.
_SURVIVAL_OPTIONS = ("both", "bfloat16 only", "float16 only", "neither")


def survival_answer(w: float = WEIGHT, update: float = UPDATE) -> str:
    """The option naming the 16-bit formats in which ``w - update`` changes the stored weight."""
    kept = [name for name in ("bfloat16", "float16") if precision.survives(w, update, name)]
    if len(kept) == 1:
        return f"{kept[0]} only"
    return "both" if kept else "neither"


def check_small_weight_update(answer: Any) -> Feedback:
    """Check which 16-bit formats keep an update of 1e-5 on a weight of 0.02 (one of _SURVIVAL_OPTIONS)."""
    bf16_needs = precision.smallest_surviving_update(WEIGHT, "bfloat16")
    fp16_needs = precision.smallest_surviving_update(WEIGHT, "float16")
    scale = "The gap between neighbouring numbers is relative: about 2^-8 of the weight in bfloat16, 2^-11 in float16."
    hints = {
        "neither": (
            f"{UPDATE:g} is smaller than the 1e-4 that vanished on a weight of 1.0, but this weight is 50 "
            f"times smaller, and so are its gaps. {scale}"
        ),
        "both": f"bfloat16 has only 8 significant bits: on {WEIGHT} an update needs at least {bf16_needs:.2g}. {scale}",
        "bfloat16 only": (
            "bfloat16's strength is range, not precision: it has 3 fewer fraction bits than float16, "
            f"so its gaps are 8 times wider. {scale}"
        ),
    }
    why = (
        f"On {WEIGHT}, bfloat16 needs an update of at least {bf16_needs:.2g}, float16 only {fp16_needs:.2g}: the "
        "gaps shrink with the weight, by the same factor in each format."
    )
    return kit.check_choice(answer, survival_answer(), name="answer", options=_SURVIVAL_OPTIONS, hints=hints, why=why)


# ------------------------------------------------------------------------------ 2. the float16 step with a GradScaler
#: The check's plain SGD learning rate: an update is lr x gradient, so a gradient off by a factor moves the weights by
#: that factor (Adam would hide it: it divides the gradient by its own size).
_STEP_LR = 0.1
#: What the check multiplies its second batch's inputs by: scaled by 65,536, its gradients pass float16's 65,504.
_OVERFLOW_FACTOR = 1000.0


class StepResult(NamedTuple):
    """One call of a float16 step in the check: the loss it returned, how far it moved the weights, the scale after."""

    loss: float
    delta: torch.Tensor  # every parameter's change, flattened
    scale: float


def _step_case() -> tuple[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler, list[tuple[Any, Any]]]:
    """The check's tiny MLP (8 -> 16 -> 4, seed 0), its SGD optimizer, a fresh GradScaler and three seeded batches.

    The second batch's inputs are :data:`_OVERFLOW_FACTOR` times larger, so its scaled gradients overflow float16;
    the others' stay well below 65,504, whatever order a CPU's kernels add in (a test bounds both, in float64).
    """
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(3)]
    batches[1] = (batches[1][0] * _OVERFLOW_FACTOR, batches[1][1])
    model = digits.make_mlp(hidden=16, seed=0, in_features=8, out_features=4)
    return model, torch.optim.SGD(model.parameters(), lr=_STEP_LR), torch.amp.GradScaler("cpu"), batches


def _weights(model: nn.Module) -> torch.Tensor:
    """All of ``model``'s parameters, detached and flattened into one tensor."""
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _run_steps(fn: Any, name: str = "fp16_step") -> tuple[list[StepResult], Feedback | None]:
    """Call ``fn(model, optimizer, scaler, x, y)`` on the check's three batches, in order, on one model and scaler.

    Returns the steps it completed, and the feedback that stopped it (not written yet, a non-number loss, or an
    error, whose hint names the GradScaler slip behind it), or None.
    """
    model, optimizer, scaler, batches = _step_case()
    done: list[StepResult] = []
    for i, (x, y) in enumerate(batches, 1):
        before = _weights(model)
        call = f"{name} on step {i}"
        got, feedback = kit.call_answer(fn, (model, optimizer, scaler, x, y), name=name, call=call, hint=_STEP_HINT)
        if feedback is not None:
            slip = next((hint for text, hint in _SCALER_ERRORS.items() if text in feedback.message), feedback.hint)
            return done, Feedback(feedback.correct, feedback.message, slip, feedback.answered)
        loss = kit.one_number(got)
        if not isinstance(loss, float):
            what = f"{name} should return the loss, one number; got {type(got).__name__}."
            return done, kit.wrong(what, "End with: return loss (a float or a one-value tensor).")
        done.append(StepResult(loss, _weights(model) - before, scaler.get_scale()))
    return done, None


def _reference_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """The float16 step with loss scaling, as notebook 02's worked solution writes it: the check's yardstick."""
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    return loss


#: The recipe, as the hint for an answer that matches no named slip.
_STEP_HINT = (
    'In order: the forward pass and the loss under torch.autocast("cpu", dtype=torch.float16); '
    "scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update(); optimizer.zero_grad()."
)
#: GradScaler's own errors (a phrase of each) and the slip each one means.
_SCALER_ERRORS = {
    "scaler.scale(": (
        "scaler.step found no loss scale: the backward pass must run on the scaled loss, "
        "scaler.scale(loss).backward(), not loss.backward()."
    ),
    "No inf checks were recorded prior to update": (
        "scaler.update() found no step to judge: call "
        "scaler.step(optimizer), not optimizer.step(), then scaler.update()."
    ),
    "No inf checks were recorded for this optimizer": (
        "scaler.step found no gradients: zero them before the backward pass or after the step, never between the two."
    ),
    "has already been called since the last update": (
        "Call scaler.update() after scaler.step(optimizer), every step: the scaler refuses a second step without it."
    ),
}


def _step_slip(i: int, got: StepResult, want: StepResult, scale_before: float) -> str | None:
    """The hint for step ``i`` of the check when ``got`` differs from ``want``, naming the slip; None when right."""
    error = float((got.delta - want.delta).norm())
    if not torch.isfinite(got.delta).all() or error > 0.02 * float(want.delta.norm()):  # 16-bit sums vary by CPU
        if float(want.delta.norm()) == 0:  # the overflow step: the scaler must skip it
            if not torch.isfinite(got.delta).all():
                return (
                    f"Step {i}'s scaled gradients overflowed and the weights turned inf or nan: only "
                    "scaler.step(optimizer) skips such a step (optimizer.step() applies it)."
                )
            return (
                f"Step {i}'s batch is {_OVERFLOW_FACTOR:,.0f} times larger: in float16, scaled by {scale_before:,.0f}, "
                "its gradients overflow and the scaler skips the step. Here the weights moved: run the forward pass "
                'under torch.autocast("cpu", dtype=torch.float16), and the backward pass on scaler.scale(loss).'
            )
        if float(got.delta.norm()) == 0:
            if i > 1:
                return (
                    f"Step {i} was skipped too: the overflowed gradients of step {i - 1} were still in .grad. "
                    "Zero the gradients every step, before the backward pass or after the step."
                )
            return f"Step {i} did not move the weights. {_STEP_HINT}"
        ratio = float(got.delta @ want.delta) / float(want.delta @ want.delta)
        if math.isclose(ratio, 1 / scale_before, rel_tol=0.05):
            return (
                f"Step {i} moved the weights {scale_before:,.0f} times too little: scaler.step divides the gradients "
                "by the scale, so they must come from scaler.scale(loss).backward(), not loss.backward()."
            )
        if math.isclose(ratio, scale_before, rel_tol=0.05):
            return (
                f"Step {i} moved the weights {scale_before:,.0f} times too far: optimizer.step() used the scaled "
                "gradients. Call scaler.step(optimizer): it divides them by the scale and skips a step with inf or nan."
            )
        if math.isclose(ratio, 2.0, rel_tol=0.05):
            return f"Step {i} moved the weights twice: scaler.step(optimizer) calls optimizer.step() itself."
        return f"Step {i} moved the weights differently from the recipe. {_STEP_HINT}"
    if got.scale != want.scale:
        return (
            f"After step {i} the loss scale is {got.scale:,.0f}; it should be {want.scale:,.0f}. Call scaler.update() "
            "on the scaler you are given, after scaler.step(optimizer): it halves the scale after an overflow."
        )
    if not math.isclose(got.loss, want.loss, rel_tol=0.02):
        if math.isclose(got.loss, want.loss * scale_before, rel_tol=0.02):
            return (
                f"Step {i} returned the scaled loss, {scale_before:,.0f} times too large: return the loss "
                "itself; scaler.scale(loss) is only for the backward pass."
            )
        return f"Step {i} returned {got.loss:.4g}, not the batch's cross-entropy loss {want.loss:.4g}."
    return None


def check_fp16_step(fn: Any) -> Feedback:
    """Check ``fn(model, optimizer, scaler, x, y)``, the float16 step with a GradScaler, on three batches on the CPU."""
    name = "fp16_step"
    want, _ = _run_steps(_reference_step)
    got, feedback = _run_steps(fn, name)
    # the scale before each step: a fresh scaler's (65,536), then the recipe's after each step
    scales_before = [torch.amp.GradScaler("cpu").get_scale(), *(step.scale for step in want)]
    for i, (mine, right_step, scale_before) in enumerate(zip(got, want, scales_before), 1):
        slip = _step_slip(i, mine, right_step, scale_before)
        if slip is not None:
            return kit.wrong(f"{name} differs from the recipe at step {i} of {len(want)}.", slip)
    if feedback is not None:
        return feedback
    return kit.right(
        f"{name} moves the weights as the recipe does on steps 1 and 3 (within 2 %), skips step 2, whose "
        f"gradients overflow, and halves the scale from {want[0].scale:,.0f} to {want[1].scale:,.0f}."
    )
