"""Live demos for the mixed-precision notebook.

Each widget wires controls to a plain callback that prints text made by :mod:`course_utils.precision`;
the callbacks are unit-tested without a browser. Sizes and ranges are bounded so nothing can hang.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from course_utils import checks, hardware, precision
from course_utils.widgets import interact_panel

#: Formats offered by the dropdowns, in the lesson's order.
DTYPE_OPTIONS = ("float32", "bfloat16", "float16")


def tiny_update_view(dtype: str, update: float, w: float = 1.0) -> None:
    """Print one step ``w - update`` in ``dtype`` next to float32 (the callback of :func:`tiny_update_widget`)."""
    print(precision.update_report(dtype, update, w))


def tiny_update_widget(update: float = 1e-4) -> Any:
    """A dtype dropdown and a log slider for ``lr * grad`` (1e-9 .. 1e-1): does the update survive?"""
    import ipywidgets as w

    update = checks.number(update, "update", 1e-9, 1e-1)
    dtype = w.Dropdown(options=DTYPE_OPTIONS, value="bfloat16", description="weight in")
    slider = w.FloatLogSlider(value=update, base=10, min=-9, max=-1, step=0.05, description="lr × grad",
                              readout_format=".2e", continuous_update=True)
    return interact_panel(tiny_update_view, dtype=dtype, update=slider)


def matmul_sizes(device: torch.device | str | None = None) -> tuple[int, ...]:
    """Matrix sides the size slider offers: 256 .. 4096 on a CPU, 256 .. 8192 on a GPU."""
    top = 8192 if hardware.as_device(device).type == "cuda" else precision.MAX_CPU_WIDGET_SIZE
    sizes, n = [], 256
    while n <= top:
        sizes.append(n)
        n *= 2
    return tuple(sizes)


def matmul_view(dtype: str, size: int, device: str | None = None) -> None:
    """Print float32 and ``dtype`` matmul timings at ``size`` (the callback of :func:`matmul_widget`)."""
    print(precision.matmul_report(size, dtype, device))


def matmul_widget(size: int | None = None, device: torch.device | str | None = None) -> Any:
    """A dtype dropdown and a size slider; each change times one float32 and one 16-bit matmul.

    The slider updates on release only (each move starts real timings). It starts at the side where all three
    formats are timed (:func:`course_utils.precision.all_formats_size`). On a CPU, float16 above
    :data:`course_utils.precision.CPU_FLOAT16_MAX_SIZE` prints why it is not timed instead of running for minutes.
    """
    import ipywidgets as w

    dev = hardware.as_device(device)
    sizes = matmul_sizes(dev)
    size = precision.all_formats_size(dev) if size is None else size
    if size not in sizes:
        raise ValueError(f"size must be one of {sizes}, got {size!r}")
    dtype = w.Dropdown(options=DTYPE_OPTIONS, value=dtype_name_16(dev), description="16-bit type")
    slider = w.SelectionSlider(options=sizes, value=size, description="matrix side", continuous_update=False)
    return interact_panel(functools.partial(matmul_view, device=str(dev)), dtype=dtype, size=slider)


def dtype_name_16(device: torch.device | str | None = None) -> str:
    """Name of the lesson's 16-bit dtype on ``device`` (the dropdown's starting value)."""
    return precision.dtype_name(hardware.autocast_dtype(device))
