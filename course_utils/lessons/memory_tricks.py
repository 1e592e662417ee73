"""Notebook 05 (memory tricks): its charts, the "what is my bottleneck?" planner and the exercises.

The numbers come from :mod:`course_utils.step_memory`, :mod:`course_utils.bottleneck` and
:mod:`course_utils.tricks`; this module draws and wires. Nothing here imports torch.
"""
from __future__ import annotations

from typing import Any, Sequence

from course_utils import checks, memory
from course_utils.architecture import Architecture
from course_utils.bottleneck import arithmetic_time_factor
from course_utils.configs import config_presets
from course_utils.lessons.kit import COLORS, Feedback, check_choice, check_number, interact_panel, new_figure, plt
from course_utils.step_memory import estimate_step, saved_activations
from course_utils.units import GB

#: Colours of the parts of a training step's memory.
PART_COLORS = ["#8C8C8C", "#4C72B0", "#8172B2", "#55A868", "#DD8452", "#C44E52", "#CCB974", "#64B5CD"]


def tricks_chart(rows: Sequence[Any]) -> Any:
    """Two panels: measured peak memory (GB) and step time (s) per trick. ``rows``: TrickResult objects.

    Skipped tricks are drawn as an empty bar labelled "skipped".
    """
    if not rows:
        raise ValueError("rows must contain at least one measured trick")
    labels = [r.label for r in rows]
    fig, (ax_m, ax_t) = plt.subplots(1, 2, figsize=(10, 0.5 * len(rows) + 1.6), sharey=True)
    fig.suptitle("One training step per trick, measured on this machine")
    y = list(range(len(rows)))
    for ax, attr, xlabel, color in ((ax_m, "peak_bytes", "peak memory (GB)", COLORS["measured"]),
                                    (ax_t, "step_seconds", "step time (s)", COLORS["estimate"])):
        values = [getattr(r, attr) for r in rows]
        shown = [0 if v is None else (v / GB if attr == "peak_bytes" else v) for v in values]
        ax.barh(y, shown, color=color)
        for yi, v, raw in zip(y, shown, values):
            ax.text(v, yi, " skipped" if raw is None else f" {v:.2f}", va="center", fontsize=8)
        ax.set_xlabel(xlabel)
        ax.set_title(xlabel.split(" (")[0].capitalize())
        ax.margins(x=0.25)
    ax_m.set_yticks(y, labels)
    ax_m.set_ylabel("trick")
    ax_m.invert_yaxis()
    fig.tight_layout()
    return fig


def describe_tricks_chart(rows: Sequence[Any]) -> str:
    """Text description of :func:`tricks_chart` for readers who cannot see it."""
    parts = []
    for r in rows:
        if r.peak_bytes is None:
            parts.append(f"{r.label}: skipped")
        else:
            parts.append(f"{r.label}: {r.peak_bytes / GB:.2f} GB, {r.step_seconds:.2f} s")
    return ("Two bar charts side by side, one bar per trick; left: measured peak memory in GB, right: measured "
            "time of one training step in seconds. " + "; ".join(parts) + ".")


def estimate_vs_measured_chart(cases: Sequence[tuple[str, float, float | None]],
                               title: str = "Predicted vs measured peak of a training step") -> Any:
    """Grouped bars: for each case (label, estimate GB, measured GB or None) the estimate and the measurement."""
    if not cases:
        raise ValueError("cases must contain at least one (label, estimate, measured) row")
    fig, ax = new_figure(title, "case", "peak memory (GB)", figsize=(8, 3.6))
    x = list(range(len(cases)))
    width = 0.38
    est = [c[1] for c in cases]
    meas = [0 if c[2] is None else c[2] for c in cases]
    ax.bar([i - width / 2 for i in x], est, width, label="estimate (weights, gradients, optimizer, activations, "
           "baseline)", color=COLORS["estimate"])
    ax.bar([i + width / 2 for i in x], meas, width, label="measured peak", color=COLORS["measured"])
    for i, (e, m) in enumerate(zip(est, [c[2] for c in cases])):
        ax.text(i - width / 2, e, f"{e:.2f}", ha="center", va="bottom", fontsize=8)
        ax.text(i + width / 2, m or 0, "not run" if m is None else f"{m:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [c[0] for c in cases])
    ax.legend(fontsize=8, loc="upper left")
    ax.margins(y=0.15)
    fig.tight_layout()
    return fig


def breakdown_chart(estimate: Any, budget_gb: float | None = None) -> Any:
    """One stacked bar: the parts of a :class:`~course_utils.step_memory.StepEstimate` at its peak moment."""
    parts = estimate.parts()
    fig, ax = new_figure("What the predicted peak is made of", "memory (GB)", "step", figsize=(8, 2.6))
    left = 0.0
    for (label, b), color in zip(parts, PART_COLORS * 2):
        ax.barh([0], [b / GB], left=left, color=color, label=f"{label}: {b / GB:.2f} GB")
        left += b / GB
    if budget_gb is not None:
        ax.axvline(budget_gb, color="black", linestyle="--", label=f"budget {budget_gb:g} GB")
    ax.set_yticks([0], [f"{estimate.method}, batch {estimate.batch}"])
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2)
    fig.tight_layout()
    return fig


