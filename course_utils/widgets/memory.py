"""The budget planner of notebook 04: model, method, LoRA rank and budget -> estimate, fits or not, and a bar.

:func:`plan` does the work (plain values in, text and numbers out) and :func:`planner_view` draws it; both
are unit-tested. :func:`budget_planner` only wires ipywidgets controls to :func:`planner_view`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from course_utils import checks
from course_utils import memory as mem
from course_utils.units import GB

#: Custom size: the parameter count comes from the 'billions' control.
CUSTOM = "custom size (billions of parameters)"
#: The planner's models: the shipped configs (exact counts) and the lesson's round sizes (assumed adapter share).
PRESET_CONFIGS = {"SmolLM2-135M (config)": "smollm2-135m", "Qwen2.5-1.5B (config)": "qwen2.5-1.5b-instruct",
                  "Qwen3-4B (config)": "qwen3-4b-instruct-2507"}
ROUND_SIZES = {"a 1.7B model": 1.7, "a 7B model": 7.0, "a 70B model": 70.0}
MODEL_CHOICES: tuple[str, ...] = (*PRESET_CONFIGS, *ROUND_SIZES, CUSTOM)
#: Bounds of the controls (and of :func:`plan`'s arguments).
MAX_BILLIONS = 1000.0
MAX_RANK = 1024
MAX_BUDGET_GB = mem.MAX_BUDGET_GB


@dataclass(frozen=True)
class Plan:
    """The planner's answer: the estimate, the budget, whether it fits, and a sentence saying so."""

    estimate: mem.MemoryEstimate
    budget_gb: float
    fits: bool
    text: str


def plan(model: str, billions: float, method: str, lora_rank: int, budget_gb: float) -> Plan:
    """Estimate ``method`` on ``model`` at ``lora_rank`` against ``budget_gb`` GB.

    ``model`` is one of :data:`MODEL_CHOICES`; ``billions`` is used only for :data:`CUSTOM`; ``method`` one of
    :data:`course_utils.memory.ALL_METHODS`. Configs give exact counts (LoRA on q_proj and v_proj); round sizes and
    custom sizes assume the lesson's 0.34 % adapter share.
    """
    checks.choice(model, "model", MODEL_CHOICES)
    checks.choice(method, "method", mem.ALL_METHODS)
    checks.integer(lora_rank, "lora_rank", 1, MAX_RANK)
    checks.positive(billions, "billions", MAX_BILLIONS)
    mem.check_budget(budget_gb)

    if model in PRESET_CONFIGS:
        size = mem.model_from_config(PRESET_CONFIGS[model], lora_rank, name=model.replace(" (config)", ""))
        est = mem.estimate_model(size, method, lora_rank)
    else:
        params = (ROUND_SIZES[model] if model in ROUND_SIZES else billions) * 1e9
        name = model if model in ROUND_SIZES else mem.size_name(int(round(params)))
        est = mem.estimate(params, method, lora_rank=lora_rank, name=name)

    usable = mem.usable_gb(budget_gb)
    ok = est.fits(budget_gb)
    pg = est.parts_gb()
    if mem.ALL_METHODS[method].trains_all:
        trained = f"trains all {est.params:,} parameters"
    else:
        how = "assumed: 0.34% of the model x rank/8" if est.adapter_assumed else "counted from the config"
        trained = f"LoRA rank {lora_rank} trains {est.trained:,.0f} numbers ({how})"
    text = (f"{est.model}, {est.label}: {trained}.\n"
            f"Estimate: {est.gb:.2f} GB = weights {_gb(pg['weights'])} + gradients {_gb(pg['gradients'])} "
            f"+ AdamW states {_gb(pg['AdamW states'])} GB (activations not included).\n"
            f"Budget {budget_gb:g} GB, usable 70% = {usable:g} GB: {'FITS' if ok else 'does NOT fit'} "
            f"(the estimate is {100 * est.gb / usable:.0f}% of the usable part).")
    return Plan(est, float(budget_gb), ok, text)


def method_options() -> list[tuple[str, str]]:
    """The planners' method menu, (label, key): the table's four, then the extras such as full fine-tuning in bf16."""
    return [(m.label, k) for k, m in mem.ALL_METHODS.items()]


def _gb(value: float) -> str:
    """GB with two decimals, or four when the part is below 0.01 GB (so small parts do not read as zero)."""
    return f"{value:.2f}" if value >= 0.01 else f"{value:.4f}"


def planner_view(model: str, billions: float, method: str, lora_rank: int, budget_gb: float) -> Any:
    """The widget's callback: print the plan's text and draw its stacked bar. Returns the figure."""
    import matplotlib.pyplot as plt

    from course_utils.plots.memory import plot_breakdown

    result = plan(model, billions, method, lora_rank, budget_gb)
    print(result.text)
    fig = plot_breakdown(result.estimate, budget_gb)
    plt.show()
    return fig


