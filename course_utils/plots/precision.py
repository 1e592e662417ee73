"""Charts for the mixed-precision notebook: float16's range against real-looking gradients, and loss curves."""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from course_utils import checks
from course_utils.plots import COLORS, new_figure


def gradient_histogram(grads: torch.Tensor, scale: float = 65536.0, bins: int = 80) -> Any:
    """Histogram of log10|gradient| before and after multiplying by ``scale``, over float16's limits.

    Shaded: the band that float16 flushes to zero (below half its smallest subnormal), the subnormal band
    (kept with fewer bits), and the overflow band (above 65,504). Returns the figure.
    """
    if not isinstance(grads, torch.Tensor) or grads.numel() == 0:
        raise ValueError("grads must be a non-empty torch.Tensor")
    scale = checks.positive(scale, "scale")
    bins = checks.integer(bins, "bins", 5, 500)
    info = torch.finfo(torch.float16)
    flush = math.log10(info.smallest_normal * info.eps / 2)  # below this, float16 rounds to 0
    normal = math.log10(info.smallest_normal)
    overflow = math.log10(info.max)
    mags = grads.detach().double().abs()
    mags = mags[mags > 0]
    before = torch.log10(mags).numpy()
    after = before + math.log10(scale)
    lo, hi = min(before.min(), flush) - 1, max(after.max(), overflow) + 1
    fig, ax = new_figure(f"Loss scaling moves small gradients into float16's range (scale {scale:,.0f})",
                         "log10 |gradient|", "number of gradients", figsize=(10.0, 3.8))
    ax.axvspan(lo, flush, color=COLORS["float16"], alpha=0.15, label="float16 stores 0 (underflow)")
    ax.axvspan(flush, normal, color=COLORS["int4"], alpha=0.18, label="float16 subnormal (fewer bits)")
    ax.axvspan(overflow, hi, color="black", alpha=0.12, label="float16 overflows to inf")
    ax.hist(before, bins=bins, range=(lo, hi), histtype="step", linewidth=1.6, color=COLORS["float32"],
            label="gradients as computed")
    ax.hist(after, bins=bins, range=(lo, hi), histtype="step", linewidth=1.6, color=COLORS["bfloat16"],
            label=f"gradients × {scale:,.0f}")
    ax.set_xlim(lo, hi)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def loss_curves(curves: Mapping[str, list[float]], smooth: int = 10) -> Any:
    """Training loss per step for each labelled run, smoothed by a running mean over ``smooth`` steps."""
    if not curves:
        raise ValueError("curves must map at least one label to a list of losses")
    smooth = checks.integer(smooth, "smooth", 1)
    fig, ax = new_figure(f"Training loss: float32 and mixed precision (running mean of {smooth} steps)",
                         "step", "cross-entropy loss")
    palette = [COLORS["float32"], COLORS["bfloat16"], COLORS["float16"], COLORS["measured"]]
    for i, (label, losses) in enumerate(curves.items()):
        if len(losses) == 0:
            raise ValueError(f"curve {label!r} has no losses")
        values = torch.tensor(losses, dtype=torch.float64)
        kernel = min(smooth, len(values))
        running = torch.nn.functional.avg_pool1d(values[None, None], kernel, stride=1)[0, 0]
        steps = range(kernel, len(values) + 1)
        style = "-" if i == 0 else "--"
        ax.plot(list(steps), running.tolist(), style, color=palette[i % len(palette)], label=label, linewidth=1.8)
    ax.set_ylim(bottom=0)
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig
