"""The "what is my bottleneck?" planner: pick a model, a method, a batch and a budget; see what does not fit."""
from __future__ import annotations

from typing import Any

from course_utils.widgets import interact_panel

PRESETS = ("smollm2-135m", "qwen2.5-1.5b-instruct", "qwen3-4b-instruct-2507")
SEQS = (128, 256, 512, 1024, 2048, 4096)
BUDGETS = (8.0, 16.0, 24.0, 40.0, 80.0)


def bottleneck_view(model: str = "smollm2-135m", method: str = "full", batch: int = 8, seq: int = 512,
                    budget_gb: float = 16.0, checkpointing: bool = False, optimizer: str = "adamw",
                    show_chart: bool = True) -> str:
    """The planner's callback: print and return the diagnosis; draw the breakdown of the predicted peak.

    Bounded: ``batch`` 1-256 and ``seq`` up to 8192, so a click cannot ask for an absurd estimate.
    """
    from course_utils.bottleneck import what_is_my_bottleneck

    if model not in PRESETS:
        raise ValueError(f"model must be one of {', '.join(PRESETS)}; got {model!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 256:
        raise ValueError(f"batch must be an integer from 1 to 256, got {batch!r}")
    if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= 8192:
        raise ValueError(f"seq must be an integer from 1 to 8192, got {seq!r}")
    diag = what_is_my_bottleneck(model, method, batch, budget_gb, seq=seq, checkpointing=checkpointing,
                                 optimizer=optimizer, device="cuda")
    text = diag.text()
    print(text)
    if show_chart:
        import matplotlib.pyplot as plt

        from course_utils.plots.tricks import breakdown_chart

        breakdown_chart(diag.estimate, budget_gb)
        plt.show()
    return text


def bottleneck_planner() -> Any:
    """The widget: dropdowns and sliders wired to :func:`bottleneck_view` (GPU allocator view, no baseline)."""
    import ipywidgets as w

    controls = {
        "model": w.Dropdown(options=PRESETS, value="smollm2-135m", description="model"),
        "method": w.Dropdown(options=("full", "lora", "lora-bf16", "qlora"), value="full", description="method"),
        "batch": w.IntSlider(value=8, min=1, max=64, description="batch"),
        "seq": w.Dropdown(options=SEQS, value=512, description="seq"),
        "budget_gb": w.Dropdown(options=BUDGETS, value=16.0, description="GB"),
        "checkpointing": w.Checkbox(value=False, description="checkpointing"),
        "optimizer": w.Dropdown(options=("adamw", "adamw8bit"), value="adamw", description="optimizer"),
    }

    def callback(**values: Any) -> None:
        bottleneck_view(**values)

    return interact_panel(callback, **controls)
