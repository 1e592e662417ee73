"""Notebook 01 (quantization): its charts, widgets and auto-checked exercises.

The arithmetic is in :mod:`course_utils.quant` and :mod:`course_utils.digits`; this module formats, draws and
wires. Each chart has a function that writes its text description; each widget is a plain ``*_view`` callback
(tested without a browser) wired by a ``*_widget`` function. Expected answers come from ``quant``, never
retyped.
"""
from __future__ import annotations

import textwrap
import weakref
from functools import lru_cache
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from matplotlib.ticker import MaxNLocator

from course_utils import checks, digits, quant
from course_utils.lessons.kit import (
    COLORS,
    Feedback,
    check_number,
    is_placeholder,
    new_figure,
    plt,
    right,
    unanswered,
    wrong,
)

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


#: Block sizes the error demo offers; 0 stands for "one scale for the whole matrix".
BLOCK_CHOICES: tuple[tuple[str, int], ...] = (("one scale", 0), ("16", 16), ("32", 32), ("64", 64),
                                              ("128", 128), ("256", 256), ("1024", 1024))
#: Side of the random matrix the error demo quantizes when none is given (1024 x 1024 = 1M values).
DEMO_SIDE = 1024
#: The error demo refuses bigger tensors, so that one redraw stays well under a second.
MAX_DEMO_VALUES = 4 * 1024 * 1024
#: Scale granularities the format demo offers (label, value): int formats only; a 16-bit float needs no scale.
SCALE_CHOICES: tuple[tuple[str, str | int], ...] = (
    ("one per tensor", "tensor"), ("one per row", "row"), ("one per 64 weights", 64), ("one per 32 weights", 32),
    ("one per 16 weights", 16))
SCALE_LABELS: dict[str | int, str] = {value: label for label, value in SCALE_CHOICES}


def eight_numbers_view(bits: int = 4) -> tuple[str, Any]:
    """The eight-number table at ``bits`` bits, the bytes it takes, and the dot chart."""
    table = quant.eight_numbers(bits)
    code_bytes = quant.storage(quant.quantize(torch.tensor(quant.EIGHT_WEIGHTS), bits)).codes
    text = (quant.format_eight_numbers(table)
            + f"\n\nfloat32: 8 x 4 = 32 bytes.  {bits}-bit: 8 x {bits} bits = {code_bytes} bytes"
            + f" + 4 bytes for the step = {code_bytes + 4} bytes."
            + "\n\n" + textwrap.fill("Text description of the chart: " + describe_eight_numbers(bits), width=100))
    return text, plot_eight_numbers(bits)


@lru_cache(maxsize=1)
def demo_matrix(side: int = DEMO_SIDE) -> torch.Tensor:
    """A ``side`` x ``side`` matrix of standard normal 'weights' from seed 0 (cached; the global RNG is untouched)."""
    gen = torch.Generator().manual_seed(0)
    return torch.randn(side, side, generator=gen)


def error_view(bits: int = 4, block_size: int | None = None, symmetric: bool = True,
               x: torch.Tensor | None = None) -> tuple[str, Any]:
    """Quantize ``x`` (default: :func:`demo_matrix`) and report average/max error, size incl. overhead, histograms."""
    x = demo_matrix() if x is None else x
    quant.check_tensor(x, check_finite=False)
    if x.numel() > MAX_DEMO_VALUES:
        raise ValueError(f"x must have at most {MAX_DEMO_VALUES:,} values for a live demo, got {x.numel():,}; "
                         "pass a slice")
    if type(block_size) is int and block_size == 0:
        block_size = None  # the dropdown's 'one scale'
    q = quant.quantize(x, bits, block_size, symmetric)
    x_hat = quant.dequantize(q)
    parts = quant.storage(q)
    float_bytes = x.numel() * 4
    text = (f"{q.name}: {x.numel():,} values\n"
            f"average error {quant.mean_abs_error(x, x_hat):.4f}, largest error {quant.max_abs_error(x, x_hat):.4f}\n"
            f"size {parts.total:,} bytes = codes {parts.codes:,} + scales {parts.scales:,}"
            f" + zero-points {parts.zero_points:,}  ({quant.bits_per_weight(q):.3f} bits per value,"
            f" {100 * parts.total / float_bytes:.1f}% of float32)")
    return text, plot_value_histograms(x, x_hat, label=q.name)


