"""Notebook 05 (memory tricks): its charts, the "what is my bottleneck?" planner and the exercises.

The numbers come from :mod:`course_utils.step_memory`, :mod:`course_utils.bottleneck` and
:mod:`course_utils.tricks`; this module draws and wires. It draws with 04's charts and controls
(:mod:`course_utils.lessons.memory_budget`): the estimate against the measured peak, the step against a budget,
the step planner's controls. Nothing here imports torch.
"""
from __future__ import annotations

from typing import Any

from course_utils import checks, datasheets, memory
from course_utils.architecture import Architecture
from course_utils.bottleneck import arithmetic_time_factor
from course_utils.configs import config_presets
from course_utils.lessons.kit import Feedback, check_choice, check_number, finish, interact_panel, plt
from course_utils.lessons.memory_budget import plot_estimate_vs_measured as plot_estimate_vs_measured
from course_utils.lessons.memory_budget import KIND_COLORS, plot_step_against_budgets, step_controls
from course_utils.lessons.memory_budget import timeline_chart as timeline_chart
from course_utils.lessons.memory_budget import timeline_text as timeline_text
from course_utils.step_memory import estimate_step, saved_activations
from course_utils.timeline import KINDS, Timeline, tensor_total
from course_utils.units import GB


#: The GPU memories the planner offers, in GB (each judged against its usable memory, less the CUDA context).
BUDGETS = (8.0, 16.0, 24.0, 40.0, 80.0)


def bottleneck_view(config: str = "smollm2-135m", method: str = "full", batch: int = 8, seq: int = 512,
                    budget_gb: float = 16.0, checkpointing: bool = False, optimizer: str = "adamw",
                    show_chart: bool = True, limit: int = 3) -> str:
    """The planner's callback: print and return the diagnosis; draw the predicted peak against the budget's usable
    memory (with 04's chart). ``budget_gb`` is the GPU's memory; usable is that less the 0.5 GB CUDA context, and a
    step fits up to 90 % of it (:func:`course_utils.memory.step_verdict`). ``config`` is a shipped preset; bounded:
    ``batch`` 1-256 and ``seq`` up to 8192, so a click cannot ask for an absurd estimate.
    """
    from course_utils.bottleneck import what_is_my_bottleneck

    checks.choice(config, "config", config_presets())
    checks.choice(method, "method", memory.METHODS)
    checks.integer(batch, "batch", 1, 256)
    checks.integer(seq, "seq", 1, 8192)
    diag = what_is_my_bottleneck(config, method, batch, budget_gb, seq=seq, checkpointing=checkpointing,
                                 optimizer=optimizer, device="cuda")
    text = diag.text(limit)
    print(text)
    if show_chart:
        plot_step_against_budgets(diag.estimate, [memory.Budget(f"GPU {budget_gb:g} GB", budget_gb)])
        plt.show()
    return text


def bottleneck_planner() -> Any:
    """The widget: 04's step controls and a budget, wired to :func:`bottleneck_view` (GPU allocator view)."""
    import ipywidgets as w

    controls = step_controls("smollm2-135m", "full", 8, 512, False, "adamw", methods=memory.METHODS)
    controls["budget_gb"] = w.Dropdown(options=BUDGETS, value=16.0, description="GB")
    return interact_panel(bottleneck_view, **controls)


#: Exercise 1: SmolLM2-135M, full fine-tuning in float32, batch 8 x 512 tokens, with gradient checkpointing.
_CHECKPOINT_CASE = {"config": "smollm2-135m", "batch": 8, "seq": 512}
#: Exercise 2: 8-bit AdamW for SmolLM2-135M with every number trained (full fine-tuning).
_ADAMW8BIT_CASE = {"config": "smollm2-135m"}
#: Exercise 3: Kwame's step - Qwen2.5-1.5B, full fine-tuning, batch 8 x 512 tokens, on a 24 GB GPU.
_KWAME_CASE = {"config": "qwen2.5-1.5b-instruct", "method": "full", "batch": 8, "seq": 512, "budget_gb": 24.0}
#: Exercise 3's choices, each as the change it makes to :func:`~course_utils.step_memory.estimate_step`'s arguments.
_KWAME_OPTIONS: dict[str, dict[str, Any]] = {
    "checkpointing": {"checkpointing": True},
    "8-bit AdamW": {"optimizer": "adamw8bit"},
    "bf16 autocast": {"autocast": True},
    "accumulation": {"batch": 1, "accumulation": 8},
    "checkpointing + 8-bit AdamW": {"checkpointing": True, "optimizer": "adamw8bit"},
}


