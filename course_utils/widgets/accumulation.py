"""Live demo: pick a micro-batch size for a batch of 64 and see steps, gradient, memory and time."""
from __future__ import annotations

from functools import partial
from typing import Any, Sequence

from ..accumulation import MicroBatchRow, micro_batch_summary
from . import interact_panel


def show_micro_batch(micro_batch_size: int, rows: Sequence[MicroBatchRow], budget_bytes: int | None = None) -> Any:
    """The widget's callback: print the summary for one micro-batch size and draw the sweep chart.

    ``rows`` come from :func:`course_utils.accumulation.sweep_micro_batches` (measured once, so moving the
    slider is instant). Returns the figure (also shown).
    """
    from ..plots import plt
    from ..plots.accumulation import plot_micro_batch_sweep

    print(micro_batch_summary(rows, micro_batch_size, budget_bytes))
    fig = plot_micro_batch_sweep(rows, highlight=micro_batch_size, budget_bytes=budget_bytes)
    plt.show()
    return fig


def micro_batch_widget(rows: Sequence[MicroBatchRow], budget_bytes: int | None = None, value: int = 16) -> Any:
    """A slider over the measured micro-batch sizes wired to :func:`show_micro_batch`."""
    import ipywidgets as w

    sizes = [r.micro_batch_size for r in rows]
    if value not in sizes:
        raise ValueError(f"value must be one of the measured sizes {sizes}, got {value!r}")
    slider = w.SelectionSlider(options=sizes, value=value, description="micro-batch",
                               continuous_update=False, style={"description_width": "initial"})
    return interact_panel(partial(show_micro_batch, rows=rows, budget_bytes=budget_bytes), micro_batch_size=slider)