# --------------------------------------------------------------------------------------------
# Same model, any format
# --------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def demo_digits() -> tuple[torch.nn.Module, digits.DigitsData]:
    """The course's digits split and the network trained on it with training seed 0 (cached: trained once)."""
    data = digits.load_digits_data()
    return digits.train_digits_mlp(data, seed=0), data


#: Scores already computed, per model (forgotten with the model) and per (data, format, scales).
_SCORES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_scales(scales: object) -> str | int:
    """``scales`` as one of the values of :data:`SCALE_CHOICES`, or a clear TypeError/ValueError."""
    allowed = [value for _, value in SCALE_CHOICES]
    if isinstance(scales, bool) or not isinstance(scales, (str, int)):
        raise TypeError(f"scales must be one of {', '.join(map(repr, allowed))}; got {type(scales).__name__}")
    return checks.choice(scales, "scales", allowed)


def _block_size(scales: str | int) -> int | str | None:
    """The ``block_size`` argument of :func:`digits.model_in_format` for a scale choice."""
    return None if scales == "tensor" else scales


def format_score(model: torch.nn.Module, data: digits.DigitsData, fmt: str,
                 scales: str | int = "tensor") -> digits.FormatScore:
    """Score ``model`` with its Linear weights in ``fmt`` (scales as ``scales`` for int formats); cached.

    The first call for a setting scores it with :func:`course_utils.digits.score_in_format` (a few hundredths
    of a second for the digits network); later calls return the stored result.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(data, digits.DigitsData):
        raise TypeError(f"data must be a DigitsData (from load_digits_data), got {type(data).__name__}")
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be one of {', '.join(digits.FORMATS)}; got {type(fmt).__name__}")
    checks.choice(fmt, "fmt", digits.FORMATS)
    scales = check_scales(scales) if fmt.startswith("int") else "tensor"  # 16-bit floats have no scales
    per_model = _SCORES.setdefault(model, {})
    key = (id(data), fmt, scales)
    if key in per_model and per_model[key][0] is data:
        return per_model[key][1]
    score = digits.score_in_format(model, data, fmt, _block_size(scales))
    per_model[key] = (data, score)
    return score


def _model_and_data(model: torch.nn.Module | None, data: digits.DigitsData | None) -> tuple[Any, Any]:
    """``model`` and ``data`` as given, or the course's trained network (:func:`demo_digits`) for neither."""
    if (model is None) != (data is None):
        raise ValueError("model and data must be given together (or neither, for the course's trained network)")
    return (model, data) if model is not None else demo_digits()


def format_label(fmt: str, scales: str | int = "tensor") -> str:
    """'int4, one scale per row', 'int8, one scale per 64 weights', or just 'bfloat16' for a float format."""
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be one of {', '.join(digits.FORMATS)}; got {type(fmt).__name__}")
    checks.choice(fmt, "fmt", digits.FORMATS)
    if not fmt.startswith("int"):
        return fmt
    return f"{fmt}, {SCALE_LABELS[check_scales(scales)].replace('one per', 'one scale per')}"


