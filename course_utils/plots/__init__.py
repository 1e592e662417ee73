"""Charts for the notebooks: one submodule per topic (``plots.quant``, ``plots.precision``, ...).

Shared conventions live here so every chart looks alike: a title, labelled axes, and a short
text description that the notebook prints under the chart for readers who cannot see it.
"""
from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.rcParams.update({"figure.dpi": 100, "axes.spines.top": False, "axes.spines.right": False,
                            "axes.grid": True, "grid.alpha": 0.3, "font.size": 10})

import matplotlib.pyplot as plt  # noqa: E402 - after the style settings above, which it reads

#: Colours used across the module, so a format keeps its colour from one chart to the next.
COLORS = {"float32": "#4C72B0", "bfloat16": "#55A868", "float16": "#C44E52", "int8": "#8172B2",
          "int4": "#CCB974", "nf4": "#64B5CD", "estimate": "#4C72B0", "measured": "#DD8452"}


def new_figure(title: str, xlabel: str, ylabel: str, figsize: tuple[float, float] = (7.0, 3.6)) -> tuple[Any, Any]:
    """A figure with one axes, titled and labelled. Returns ``(fig, ax)``."""
    for name, value in (("title", title), ("xlabel", xlabel), ("ylabel", ylabel)):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name} must be a non-empty string: every chart is titled and labelled")
    fig, ax = plt.subplots(figsize=figsize)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return fig, ax