def budget_planner(model: str = "a 7B model", method: str = "lora-bf16", lora_rank: int = 8,
                   budget_gb: float = 16.0, billions: float = 7.0) -> Any:
    """The budget-planner widget: pick a model, a method, a LoRA rank and a budget; see the estimate."""
    import ipywidgets as w

    plan(model, billions, method, lora_rank, budget_gb)  # bad defaults fail here, with a clear message
    style = {"description_width": "initial"}
    controls = {
        "model": w.Dropdown(options=list(MODEL_CHOICES), value=model, description="model", style=style),
        "billions": w.FloatLogSlider(value=billions, base=10, min=-1, max=3, step=0.05,
                                     description="custom size (B)", style=style, continuous_update=False),
        "method": w.Dropdown(options=method_options(), value=method,
                             description="method", style=style),
        "lora_rank": w.Dropdown(options=[1, 2, 4, 8, 16, 32, 64, 128], value=lora_rank, description="LoRA rank",
                                style=style),
        "budget_gb": w.FloatSlider(value=budget_gb, min=2, max=160, step=2, description="memory (GB)",
                                   style=style, continuous_update=False),
    }
    # Moving the size slider means "plan for this size": switch the model to the custom size, so the
    # slider never looks dead while a preset is selected.
    controls["billions"].observe(lambda _change: setattr(controls["model"], "value", CUSTOM), names="value")
    out = w.interactive_output(planner_view, controls)
    rows = [w.HBox([controls["model"], controls["billions"]]),
            w.HBox([controls["method"], controls["lora_rank"], controls["budget_gb"]])]
    return w.VBox([*rows, out])


# --------------------------------------------------------------------------------------------
# The whole-step planner: the step estimate (activations included) against GPU budgets
# --------------------------------------------------------------------------------------------
#: The GPUs the step planner budgets against by default (names from the datasheet table; each budgeted at what a
#: process can use there, :func:`course_utils.memory.gpu_budget`: a T4 at 15.33 GB).
STEP_GPUS = ("T4", "L4", "A100-40GB", "H100")


@dataclass(frozen=True)
class StepPlan:
    """The step planner's answer: the estimate, the budgets, and the text under the bar."""

    estimate: Any
    budgets: tuple[mem.Budget, ...]
    text: str


def step_plan(config: str = "smollm2-135m", method: str = "lora", batch: int = 8, seq: int = 512,
              checkpointing: bool = False, optimizer: str = "adamw", gpus: tuple[str, ...] = STEP_GPUS) -> StepPlan:
    """Estimate one training step on a GPU (allocator counter) and say which of ``gpus`` it fits.

    ``config`` is a shipped preset, a ``config.json`` path or a dict; ``method`` one of
    :data:`course_utils.memory.ALL_METHODS` (``full-bf16`` included); every other argument is checked by
    :func:`course_utils.step_memory.estimate_step`. The text lists the five parts and one line per GPU, whose
    budget is what a process can use there (no 70 % rule: this estimate includes the activations).
    """
    from course_utils.step_memory import estimate_step

    checks.flag(checkpointing, "checkpointing")
    est = estimate_step(config, method=method, batch=batch, seq=seq, checkpointing=checkpointing,
                        optimizer=optimizer, device="cuda")
    budgets = tuple(mem.gpu_budget(g) for g in gpus)
    parts = ", ".join(f"{k} {v / GB:.2f}" for k, v in est.categories().items())
    lines = [f"{est.describe()}: predicted peak {est.peak_gb:.2f} GB on a GPU ({parts} GB).",
             f"Peak moment: {est.peak_moment}."]
    lines += [f"  {b.label}: {'fits' if est.peak_gb <= b.gb else 'does NOT fit'}"
              f" ({100 * est.peak_gb / b.gb:.0f} % of it)" for b in budgets]
    return StepPlan(est, budgets, "\n".join(lines))


def step_planner_view(config: str, method: str, batch: int, seq: int, checkpointing: bool, optimizer: str) -> Any:
    """The step planner's callback: print the plan and draw the stacked bar against each GPU. Returns the figure."""
    import matplotlib.pyplot as plt

    from course_utils.plots.memory import plot_step_against_budgets

    result = step_plan(config, method, batch, seq, checkpointing, optimizer)
    print(result.text)
    fig = plot_step_against_budgets(result.estimate, result.budgets)
    plt.show()
    return fig


def step_planner(config: str = "qwen2.5-1.5b-instruct", method: str = "lora", batch: int = 8, seq: int = 1024,
                 checkpointing: bool = False, optimizer: str = "adamw") -> Any:
    """The whole-step planner widget: model, method, batch, sequence length, checkpointing, optimizer."""
    import ipywidgets as w

    from course_utils.configs import config_presets

    step_plan(config, method, batch, seq, checkpointing, optimizer)  # bad defaults fail here, clearly
    style = {"description_width": "initial"}
    controls = {
        "config": w.Dropdown(options=list(config_presets()), value=config, description="model", style=style),
        "method": w.Dropdown(options=method_options(), value=method,
                             description="method", style=style),
        "batch": w.Dropdown(options=[1, 2, 4, 8, 16, 32, 64], value=batch, description="batch", style=style),
        "seq": w.Dropdown(options=[128, 256, 512, 1024, 2048, 4096], value=seq, description="tokens", style=style),
        "checkpointing": w.Checkbox(value=checkpointing, description="gradient checkpointing"),
        "optimizer": w.Dropdown(options=[("AdamW", "adamw"), ("8-bit AdamW", "adamw8bit")], value=optimizer,
                                description="optimizer", style=style),
    }
    out = w.interactive_output(step_planner_view, controls)
    rows = [w.HBox([controls["config"], controls["method"]]),
            w.HBox([controls["batch"], controls["seq"], controls["optimizer"], controls["checkpointing"]])]
    return w.VBox([*rows, out])