def format_view(fmt: str = "int4", scales: str | int = "row", model: torch.nn.Module | None = None,
                data: digits.DigitsData | None = None) -> tuple[str, Any]:
    """The digits network in weight format ``fmt`` next to float32: accuracy, loss and bytes, as text and bars.

    ``scales`` is one of :data:`SCALE_CHOICES`' values ("tensor", "row", 64, 32, 16); it applies to int
    formats only. ``model`` and ``data`` default to :func:`demo_digits`. Results are cached per setting.
    """
    model, data = _model_and_data(model, data)
    base = format_score(model, data, "float32")
    score = format_score(model, data, fmt, scales)
    label = format_label(fmt, scales)
    n_weights = digits.linear_weight_count(model)
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    shapes = " and ".join(f"{m.weight.shape[0]} x {m.weight.shape[1]}" for m in layers)
    width = max(len(label), 9)
    lines = [f"The digits network ({n_weights:,} weights in {len(layers)} Linear layers: {shapes}) in {label}, "
             "next to float32:",
             f"{'':<15}{'float32':>10}   {label:<{width}}",
             f"{'test accuracy':<15}{100 * base.accuracy:>9.1f}%   {f'{100 * score.accuracy:.1f}%':<{width}}"
             f"  ({round(100 * (score.accuracy - base.accuracy), 1) + 0.0:+.1f} points)",
             f"{'test loss':<15}{base.loss:>10.3f}   {f'{score.loss:.3f}':<{width}}"
             f"  ({round(score.loss - base.loss, 3) + 0.0:+.3f})",
             f"{'weight bytes':<15}{base.weight_bytes:>10,}   {f'{score.weight_bytes:,}':<{width}}"
             f"  ({100 * score.weight_bytes / base.weight_bytes:.1f}% of float32)"]
    if fmt.startswith("int"):
        n_scales = score.scale_bytes // quant.SCALE_BYTES
        lines.append(f"The {score.weight_bytes:,} bytes hold {n_weights:,} codes of {digits.FORMAT_BITS[fmt]} bits "
                     f"({score.weight_bytes - score.scale_bytes:,} bytes) and {n_scales:,} float32 scales "
                     f"({score.scale_bytes:,} bytes).")
    elif fmt != "float32":
        lines.append("A 16-bit float rounds each weight on its own: no scales (the scale setting applies to int "
                     "formats only).")
    base_side = ("float32", base.accuracy, base.loss, base.weight_bytes)
    other_side = (label, score.accuracy, score.loss, score.weight_bytes)
    description = describe_format_comparison(base_side, other_side)
    text = "\n".join(lines) + "\n\n" + textwrap.fill("Text description of the chart: " + description, width=100)
    return text, plot_format_comparison(base_side, other_side)


def _show(text: str, fig: Any) -> None:
    from IPython.display import display

    print(text)
    display(fig)
    plt.close(fig)


def eight_numbers_widget() -> Any:
    """A slider for bits (2-8) that redraws the eight-number table and the dot chart."""
    import ipywidgets as w

    from course_utils.lessons.kit import interact_panel

    slider = w.IntSlider(value=4, min=2, max=8, description="bits")
    return interact_panel(lambda bits: _show(*eight_numbers_view(bits)), bits=slider)


def error_widget(x: torch.Tensor | None = None) -> Any:
    """Bits, block size and symmetric/zero-point controls; shows error, size (with overhead) and histograms."""
    import ipywidgets as w

    from course_utils.lessons.kit import interact_panel

    controls = {
        "bits": w.IntSlider(value=4, min=2, max=8, description="bits"),
        "block_size": w.Dropdown(options=list(BLOCK_CHOICES), value=0, description="block size"),
        "symmetric": w.Checkbox(value=True, description="symmetric (no zero-point)"),
    }
    return interact_panel(lambda bits, block_size, symmetric: _show(*error_view(bits, block_size, symmetric, x)),
                          **controls)


def format_widget(model: torch.nn.Module | None = None, data: digits.DigitsData | None = None) -> Any:
    """A weight-format menu and a scales menu (int formats only) that redraw :func:`format_view`."""
    import ipywidgets as w

    from course_utils.lessons.kit import interact_panel

    model, data = _model_and_data(model, data)
    fmt = w.Dropdown(options=list(digits.FORMATS), value="int4", description="format")
    scales = w.Dropdown(options=list(SCALE_CHOICES), value="row", description="scales")

    def on_format(change: dict) -> None:
        scales.disabled = not str(change["new"]).startswith("int")

    fmt.observe(on_format, names="value")
    return interact_panel(lambda fmt, scales: _show(*format_view(fmt, scales, model, data)), fmt=fmt, scales=scales)