#: The models the planner offers: the shipped presets (as 04's step planner).
PRESETS = tuple(config_presets())
SEQS = (128, 256, 512, 1024, 2048, 4096)
BUDGETS = (8.0, 16.0, 24.0, 40.0, 80.0)


def bottleneck_view(model: str = "smollm2-135m", method: str = "full", batch: int = 8, seq: int = 512,
                    budget_gb: float = 16.0, checkpointing: bool = False, optimizer: str = "adamw",
                    show_chart: bool = True) -> str:
    """The planner's callback: print and return the diagnosis; draw the breakdown of the predicted peak.

    Bounded: ``batch`` 1-256 and ``seq`` up to 8192, so a click cannot ask for an absurd estimate.
    """
    from course_utils.bottleneck import what_is_my_bottleneck

    checks.choice(model, "model", PRESETS)
    checks.choice(method, "method", memory.METHODS)
    checks.integer(batch, "batch", 1, 256)
    checks.integer(seq, "seq", 1, 8192)
    diag = what_is_my_bottleneck(model, method, batch, budget_gb, seq=seq, checkpointing=checkpointing,
                                 optimizer=optimizer, device="cuda")
    text = diag.text()
    print(text)
    if show_chart:
        import matplotlib.pyplot as plt

        breakdown_chart(diag.estimate, budget_gb)
        plt.show()
    return text


def bottleneck_planner() -> Any:
    """The widget: dropdowns and sliders wired to :func:`bottleneck_view` (GPU allocator view, no baseline)."""
    import ipywidgets as w

    controls = {
        "model": w.Dropdown(options=PRESETS, value="smollm2-135m", description="model"),
        "method": w.Dropdown(options=tuple(memory.METHODS), value="full", description="method"),
        "batch": w.IntSlider(value=8, min=1, max=64, description="batch"),
        "seq": w.Dropdown(options=SEQS, value=512, description="seq"),
        "budget_gb": w.Dropdown(options=BUDGETS, value=16.0, description="GB"),
        "checkpointing": w.Checkbox(value=False, description="checkpointing"),
        "optimizer": w.Dropdown(options=("adamw", "adamw8bit"), value="adamw", description="optimizer"),
    }

    def callback(**values: Any) -> None:
        bottleneck_view(**values)

    return interact_panel(callback, **controls)


#: Exercise 1: SmolLM2-135M, full fine-tuning in float32, batch 8 x 512 tokens, with gradient checkpointing.
CHECKPOINT_CASE = {"config": "smollm2-135m", "batch": 8, "seq": 512}
#: Exercise 2: 8-bit AdamW for SmolLM2-135M with every number trained (full fine-tuning).
ADAMW8BIT_CASE = {"config": "smollm2-135m"}
#: Exercise 3: Kwame's step - Qwen2.5-1.5B, full fine-tuning, batch 8 x 512 tokens, on a 24 GB GPU.
KWAME_CASE = {"config": "qwen2.5-1.5b-instruct", "method": "full", "batch": 8, "seq": 512, "budget_gb": 24.0}
#: Exercise 3's choices, each as the change it makes to :func:`~course_utils.step_memory.estimate_step`'s arguments.
KWAME_OPTIONS: dict[str, dict[str, Any]] = {
    "checkpointing": {"checkpointing": True},
    "8-bit AdamW": {"optimizer": "adamw8bit"},
    "bf16 autocast": {"autocast": True},
    "accumulation": {"batch": 1, "accumulation": 8},
    "checkpointing + 8-bit AdamW": {"checkpointing": True, "optimizer": "adamw8bit"},
}


def checkpointed_inputs_gb() -> float:
    """GB that gradient checkpointing keeps in exercise 1: each layer's float32 input (the estimator's count)."""
    arch = Architecture.from_config(CHECKPOINT_CASE["config"])
    acts = saved_activations(arch, CHECKPOINT_CASE["batch"], CHECKPOINT_CASE["seq"], method="full",
                             checkpointing=True)
    return acts.by_kind["checkpointed layer inputs"] / GB


