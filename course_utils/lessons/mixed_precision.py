"""Notebook 02 (mixed precision): its charts, live demos and auto-checked exercises.

The arithmetic is in :mod:`course_utils.precision` (real torch arithmetic and ``torch.finfo``). Each widget
wires bounded controls to one of its report functions, whose text it prints, so nothing can hang.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Mapping

import torch

from course_utils import checks, hardware, precision
from course_utils.lessons.kit import COLORS, Feedback, check_choice, finish, new_figure, view_panel

#: float16's limits, from ``torch.finfo``: the charts and the loss-scale exercise draw on them.
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
    fig, ax = new_figure(f"Loss scaling moves small gradients into float16's range (scale {scale:,.0f})",
                         "log10 |gradient|", "number of gradients", figsize=(10.0, 3.8))
    ax.axvspan(lo, flush, color=COLORS["float16"], alpha=0.15, label="float16 stores 0 (underflow)")
    ax.axvspan(flush, normal, color=COLORS["int4"], alpha=0.18, label="float16 subnormal (fewer bits)")
    ax.axvspan(overflow, hi, color="black", alpha=0.12, label="float16 overflows to inf")
    for values, color, label in ((before, "float32", "gradients as computed"),
                                 (after, "bfloat16", f"gradients × {scale:,.0f}")):
        ax.hist(values, bins=80, range=(lo, hi), histtype="step", linewidth=1.6, color=COLORS[color], label=label)
    ax.set_xlim(lo, hi)
    return finish(fig, ax, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)


def loss_curves(curves: Mapping[str, list[float]]) -> Any:
    """Training loss per step for each labelled run, smoothed by a running mean over 10 steps (or all of a shorter
    run's)."""
    if not curves:
        raise ValueError("curves must map at least one label to a list of losses")
    fig, ax = new_figure("Training loss: float32 and mixed precision (running mean of 10 steps)",
                         "step", "cross-entropy loss")
    palette = [COLORS["float32"], COLORS["bfloat16"], COLORS["float16"], COLORS["measured"]]
    for i, (label, losses) in enumerate(curves.items()):
        if len(losses) == 0:
            raise ValueError(f"curve {label!r} has no losses")
        values = torch.tensor(losses, dtype=torch.float64)
        kernel = min(10, len(values))
        running = torch.nn.functional.avg_pool1d(values[None, None], kernel, stride=1)[0, 0]
        steps = list(range(kernel, len(values) + 1))
        style = "-" if i == 0 else "--"  # the first run (float32) solid, the 16-bit runs dashed
        ax.plot(steps, running.tolist(), style, color=palette[i % len(palette)], label=label, linewidth=1.8)
    ax.set_ylim(bottom=0)
    return finish(fig, ax)


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
    slider = w.FloatLogSlider(value=update, base=10, min=-9, max=-1, step=0.05, description="lr × grad",
                              readout_format=".2e", continuous_update=True)
    return view_panel(precision.update_report, dtype=dtype, update=slider)


def matmul_sizes(device: torch.device | str | None = None) -> tuple[int, ...]:
    """Matrix sides the size slider offers: 256 .. 4096 on a CPU, 256 .. 8192 on a GPU."""
    top = 8192 if hardware.as_device(device).type == "cuda" else precision.MAX_CPU_WIDGET_SIZE
    return tuple(2 ** k for k in range(8, top.bit_length()))  # 2**8 = 256 up to top, a power of two


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
    slider = w.SelectionSlider(options=matmul_sizes(dev), value=precision.all_formats_size(dev),
                               description="matrix side", continuous_update=False)
    return view_panel(functools.partial(precision.matmul_report, device=str(dev)), dtype=dtype, size=slider)


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
    bf16, fp16 = (precision.survives(w, update, name) for name in ("bfloat16", "float16"))
    return {(True, True): "both", (True, False): "bfloat16 only", (False, True): "float16 only",
            (False, False): "neither"}[(bf16, fp16)]


def check_small_weight_update(answer: Any) -> Feedback:
    """Check which 16-bit formats keep an update of 1e-5 on a weight of 0.02 (one of _SURVIVAL_OPTIONS)."""
    bf16_needs = precision.smallest_surviving_update(WEIGHT, "bfloat16")
    fp16_needs = precision.smallest_surviving_update(WEIGHT, "float16")
    scale = "The gap between neighbouring numbers is relative: about 2^-8 of the weight in bfloat16, 2^-11 in float16."
    hints = {
        "neither": (f"{UPDATE:g} is smaller than the 1e-4 that vanished on a weight of 1.0, but this weight is 50 "
                    f"times smaller, and so are its gaps. {scale}"),
        "both": (f"bfloat16 keeps only 8 significant bits: on {WEIGHT} it needs an update of at least "
                 f"{bf16_needs:.2g}. {scale}"),
        "bfloat16 only": ("bfloat16's strength is range, not precision: it has 3 fewer fraction bits than float16, "
                          f"so its gaps are 8 times wider. {scale}"),
    }
    return check_choice(answer, survival_answer(), name="answer", options=_SURVIVAL_OPTIONS, hints=hints,
                        why=f"On {WEIGHT}, bfloat16 needs an update of at least {bf16_needs:.2g}, float16 only "
                            f"{fp16_needs:.2g}: the gaps shrink with the weight, by the same factor in each format.")


# ------------------------------------------------------------------------------ 2. a loss scale for float16
#: The exercise: bring a gradient of _TINY_GRADIENT into float16's normal range without overflowing _LARGE_GRADIENT.
_TINY_GRADIENT, _LARGE_GRADIENT = 1e-8, 1.0
#: The loss scales offered (powers of two, as GradScaler uses): 2**10, 2**13, 2**16, 2**20.
SCALE_OPTIONS = (1024, 8192, 65536, 1048576)


def scale_fits(scale: float) -> bool:
    """True when ``_TINY_GRADIENT * scale`` is a normal float16 number and ``_LARGE_GRADIENT * scale`` is finite."""
    tiny = abs(precision.cast_value(_TINY_GRADIENT * scale, "float16"))
    large = abs(precision.cast_value(_LARGE_GRADIENT * scale, "float16"))
    return tiny >= _F16.smallest_normal and large <= _F16.max


def check_loss_scale(answer: Any) -> Feedback:
    """Check the loss scale that lifts a 1e-8 gradient into float16's normal range without overflowing 1.0."""
    hints = {
        1024: f"1e-8 x 1,024 is about 1e-5: still subnormal (fewer bits). To reach float16's smallest normal, "
              f"{_F16.smallest_normal:.2g}, the scale must be at least {_F16.smallest_normal / _TINY_GRADIENT:,.0f}.",
        65536: f"The tiny gradient is fine, but the gradient of 1.0 becomes 65,536, above float16's largest value "
               f"{_F16.max:,.0f}: inf. GradScaler starts at 65,536 too, and halves the scale when a step overflows "
               "like this.",
        1048576: f"1.0 x 1,048,576 is far above float16's largest value {_F16.max:,.0f}: it overflows to inf.",
    }
    expected = next(s for s in SCALE_OPTIONS if scale_fits(s))  # the one that fits (a test holds it to one)
    return check_choice(answer, expected, name="scale", options=SCALE_OPTIONS, hints=hints,
                        why=f"1e-8 x {expected:,} = {_TINY_GRADIENT * expected:.2g} is a normal float16 number, and "
                            f"1.0 x {expected:,} stays below {_F16.max:,.0f}.")
