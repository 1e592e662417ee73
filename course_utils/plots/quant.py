"""Charts for notebook 01 (quantization), each with a function that writes its text description."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch
from matplotlib.ticker import MaxNLocator

from course_utils import checks, quant
from course_utils.plots import COLORS, new_figure, plt

#: Histograms draw at most this many values (an even stride through the tensor), to stay fast.
HISTOGRAM_MAX_POINTS = 200_000


def _minus(text: str) -> str:
    """Typographic minus signs for prose (the tables keep ASCII '-')."""
    return text.replace("-", "\u2212")


def _num(value: float, decimals: int) -> str:
    """A value for prose: '0' for zero, else ``decimals`` digits."""
    if abs(value) < 0.5 * 10 ** -decimals:
        return "0"
    return _minus(f"{value:.{decimals}f}")


def _join(items: Sequence[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


# --------------------------------------------------------------------------------------------
# The eight numbers: a two-row dot chart
# --------------------------------------------------------------------------------------------
def plot_eight_numbers(bits: int = 4):
    """Two rows of dots: the eight float32 weights, and the same weights after ``bits``-bit rounding.

    Faint vertical lines mark the levels (multiples of the step); a grey segment joins each weight to
    the value it is read back as.
    """
    table = quant.eight_numbers(bits)
    fig, ax = new_figure(f"The same 8 weights before and after {bits}-bit rounding", "weight value",
                         "format", figsize=(7.0, 2.8))
    q_max = 2 ** (bits - 1) - 1
    levels = [k * table.step for k in range(-q_max, q_max + 1) if abs(k * table.step) <= 0.4]
    ax.vlines(levels, -0.5, 1.5, color="0.85", lw=0.8, zorder=0)  # one artist for all levels: fast at 8 bits
    for w, r in zip(table.weights, table.read_back):
        ax.plot([w, r], [1, 0], color="0.6", lw=1, zorder=1)
    ax.scatter(table.weights, [1] * 8, s=45, color=COLORS["float32"], zorder=2, label="float32 (original)")
    ax.scatter(table.read_back, [0] * 8, s=45, color=COLORS["int4"], zorder=2, label=f"{bits}-bit (read back)")
    ax.set_xlim(-0.4, 0.4)
    ax.set_ylim(-0.5, 1.5)
    ax.set_yticks([0, 1], [f"{bits}-bit", "float32"])
    ax.grid(False, axis="y")
    ax.legend(loc="upper left", fontsize=8, ncols=2, frameon=False)
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.2, top=0.88)  # fixed margins: no layout pass per redraw
    return fig


def describe_eight_numbers(bits: int = 4) -> str:
    """The text description of :func:`plot_eight_numbers` (at 4 bits: the lesson's own description)."""
    table = quant.eight_numbers(bits)
    d = table.decimals
    originals = [_num(w, 2) for w in sorted(table.weights)]
    rounded = [_num(r, d) for r in sorted(table.read_back)]
    worst = max(abs(e) for e in table.errors)
    distinct = len({round(r, 6) for r in table.read_back})
    text = (f"Two rows of 8 dots on an axis from \u22120.4 to 0.4. The float32 row has the original weights: "
            f"{_join(originals)}. The {bits}-bit row has the rounded values: {_join(rounded)}. "
            f"Every rounded value is a multiple of {_num(table.step, d)}, and each dot is at most "
            f"{_num(worst, d)} from its original.")
    if distinct < 8:
        text += f" Only {distinct} different values are left: several weights share a level."
    return text


# --------------------------------------------------------------------------------------------
# Histograms of values and errors
# --------------------------------------------------------------------------------------------
def _subsample(x: torch.Tensor, max_points: int) -> np.ndarray:
    flat = x.detach().reshape(-1).float()
    stride = max(1, flat.numel() // max_points)
    return flat[::stride][:max_points].cpu().numpy()


def plot_value_histograms(x: torch.Tensor, x_hat: torch.Tensor, label: str,
                          max_points: int = HISTOGRAM_MAX_POINTS, bins: int = 120):
    """Left: histogram of the original values and of their read-back; right: histogram of the errors.

    At most ``max_points`` values are drawn (an even stride through the tensor), so this stays fast for
    a 4096 x 4096 matrix.
    """
    if not isinstance(x, torch.Tensor) or not isinstance(x_hat, torch.Tensor) or x.shape != x_hat.shape:
        raise ValueError("x and x_hat must be tensors of the same shape")
    if not isinstance(label, str) or not label:
        raise ValueError("label must be a non-empty string naming the format, e.g. 'int4, one scale'")
    max_points = checks.integer(max_points, "max_points", 100)
    orig, back = _subsample(x, max_points), _subsample(x_hat, max_points)
    err = back - orig
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.0, 3.4))
    lo, hi = float(min(orig.min(), back.min())), float(max(orig.max(), back.max()))
    edges = np.linspace(lo, hi, bins + 1)
    ax1.stairs(np.histogram(orig, edges)[0], edges, fill=True, alpha=0.45, color=COLORS["float32"],
               label="original (float32)")
    ax1.stairs(np.histogram(back, edges)[0], edges, color=COLORS["measured"], lw=1.2, label=f"read back ({label})")
    ax1.set_title("Values before and after quantization")
    ax1.set_xlabel("value")
    ax1.set_ylabel("count")
    ax1.legend(fontsize=8, frameon=False, loc="upper left")
    span = float(np.abs(err).max()) or 1e-12
    err_edges = np.linspace(-span, span, bins + 1)
    ax2.stairs(np.histogram(err, err_edges)[0], err_edges, fill=True, color=COLORS["int4"])
    ax2.set_title("Quantization error (read back \u2212 original)")
    ax2.set_xlabel("error")
    ax2.set_ylabel("count")
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.15, top=0.9, wspace=0.3)  # fixed: fast redraws
    return fig