def check_checkpointed_inputs(kept_gb: Any) -> Feedback:
    """Exercise 1: the GB of layer inputs that gradient checkpointing keeps for SmolLM2 at batch 8 x 512."""
    arch = Architecture.from_config(CHECKPOINT_CASE["config"])
    expected = checkpointed_inputs_gb()
    without = saved_activations(arch, CHECKPOINT_CASE["batch"], CHECKPOINT_CASE["seq"], method="full").total / GB
    mistakes = [
        (expected * GB, "That looks like bytes: divide by 1e9 to write it in GB."),
        (expected / 4, "That is the count of numbers (in billions); each float32 number takes 4 bytes."),
        (expected / 2, "Full fine-tuning here runs in float32: 4 bytes per number, not 2."),
        (expected / arch.layers, f"That is one layer's input; checkpointing keeps the input of each of the "
                                 f"{arch.layers} layers."),
        (expected * GB / 2**30, "That is in GiB (2^30 bytes); the course writes GB = 10^9 bytes."),
        (without, "That is everything the layers save *without* checkpointing; with it, each layer keeps only "
                  "its input (batch x tokens x hidden numbers)."),
    ]
    return check_number(kept_gb, expected, name="kept_gb", what="the GB of layer inputs checkpointing keeps",
                        mistakes=mistakes, unit="GB",
                        hint="Per layer: batch x tokens x hidden size numbers, 4 bytes each; then times the layers.")


def adamw8bit_state_gb() -> float:
    """GB of 8-bit AdamW states in exercise 2, from the estimator (small tensors stay float32 there)."""
    est = estimate_step(ADAMW8BIT_CASE["config"], method="full", optimizer="adamw8bit", batch=1, seq=1,
                        device="cuda")
    return est.optimizer_bytes / GB


def check_adamw8bit_state(state_gb: Any) -> Feedback:
    """Exercise 2: the GB of optimizer states 8-bit AdamW keeps for SmolLM2-135M, every number trained."""
    n = Architecture.from_config(ADAMW8BIT_CASE["config"]).params
    expected = adamw8bit_state_gb()
    mistakes = [
        (8 * n / GB, "That is AdamW in float32 (2 states x 4 bytes); 8-bit AdamW keeps 1 byte per state."),
        (2 * n / GB, "Close: 2 states x 1 byte is right, but each state also keeps one float32 scale per block "
                     "of 256 numbers."),
        (n / GB, "AdamW keeps two states per trained number (the running mean and the running square)."),
        (4 * n / GB, "Each 8-bit state takes 1 byte per number, not 2."),
        (6 * n / GB, "That is roughly what 8-bit AdamW *saves* (8 - 2 bytes per number); the question asks what "
                     "it keeps."),
        (expected * GB / 2**30, "That is in GiB (2^30 bytes); the course writes GB = 10^9 bytes."),
        (expected * GB, "That looks like bytes: divide by 1e9 to write it in GB."),
    ]
    # tight tolerance: forgetting the block scales is only 1.6 % off
    return check_number(state_gb, expected, name="state_gb", what="the GB of 8-bit AdamW states",
                        rel_tol=0.005, mistakes=mistakes, unit="GB",
                        hint="Per trained number: 2 states x 1 byte, plus 2 x 4 bytes for every block of 256 numbers.")


def kwame_estimates_gb() -> dict[str, float]:
    """Exercise 3: the estimated peak (GB, GPU allocator counter) of Kwame's step with each choice."""
    case = {k: v for k, v in KWAME_CASE.items() if k not in ("config", "budget_gb")}
    return {name: estimate_step(KWAME_CASE["config"], device="cuda", **{**case, **change}).peak_gb
            for name, change in KWAME_OPTIONS.items()}


def kwame_answer() -> str:
    """Exercise 3's answer: the one choice whose estimate fits the budget."""
    fitting = [name for name, gb in kwame_estimates_gb().items() if gb <= KWAME_CASE["budget_gb"]]
    if len(fitting) != 1:  # pragma: no cover - guards the exercise against a change of the estimator
        raise RuntimeError(f"exercise 3 needs exactly one fitting choice, the estimator gives {fitting}")
    return fitting[0]


def check_kwame_choice(choice: Any) -> Feedback:
    """Exercise 3: which one change fits Kwame's full fine-tuning of Qwen2.5-1.5B into 24 GB."""
    gb = kwame_estimates_gb()
    budget = KWAME_CASE["budget_gb"]
    left = {
        "checkpointing": "the AdamW states, the weights and, at the optimizer step, all gradients stay",
        "8-bit AdamW": "the activations saved for backward are the biggest part, and they stay",
        "bf16 autocast": "activations shrink to 2 bytes, but autocast adds a 16-bit copy of every weight and "
                         "the states stay",
        "accumulation": "the activations shrink, but the AdamW states, the weights and the gradients stay",
    }
    hints = {name: f"{name[0].upper() + name[1:]} alone: estimated {gb[name]:.1f} GB, still over {budget:g} GB - "
                   f"{why}. The two biggest parts need two tricks." for name, why in left.items()}
    answer = kwame_answer()
    slower = arithmetic_time_factor("full", "full", False, True)
    return check_choice(choice, answer, name="choice", options=tuple(KWAME_OPTIONS), hints=hints,
                        why=f"Estimated {gb[answer]:.1f} GB: checkpointing removes the saved activations, 8-bit "
                            f"AdamW shrinks the states; about {slower:.2f}x the time (one extra forward).")