def check_checkpointed_inputs(kept_gb: Any) -> Feedback:
    """Exercise 1: the GB of layer inputs that gradient checkpointing keeps for SmolLM2 at batch 8 x 512."""
    arch = Architecture.from_config(_CHECKPOINT_CASE["config"])
    batch, seq = _CHECKPOINT_CASE["batch"], _CHECKPOINT_CASE["seq"]
    # the answer: each layer's float32 input, as the estimator counts it
    kept = saved_activations(arch, batch, seq, method="full", checkpointing=True)
    expected = kept.by_kind["checkpointed layer inputs"] / GB
    without = saved_activations(arch, batch, seq, method="full").total / GB
    mistakes = [
        (expected / 4, "That is the count of numbers (in billions); each float32 number takes 4 bytes."),
        (expected / 2, "Full fine-tuning here runs in float32: 4 bytes per number, not 2."),
        (expected / arch.layers, f"That is one layer's input; checkpointing keeps the input of each of the "
                                 f"{arch.layers} layers."),
        (without, "That is everything the layers save *without* checkpointing; with it, each layer keeps only "
                  "its input (batch x tokens x hidden numbers)."),
    ]
    return check_number(kept_gb, expected, name="kept_gb", what="the GB of layer inputs checkpointing keeps",
                        mistakes=mistakes, unit="GB",
                        hint="Per layer: batch x tokens x hidden size numbers, 4 bytes each; then times the layers.")


def check_adamw8bit_state(state_gb: Any) -> Feedback:
    """Exercise 2: the GB of optimizer states 8-bit AdamW keeps for SmolLM2-135M, every number trained."""
    n = Architecture.from_config(_ADAMW8BIT_CASE["config"]).params
    # the answer, from the estimator (small tensors stay float32 there)
    expected = estimate_step(_ADAMW8BIT_CASE["config"], method="full", optimizer="adamw8bit", batch=1, seq=1,
                             device="cuda").optimizer_bytes / GB
    mistakes = [
        (8 * n / GB, "That is AdamW in float32 (2 states x 4 bytes); 8-bit AdamW keeps 1 byte per state."),
        (2 * n / GB, "Close: 2 states x 1 byte is right, but each state also keeps one float32 scale per block "
                     "of 256 numbers."),
        (n / GB, "AdamW keeps two states per trained number (the running mean and the running square)."),
        (4 * n / GB, "Each 8-bit state takes 1 byte per number, not 2."),
        (6 * n / GB, "That is roughly what 8-bit AdamW *saves* (8 - 2 bytes per number); the question asks what "
                     "it keeps."),
    ]
    # tight tolerance: forgetting the block scales is only 1.6 % off
    return check_number(state_gb, expected, name="state_gb", what="the GB of 8-bit AdamW states",
                        rel_tol=0.005, mistakes=mistakes, unit="GB",
                        hint="Per trained number: 2 states x 1 byte, plus 2 x 4 bytes for every block of 256 numbers.")


def kwame_estimates_gb() -> dict[str, float]:
    """Exercise 3: the estimated peak (GB, GPU allocator counter) of Kwame's step with each choice."""
    case = {k: v for k, v in _KWAME_CASE.items() if k not in ("config", "budget_gb")}
    return {name: estimate_step(_KWAME_CASE["config"], device="cuda", **{**case, **change}).peak_gb
            for name, change in _KWAME_OPTIONS.items()}