# --------------------------------------------------------------------------------------------
# Same model, several formats
# --------------------------------------------------------------------------------------------
def plot_quality_vs_bits(series: Mapping[str, Sequence]):
    """Test accuracy (left) and test loss (right, log scale) of one model in every format.

    ``series`` maps a label (e.g. "one scale per tensor") to the rows of
    :func:`course_utils.digits.quality_by_format`; all series must list the same formats.
    """
    if not series:
        raise ValueError("series must hold at least one list of results")
    formats = [r.fmt for r in next(iter(series.values()))]
    for name, rows in series.items():
        if [r.fmt for r in rows] != formats:
            raise ValueError(f"series {name!r} lists other formats than the first series")
    positions = np.arange(len(formats))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10.0, 3.8))
    markers = "osd^v"
    for i, (name, rows) in enumerate(series.items()):
        ax1.plot(positions, [100 * r.accuracy for r in rows], marker=markers[i % 5], label=name)
        ax2.plot(positions, [r.loss for r in rows], marker=markers[i % 5], label=name)
    for ax in (ax1, ax2):
        ax.set_xticks(positions, formats)
        ax.set_xlabel("weight format (fewer bits to the right)")
    ax1.set_title("Test accuracy by weight format")
    ax1.set_ylabel("test accuracy (%)")
    ax1.set_ylim(0, 100)
    ax1.legend(fontsize=8, frameon=False, loc="lower left")
    ax2.set_title("Test loss by weight format (log scale)")
    ax2.set_ylabel("test cross-entropy loss")
    ax2.set_yscale("log")
    fig.tight_layout()
    return fig


def describe_quality_vs_bits(series: Mapping[str, Sequence]) -> str:
    """The text description of :func:`plot_quality_vs_bits`, with every plotted number."""
    if not series:
        raise ValueError("series must hold at least one list of results")
    formats = [r.fmt for r in next(iter(series.values()))]
    parts = [f"Two line charts with the weight formats {_join(formats)} on the horizontal axis. "
             f"Left: test accuracy in percent. Right: test loss on a log scale."]
    for name, rows in series.items():
        acc = _join([f"{r.fmt} {100 * r.accuracy:.1f}%" for r in rows])
        loss = _join([f"{r.fmt} {r.loss:.3f}" for r in rows])
        parts.append(f"With {name}: accuracy {acc}; loss {loss}.")
    return " ".join(parts)


# --------------------------------------------------------------------------------------------
# One format next to float32 (the "same model, four formats" demo)
# --------------------------------------------------------------------------------------------
def _check_side(side: object, name: str) -> tuple[str, float, float, int]:
    """``side`` as ``(label, accuracy 0-1, loss, weight bytes)``, or a clear error naming ``name``."""
    if not isinstance(side, tuple) or len(side) != 4:
        raise TypeError(f"{name} must be a tuple (label, accuracy, loss, weight_bytes), got {side!r}")
    label, accuracy, loss, size = side
    if not isinstance(label, str) or not label:
        raise ValueError(f"{name}'s label must be a non-empty string, got {label!r}")
    return (label, checks.number(accuracy, f"{name} accuracy", 0, 1), checks.number(loss, f"{name} loss", 0),
            checks.integer(size, f"{name} weight_bytes", 0))


def plot_format_comparison(base: tuple[str, float, float, int], other: tuple[str, float, float, int]):
    """Three small bar charts, ``base`` (float32) next to ``other``: test accuracy, test loss, weight bytes.

    Each side is ``(label, accuracy 0-1, loss, weight bytes)``. Fixed margins and no layout pass, so a widget
    redraw stays fast.
    """
    base, other = _check_side(base, "base"), _check_side(other, "other")
    fig, axes = plt.subplots(1, 3, figsize=(10.0, 2.9))
    colors = [COLORS["float32"], COLORS["measured"]]
    panels = (("Test accuracy", "test accuracy (%)", [100 * base[1], 100 * other[1]], "{:.1f}%"),
              ("Test loss", "test cross-entropy loss", [base[2], other[2]], "{:.3f}"),
              ("Weight bytes (scales included)", "bytes", [base[3], other[3]], "{:,.0f}"))
    for ax, (title, ylabel, values, fmt) in zip(axes, panels):
        bars = ax.bar([0, 1], values, color=colors, width=0.6)
        ax.set_xticks([0, 1], [base[0], other[0].split(",")[0]])  # 'int4, one scale per row': 'int4'; rest above
        ax.set_title(title, fontsize=10, y=1.02)  # a fixed position skips matplotlib's title layout pass
        ax.yaxis.set_major_locator(MaxNLocator(4))
        ax.set_xlabel("weight format")
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, max(values) * 1.25 or 1)
        ax.grid(False, axis="x")
        for bar, value in zip(bars, values):
            ax.annotate(fmt.format(value), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
    axes[0].set_ylim(0, 110)
    fig.suptitle(f"The same network: {base[0]} next to {other[0]}", fontsize=11)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.2, top=0.8, wspace=0.45)  # fixed: fast redraws
    return fig


def describe_format_comparison(base: tuple[str, float, float, int], other: tuple[str, float, float, int]) -> str:
    """The text description of :func:`plot_format_comparison`, with every plotted number."""
    base, other = _check_side(base, "base"), _check_side(other, "other")
    return (f"Three bar charts, {base[0]} (left bar) next to {other[0]} (right bar): test accuracy "
            f"{100 * base[1]:.1f}% and {100 * other[1]:.1f}%; test loss {base[2]:.3f} and {other[2]:.3f}; "
            f"weight bytes {base[3]:,} and {other[3]:,}.")
