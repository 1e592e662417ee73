"""Interactive controls for live demos: one submodule per topic (``widgets.quant``, ...).

Rule for every widget here: the work is done by a plain function of plain values (a *callback*)
that returns text or a figure, so it can be unit-tested without a browser; the widget only wires
sliders to it. ipywidgets is imported lazily, so the rest of course_utils works without it.
"""
from __future__ import annotations

from typing import Any, Callable


def interact_panel(callback: Callable[..., Any], **controls: Any) -> Any:
    """Wire ``controls`` (ipywidgets) to ``callback`` and return a box with the controls above its output.

    Uses ``ipywidgets.interactive_output``: the callback's printed text and figures appear in the output
    area and are redrawn whenever a control changes. The initial call happens here, once.
    """
    import ipywidgets as w

    out = w.interactive_output(callback, controls)
    return w.VBox([w.HBox(list(controls.values())), out])
