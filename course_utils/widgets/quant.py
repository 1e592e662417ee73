"""Live demos for notebook 01: the eight-number table, error/size/histogram of a quantized matrix, and the
trained digits network in any weight format ("same model, four formats").

Each demo is a plain *view* function of plain values that returns ``(text, figure)``; it is unit-tested
without a browser. The ``*_widget`` functions only wire sliders to it.
"""
from __future__ import annotations

import textwrap
import weakref
from functools import lru_cache
from typing import Any, NamedTuple

import torch

from course_utils import checks, digits, quant
from course_utils.plots import plt
from course_utils.plots.quant import (describe_eight_numbers, describe_format_comparison, plot_eight_numbers,
                                      plot_format_comparison, plot_value_histograms)

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


class FormatScore(NamedTuple):
    """The digits network in one weight format: test accuracy (0-1), test loss, and its weights' stored bytes."""

    accuracy: float
    loss: float
    weight_bytes: int
    scale_bytes: int


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
                 scales: str | int = "tensor") -> FormatScore:
    """Score ``model`` with its Linear weights in ``fmt`` (scales as ``scales`` for int formats); cached.

    The first call for a setting quantizes and evaluates (a few hundredths of a second for the digits
    network); later calls return the stored result. ``scale_bytes`` is the part of ``weight_bytes`` spent on
    float32 scales (0 for float formats).
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
    converted, size = digits.model_in_format(model, fmt, _block_size(scales))
    accuracy, loss = digits.evaluate(converted, data)
    scale_bytes = 0
    if fmt.startswith("int"):
        for layer in (m for m in model.modules() if isinstance(m, torch.nn.Linear)):
            block = layer.weight.shape[1] if scales == "row" else _block_size(scales)
            scale_bytes += quant.packed_storage(layer.weight.numel(), digits.FORMAT_BITS[fmt], block).scales
    score = FormatScore(accuracy, loss, size, scale_bytes)
    per_model[key] = (data, score)
    return score


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
    if (model is None) != (data is None):
        raise ValueError("model and data must be given together (or neither, for the course's trained network)")
    if model is None:
        model, data = demo_digits()
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

    from course_utils.widgets import interact_panel

    slider = w.IntSlider(value=4, min=2, max=8, description="bits")
    return interact_panel(lambda bits: _show(*eight_numbers_view(bits)), bits=slider)


def error_widget(x: torch.Tensor | None = None) -> Any:
    """Bits, block size and symmetric/zero-point controls; shows error, size (with overhead) and histograms."""
    import ipywidgets as w

    from course_utils.widgets import interact_panel

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

    from course_utils.widgets import interact_panel

    if (model is None) != (data is None):
        raise ValueError("model and data must be given together (or neither, for the course's trained network)")
    if model is None:
        model, data = demo_digits()
    fmt = w.Dropdown(options=list(digits.FORMATS), value="int4", description="format")
    scales = w.Dropdown(options=list(SCALE_CHOICES), value="row", description="scales")

    def on_format(change: dict) -> None:
        scales.disabled = not str(change["new"]).startswith("int")

    fmt.observe(on_format, names="value")
    return interact_panel(lambda fmt, scales: _show(*format_view(fmt, scales, model, data)), fmt=fmt, scales=scales)