# --------------------------------------------------------------------------------------------
# Exercise 1: how many bytes does an int4 matrix with a scale per 64 weights take?
# --------------------------------------------------------------------------------------------
#: The matrix of the exercise: one MLP matrix of a 7-billion-parameter model (hidden 4096, MLP 11008).
BYTES_ROWS, BYTES_COLS = 11008, 4096
#: Its format: int4 codes, one float32 scale per block of 64 weights.
BYTES_BITS, BYTES_BLOCK = 4, 64


def int4_block_bytes() -> int:
    """The exercise's answer: bytes of the matrix in int4 with a float32 scale per 64 weights."""
    return quant.packed_storage(BYTES_ROWS * BYTES_COLS, BYTES_BITS, BYTES_BLOCK).total


def check_int4_block_bytes(answer: Any) -> Feedback:
    """Check the bytes of an 11008 x 4096 matrix in int4 with one float32 scale per block of 64 weights."""
    n = BYTES_ROWS * BYTES_COLS
    parts = quant.packed_storage(n, BYTES_BITS, BYTES_BLOCK)
    blocks = parts.scales // quant.SCALE_BYTES
    as_bytes = "A 4-bit code is half a byte: the codes take weights x 4 / 8 bytes."
    mistakes = [
        (parts.codes, "That is the codes alone: add one 4-byte scale for every block of 64 weights."),
        (n * 4 + parts.scales, "weights x 4 counts bits (or 4 bytes a weight, as in float32). " + as_bytes),
        (n * 4, "weights x 4 counts bits (or 4 bytes a weight, as in float32). " + as_bytes + " Then add the "
                "scales."),
        (n * BYTES_BITS + blocks * 32, "That is the total in bits: divide by 8 to get bytes."),
        (parts.codes + blocks * 2, "The scales are float32: 4 bytes each, not 2."),
        (parts.codes + quant.SCALE_BYTES, "That is one scale for the whole matrix: here every block of 64 weights "
                                          "has its own."),
        (n + parts.scales, "The codes are packed at 4 bits, two to a byte, not one byte each."),
        (parts.total / 1e6, "That is in MB: give the answer in bytes."),
        (parts.total / 2**20, "That is in MiB: give the answer in bytes."),
    ]
    expected = int4_block_bytes()
    feedback = check_number(answer, expected, name="answer_bytes", what="a number of bytes", rel_tol=0, abs_tol=0.5,
                            mistakes=mistakes, unit="bytes",
                            hint="Codes: weights x 4 bits / 8. Scales: (weights / 64) blocks x 4 bytes. Add both.")
    if not feedback.answered or not isinstance(answer, (int, float)) or isinstance(answer, bool):
        return feedback
    if feedback.correct:
        return right(f"answer_bytes = {answer:,.0f} bytes: {parts.codes:,} bytes of codes + {parts.scales:,} bytes "
                     f"of scales, {expected * 8 / n:g} bits per weight.")
    shown = f"{answer:,.0f}" if abs(answer) >= 1000 else f"{answer:g}"
    return Feedback(False, feedback.message.replace(f"{float(answer):g}", shown, 1), feedback.hint)


# --------------------------------------------------------------------------------------------
# Exercise 2: write symmetric int8 quantization with one scale
# --------------------------------------------------------------------------------------------
def int8_cases() -> list[torch.Tensor]:
    """The tensors the int8 exercise is tried on: the notebook's numbers, a negative extreme, random weights."""
    gen = torch.Generator().manual_seed(1)
    return [torch.tensor([0.5, -1.27, 0.02, 1.0]), torch.tensor(quant.EIGHT_WEIGHTS),
            torch.tensor([-2.0, 0.3, 1.1, -0.7]), torch.randn(256, generator=gen)]


def _as_float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):  # a tensor of several values raises RuntimeError
        return None


def _first(t: torch.Tensor, k: int = 4) -> str:
    """The first ``k`` values of ``t`` as '[0.5, -1.27, ...]' (whole numbers without '.0')."""
    values = ", ".join(f"{v:.4g}" for v in t.reshape(-1)[:k].tolist())
    return f"[{values}{', ...' if t.numel() > k else ''}]"