def check_kwame_choice(choice: Any) -> Feedback:
    """Exercise 3: which one change fits Kwame's full fine-tuning of Qwen2.5-1.5B into 24 GB (usable 23.5 GB)."""
    gb = kwame_estimates_gb()
    usable = datasheets.usable_gb(_KWAME_CASE["budget_gb"])
    left = {
        "checkpointing": "the AdamW states, the weights and, at the optimizer step, all gradients stay",
        "8-bit AdamW": "the activations saved for backward are the biggest part, and they stay",
        "bf16 autocast": "activations shrink to 2 bytes, but autocast adds a 16-bit copy of every weight and "
                         "the states stay",
        "accumulation": "the activations shrink, but the AdamW states, the weights and the gradients stay",
    }
    hints = {name: f"{name[0].upper() + name[1:]} alone: estimated {gb[name]:.1f} GB, still over the usable "
                   f"{usable:g} GB - {why}. The two biggest parts need two tricks." for name, why in left.items()}
    # the one that fits, at most 90 % of usable (a test holds it to one, and every other over usable)
    answer = next(name for name, peak in gb.items() if memory.step_verdict(peak, usable) == "fits")
    slower = arithmetic_time_factor("full", "full", False, True)
    return check_choice(choice, answer, name="choice", options=tuple(_KWAME_OPTIONS), hints=hints,
                        why=f"Estimated {gb[answer]:.1f} GB, {100 * gb[answer] / usable:.0f} % of the usable "
                            f"{usable:g} GB: checkpointing removes the saved activations, 8-bit AdamW shrinks the "
                            f"states; about {slower:.2f}x the time (one extra forward).")


#: The tricks of the small multiples, by their keys in course_utils.tricks.TRICKS.
TIMELINE_TRICKS = ("baseline", "checkpointing", "adamw8bit", "accumulation")


def trick_timelines(config: Any, base: dict[str, Any], device: Any = "cpu") -> dict[str, Timeline]:
    """The predicted timeline of the step ``base`` with each of :data:`TIMELINE_TRICKS`, by the trick's label."""
    from course_utils import tricks
    from course_utils.timeline import predicted_timeline

    return {tricks.TRICKS[key].label: predicted_timeline(tricks.estimate_step_for(tricks.trick_kwargs(key, base),
                                                                                  config, device))
            for key in TIMELINE_TRICKS}


def timeline_grid(timelines: dict[str, Timeline]) -> Any:
    """Small multiples: one predicted timeline per trick, on the same y scale, each peak marked."""
    fig, axes = plt.subplots(1, len(timelines), figsize=(3.0 * len(timelines), 2.8), sharey=True)
    for ax, (label, tl) in zip(axes, timelines.items()):
        kinds = [k for k in KINDS if k != "framework" and tl.kind_max(k) > 0]
        xs = list(range(len(tl.points)))
        ax.stackplot(xs, [[p.by_kind.get(k, 0) / GB for p in tl.points] for k in kinds], step="post",
                     colors=[KIND_COLORS[k] for k in kinds], labels=kinds, alpha=0.85)
        peak = tl.points.index(tl.peak)
        ax.plot(peak, tensor_total(tl.peak) / GB, "x", color="black")
        ax.set(title=label, xlabel=f"moments (peak: {tl.peak.phase})")
    axes[0].set_ylabel("GB of tensors (predicted)")
    return finish(fig, axes[-1], fontsize=7, loc="upper right")


def timeline_grid_text(timelines: dict[str, Timeline]) -> str:
    """The small multiples' text description: each trick's peak, its phase, and what each kind reaches."""
    lines = ["Text description of the chart. One panel per trick, the step's predicted memory over its moments, "
             "stacked by kind; x marks each peak."]
    for label, tl in timelines.items():
        kinds = ", ".join(f"{k} {tl.kind_max(k) / GB:.2f}" for k in ("activations", "optimizer states", "gradients"))
        lines.append(f"{label}: peak {tensor_total(tl.peak) / GB:.2f} GB ({tl.peak.phase}); most {kinds} GB.")
    return "\n".join(lines)
