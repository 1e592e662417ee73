"""Live demos for notebook 01: the eight-number table, and error/size/histogram of a quantized matrix.

Each demo is a plain *view* function of plain values that returns ``(text, figure)``; it is unit-tested
without a browser. The ``*_widget`` functions only wire sliders to it.
"""
from __future__ import annotations

import textwrap
from functools import lru_cache
from typing import Any

import torch

from course_utils import quant
from course_utils.plots import plt
from course_utils.plots.quant import describe_eight_numbers, plot_eight_numbers, plot_value_histograms

#: Block sizes the error demo offers; 0 stands for "one scale for the whole matrix".
BLOCK_CHOICES: tuple[tuple[str, int], ...] = (("one scale", 0), ("16", 16), ("32", 32), ("64", 64),
                                              ("128", 128), ("256", 256), ("1024", 1024))
#: Side of the random matrix the error demo quantizes when none is given (1024 x 1024 = 1M values).
DEMO_SIDE = 1024
#: The error demo refuses bigger tensors, so that one redraw stays well under a second.
MAX_DEMO_VALUES = 4 * 1024 * 1024


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