def _slip(x: torch.Tensor, codes: torch.Tensor, scale: float) -> str:
    """The hint for a wrong (codes, scale): which typical slip reproduces it."""
    absmax = float(x.abs().max())  # x: the float32 test tensor; codes: the student's, as float64
    right_scale = absmax / 127
    if abs(scale - right_scale) > 1e-6 * right_scale:
        slips = [(absmax / 128, "int8 keeps the symmetric levels -127..127, so q_max is 127, not 128."),
                 (absmax / 255, "The levels run from -127 to 127: divide max|x| by q_max = 127, not by 255."),
                 (float(x.max()) / 127, "Use the largest absolute value, x.abs().max(): here the extreme is "
                                        "negative."),
                 (127 / absmax, "The scale is max|x| / 127 (the gap between two levels), not its inverse.")]
        for value, hint in slips:
            if abs(scale - value) <= 1e-6 * max(abs(value), 1e-12):
                return hint
        return "The scale is s = max|x| / 127, with max|x| = x.abs().max()."
    x32 = x.to(torch.float32)
    ratio = (x32 / (x32.abs().max() / 127)).to(torch.float64)  # as a student's float32 code computes it
    if torch.equal(codes, ratio.trunc()):
        return "Round to the nearest level with torch.round: .int() or .long() cuts the fraction off instead."
    if torch.equal(codes, ratio.floor()):
        return "Round to the nearest level with torch.round, not floor."
    if not torch.equal(codes, codes.round()):
        return "The codes must be whole numbers: q = torch.round(x / s)."
    return "The codes are q = torch.round(x / s), with the scale s = max|x| / 127."


def check_quantize_int8(fn: Any) -> Feedback:
    """Check ``fn(x) -> (codes, scale)``, symmetric int8 with one scale, against ``quant.quantize(x, 8)``."""
    name = "quantize_int8"
    if is_placeholder(fn):
        return unanswered(name, "your function")
    if not callable(fn):
        return wrong(f"{name} should be a function, got {type(fn).__name__}.", "Write def quantize_int8(x): ...")
    cases = int8_cases()
    for i, x in enumerate(cases, 1):
        try:
            got = fn(x.clone())
        except NotImplementedError:
            return unanswered(name, "your code (the function body still raises NotImplementedError)")
        except Exception as err:  # noqa: BLE001 - a student's bug is reported in one line, never a traceback
            return wrong(f"{name} raised {type(err).__name__} on test tensor {i}: {err}",
                         "Use torch operations on the whole tensor: x.abs().max(), torch.round(x / s).")
        if is_placeholder(got):
            return unanswered(name, "a return statement (the function returns nothing yet)")
        if not isinstance(got, tuple) or len(got) != 2:
            return wrong(f"{name} should return two things, (codes, scale); got {type(got).__name__}.",
                         "End with: return q, s")
        codes, scale = got
        scale = _as_float(scale)
        if scale is None:
            return wrong(f"{name}'s scale should be one number (a float or a one-value tensor) on test tensor {i}.",
                         "One scale for the whole tensor: s = x.abs().max() / 127.")
        if not isinstance(codes, torch.Tensor) or codes.shape != x.shape:
            shape = tuple(codes.shape) if isinstance(codes, torch.Tensor) else type(codes).__name__
            return wrong(f"{name}'s codes should be a tensor of x's shape {tuple(x.shape)}; got {shape}.",
                         "q = torch.round(x / s) keeps the shape of x.")
        expected = quant.quantize(x, 8)
        codes = codes.detach().to(torch.float64)
        want = expected.codes.to(torch.float64)
        scale_ok = abs(scale - float(expected.scales)) <= 1e-6 * float(expected.scales)
        if not scale_ok or not torch.equal(codes, want):
            return wrong(f"on test tensor {i} ({_first(x)}) {name} gives scale {scale:.6g} and codes {_first(codes)};"
                         f" quant.quantize gives scale {float(expected.scales):.6g} and codes {_first(want)}.",
                         _slip(x, codes, scale))
    return right(f"{name} gives the same codes and scale as quant.quantize(x, 8) on all {len(cases)} test tensors.")
