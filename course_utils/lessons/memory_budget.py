"""Notebook 04 (memory budgets): its charts, the two planners and the exercises.

The estimates come from :mod:`course_utils.memory` and :mod:`course_utils.step_memory`, never retyped.
:func:`plan` and :func:`step_plan` do the work on plain values (tested); :func:`planner_view` and
:func:`step_planner_view` print and draw; :func:`budget_planner` and :func:`step_planner` only wire
ipywidgets controls. Nothing here imports torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from course_utils import checks
from course_utils import memory as mem
from course_utils.lessons.kit import COLORS, Feedback, check_choice, check_number, new_figure, right, unanswered
from course_utils.memory import BUDGETS, Budget, MemoryEstimate, usable_gb
from course_utils.units import GB

#: Colours of the parts of a training step's memory (stacked bars).
PART_COLORS = {"weights": COLORS["float32"], "gradients": COLORS["float16"], "AdamW states": COLORS["int8"],
               "activations": COLORS["measured"], "baseline": "#8C8C8C", "other": "#D9D9D9"}
#: Line styles of the budgets' 70 % lines, in the order of :data:`course_utils.memory.BUDGETS`.
_BUDGET_STYLES = ("--", "-.", ":", (0, (5, 1)), (0, (1, 3)))


def _check_estimates(estimates: Sequence[MemoryEstimate]) -> None:
    if not estimates or not all(isinstance(e, MemoryEstimate) for e in estimates):
        raise TypeError("estimates must be a non-empty sequence of MemoryEstimate")


def plot_methods_vs_budgets(estimates: Sequence[MemoryEstimate], budgets: Sequence[Budget] = BUDGETS,
                            title: str | None = None) -> Any:
    """One column per method for the same model, with a dashed line at 70 % of each budget. Returns the figure."""
    _check_estimates(estimates)
    if not budgets:
        raise ValueError("budgets must hold at least one Budget")
    model = estimates[0].model
    fig, ax = new_figure(title or f"{model}: training memory by method (estimates, activations excluded)",
                         "method", "memory (GB)", figsize=(8.0, 4.2))
    labels = [e.label.replace(", ", ",\n") for e in estimates]
    values = [e.gb for e in estimates]
    colors = [COLORS["float32"], COLORS["float32"], COLORS["bfloat16"], COLORS["nf4"]][: len(values)]
    colors += [COLORS["float32"]] * (len(values) - len(colors))
    bars = ax.bar(labels, values, color=colors, zorder=2)
    for bar, value in zip(bars, values):
        ax.annotate(f"{value:.1f} GB", (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom",
                    xytext=(0, 2), textcoords="offset points", zorder=4,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0})
    for budget, style in zip(budgets, _BUDGET_STYLES):
        ax.axhline(budget.usable_gb, color="#555555", linestyle=style, linewidth=1.2, zorder=3,
                   label=f"70% of {budget.label}: {budget.usable_gb:g} GB")
    ax.set_ylim(0, max(values + [b.usable_gb for b in budgets]) * 1.12)
    ax.legend(loc="upper right", frameon=False)
    fig.tight_layout()
    return fig


def plot_breakdown(estimate: MemoryEstimate, budget_gb: float, ax: Any = None) -> Any:
    """A stacked bar of weights, gradients and AdamW states, beside the budget and its usable 70 %."""
    if not isinstance(estimate, MemoryEstimate):
        raise TypeError(f"estimate must be a MemoryEstimate, got {type(estimate).__name__}")
    usable = usable_gb(budget_gb)
    fig, ax = _figure(ax, f"What takes the memory: {estimate.model}, {estimate.label}",
                      "the estimate (activations not included)", (7.5, 4.0))
    bottom = _stacked_bar(ax, "estimate", estimate.parts_gb(), PART_COLORS)
    ax.axhline(budget_gb, color="black", linewidth=1.2, label=f"budget: {budget_gb:g} GB")
    ax.axhline(usable, color="black", linestyle="--", linewidth=1.2, label=f"70% usable: {usable:g} GB")
    verdict = "fits" if estimate.fits(budget_gb) else "does not fit"
    ax.annotate(f"{estimate.gb:.2f} GB: {verdict}", (0, bottom), ha="center", va="bottom", xytext=(0, 3),
                textcoords="offset points")
    ax.set_xlim(-0.8, 0.8)
    ax.set_ylim(0, max(bottom, budget_gb) * 1.15)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=9)
    fig.tight_layout()
    return fig


def plot_estimate_vs_measured(estimate_gb: float, parts_gb: Sequence[tuple[str, float]], *,
                              team_estimate_gb: float = 0.54, team_measured_gb: float = 1.88,
                              label: str = "this machine") -> Any:
    """The team's estimate and measured peak (their laptop run) beside this machine's, the measured column split.

    ``parts_gb`` is :func:`course_utils.memory.account_for_peak`'s list of (part, GB); negative parts are
    drawn as zero (they say the counted parts overlap), so the column's top is the measured peak.
    """
    if not parts_gb:
        raise ValueError("parts_gb must hold the measured peak's parts")
    for name, value in (("estimate_gb", estimate_gb), ("team_estimate_gb", team_estimate_gb),
                        ("team_measured_gb", team_measured_gb)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{name} must be a number of GB >= 0, got {value!r}")
    fig, ax = new_figure("LoRA on SmolLM2-135M, batch 8: estimate vs measured peak",
                         "whose number, and what it counts", "memory (GB)", figsize=(10.0, 4.4))
    x = ["team's run:\nestimate", "team's run:\nmeasured", f"{label}:\nestimate", f"{label}:\nmeasured"]
    ax.bar(x[0], team_estimate_gb, color=COLORS["estimate"], zorder=2, label="estimate: weights, gradients, AdamW")
    ax.bar(x[1], team_measured_gb, color="white", edgecolor="#555555", hatch="//", zorder=2,
           label="the team's measured peak (not split)")
    ax.bar(x[2], estimate_gb, color=COLORS["estimate"], zorder=2)
    bottom = 0.0
    colors = [PART_COLORS["baseline"], PART_COLORS["weights"], PART_COLORS["gradients"],
              PART_COLORS["AdamW states"], PART_COLORS["activations"], PART_COLORS["other"]]
    for (name, value), color in zip(parts_gb, colors + [PART_COLORS["other"]] * len(parts_gb)):
        shown = max(0.0, value)
        amount = f"{value:.2f}" if abs(value) >= 0.01 else f"{value:.3f}"
        ax.bar(x[3], shown, bottom=bottom, color=color, zorder=2, label=f"{name}: {amount} GB")
        bottom += shown
    tops = [team_estimate_gb, team_measured_gb, estimate_gb, bottom]
    for xi, top in zip(x, tops):
        ax.annotate(f"{top:.2f} GB", (xi, top), ha="center", va="bottom", xytext=(0, 2), textcoords="offset points")
    ax.set_ylim(0, max(tops) * 1.18)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    fig.tight_layout()
    return fig


#: Colours of :meth:`course_utils.step_memory.StepEstimate.categories`, in stacking order.
CATEGORY_COLORS = {"weights": COLORS["float32"], "gradients": COLORS["float16"], "optimizer": COLORS["int8"],
                   "activations": COLORS["measured"], "overhead": "#8C8C8C"}


def plot_step_against_budgets(estimate: Any, budgets: Sequence[Budget], ax: Any = None) -> Any:
    """One stacked bar of a step's predicted peak (weights, gradients, optimizer, activations, overhead), with a
    line at each budget's full size. ``estimate`` is a :class:`course_utils.step_memory.StepEstimate`."""
    if not hasattr(estimate, "categories"):
        raise TypeError(f"estimate must be a StepEstimate, got {type(estimate).__name__}")
    if not budgets:
        raise ValueError("budgets must hold at least one Budget")
    fig, ax = _figure(ax, f"Predicted peak of one training step: {estimate.arch.name}",
                      "the step estimate, split at its peak moment", (7.5, 4.2))
    parts = {part: nbytes / GB for part, nbytes in estimate.categories().items()}
    bottom = _stacked_bar(ax, "step", parts, CATEGORY_COLORS)
    for budget, style in zip(budgets, _BUDGET_STYLES + ("-",) * len(budgets)):
        verdict = "fits" if estimate.peak_gb <= budget.gb else "too small"
        ax.axhline(budget.gb, color="#333333", linestyle=style, linewidth=1.2, zorder=3,
                   label=f"{budget.label}: {verdict}")
    ax.annotate(f"{estimate.peak_gb:.2f} GB", (0, bottom), ha="center", va="bottom", xytext=(0, 3),
                textcoords="offset points")
    ax.set_xlim(-0.8, 0.8)
    ax.set_ylim(0, max([bottom] + [b.gb for b in budgets]) * 1.12)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=9)
    fig.tight_layout()
    return fig


def _figure(ax: Any, title: str, xlabel: str, figsize: tuple[float, float]) -> tuple[Any, Any]:
    """A new figure with the course's style, or the figure of the ``ax`` given."""
    if ax is None:
        return new_figure(title, xlabel, "memory (GB)", figsize=figsize)
    return ax.figure, ax


def _stacked_bar(ax: Any, name: str, parts_gb: dict[str, float], colors: dict[str, str]) -> float:
    """One bar named ``name``, its parts stacked in order, each labelled with its GB; returns the bar's top."""
    bottom = 0.0
    for part, value in parts_gb.items():
        ax.bar([name], [value], bottom=bottom, color=colors[part], label=f"{part}: {value:.2f} GB", zorder=2, width=0.5)
        bottom += value
    return bottom


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
        params = (ROUND_SIZES[model] if model in ROUND_SIZES else billions) * GB
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


#: Exercise 1: a model of 3 billion parameters (not in the table), trained three ways; LoRA's adapter is assumed
#: at the lesson's share of the model (0.34 %, rank 8).
THREE_WAYS_PARAMS = 3_000_000_000
#: Exercise 1's answers: (variable name in the notebook, method).
THREE_WAYS = (("full_gb", "full"), ("lora_gb", "lora"), ("qlora_gb", "qlora"))
#: How close an answer must be, per method. LoRA's adapter is 1 % of its total, so its tolerance is tighter.
REL_TOL = {"full": 0.02, "lora": 0.005, "lora-bf16": 0.01, "qlora": 0.015}

#: Exercise 2 tries the methods in this order and takes the first whose estimate fits: each step down the list
#: gives up something (training every weight, then the precision of the frozen weights).
ORDER: tuple[str, ...] = tuple(mem.METHODS)
#: Exercise 2's options: a method, or "none" when no method fits.
CHOICES: tuple[str, ...] = (*ORDER, "none")
#: Exercise 2's cases: (variable name in the notebook, model of the lesson's table, memory in GB).
FIT_CASES = (("method_8gb", "a 1.7B model", 8.0), ("method_48gb", "a 70B model", 48.0))


# --------------------------------------------------------------------------------------------
# Exercise 1: a 3B model, three ways
# --------------------------------------------------------------------------------------------
def training_gb(method: str, params: float = THREE_WAYS_PARAMS) -> float:
    """The estimator's GB for training ``params`` parameters with ``method`` (LoRA's adapter assumed, rank 8)."""
    return mem.estimate(params, method).gb


def memory_mistakes(method: str, params: float = THREE_WAYS_PARAMS) -> list[tuple[float, str]]:
    """Typical wrong answers (GB) for :func:`training_gb` and the hint each one earns, most telling first.

    A slip that lands within the tolerance of the right answer, or of a slip listed before it, is left out: no
    answer can tell them apart.
    """
    meth = mem.METHODS[checks.choice(method, "method", mem.METHODS)]
    n = checks.positive(params, "params")
    expected = training_gb(method, n)
    slips: list[tuple[float, str]] = []
    if meth.trains_all:
        slips += [
            (12 * n / GB, "12 bytes per parameter: one of the four numbers is missing. Each trained weight keeps "
                          "itself (4 bytes), its gradient (4) and AdamW's two running averages (4 + 4)."),
            (8 * n / GB, "8 bytes per parameter: two of the four numbers are missing. AdamW keeps two running "
                         "averages per weight (8 bytes), on top of the weight and its gradient."),
            (4 * n / GB, "That is the weights alone. Training adds a gradient and AdamW's two averages to each "
                         "weight: 16 bytes in all."),
        ]
    else:
        base = meth.base_bytes
        adapter = mem.assumed_adapter_params(n)
        slips += [
            (base * n / GB, f"That is the frozen weights alone ({base:g} bytes each). Add the adapter: 12 bytes "
                            "(gradient + AdamW's two averages) for each of its numbers, 0.34 % of the model."),
            ((base + 12) * n / GB, "You gave every weight a gradient and AdamW states. The base is frozen: only the "
                                   "adapter's numbers (0.34 % of the model) get them."),
            ((base + 8) * n / GB, "You counted AdamW's states for the whole model. Only the adapter is trained, so "
                                  "only its numbers (0.34 % of the model) get states."),
            (12 * adapter / GB, f"That is the adapter alone. The frozen base is still in memory, at {base:g} bytes "
                                "a weight."),
            ((base * n + 4 * adapter) / GB, "You left out AdamW's two states for the adapter: 8 bytes per adapter "
                                            "number."),
            ((base * n + 8 * adapter) / GB, "You left out the adapter's gradients: 4 bytes per adapter number."),
        ]
        for other, bytes_text in (("lora", "float32, 4 bytes"), ("lora-bf16", "bfloat16, 2 bytes"),
                                  ("qlora", "4 bits, half a byte")):
            if other != method:
                slips.append((training_gb(other, n), f"That counts the base in {bytes_text} a weight; "
                                                     f"{meth.label} stores it at {base:g} bytes a weight."))
    slips += [
        (expected * GB / 2**30, "That is in GiB (2^30 bytes); the course writes GB = 10^9 bytes."),
        (expected * GB, "That looks like bytes: divide by 1e9 to write it in GB."),
    ]
    tol = REL_TOL[method]
    kept: list[tuple[float, str]] = []
    for value, why in slips:
        if all(abs(value - v) > tol * max(abs(value), abs(v)) for v in [expected] + [k for k, _ in kept]):
            kept.append((value, why))
    return kept


def check_training_gb(answer_gb: Any, method: str, params: float = THREE_WAYS_PARAMS, *,
                      name: str = "answer_gb") -> Feedback:
    """Check one training-memory answer in GB against the estimator, with a hint for each usual slip."""
    method = checks.choice(method, "method", mem.METHODS)
    label = mem.METHODS[method].label
    return check_number(answer_gb, training_gb(method, params), name=name, unit="GB",
                        what=f"the GB of {label} (a number)", rel_tol=REL_TOL[method],
                        mistakes=memory_mistakes(method, params),
                        hint="Full fine-tuning: 16 bytes per parameter. LoRA and QLoRA: the frozen base (4 or 0.5 "
                             "bytes a weight) + 12 bytes per adapter number (0.34 % of the model). GB = 10^9 bytes.")


def _together(results: Sequence[tuple[str, Feedback]], what: str) -> Feedback:
    """One verdict for several answers: the first that is not right (saying which are), or all right."""
    names = [name for name, _ in results]
    if all(not fb.answered for _, fb in results):
        return unanswered(", ".join(names[:-1]) + " and " + names[-1], what)
    done: list[str] = []
    for name, fb in results:
        if not fb.correct:
            prefix = f"{' and '.join(done)} {'is' if len(done) == 1 else 'are'} right; " if done else ""
            return Feedback(False, prefix + fb.message, fb.hint, fb.answered)
        done.append(name)
    return right(" ".join(fb.message for _, fb in results))


def check_three_ways(full_gb: Any, lora_gb: Any, qlora_gb: Any) -> Feedback:
    """Exercise 1: the training memory (GB) of a 3B model with full fine-tuning, LoRA (float32 base) and QLoRA."""
    answers = {"full_gb": full_gb, "lora_gb": lora_gb, "qlora_gb": qlora_gb}
    return _together([(name, check_training_gb(answers[name], method, name=name)) for name, method in THREE_WAYS],
                     "numbers of GB")


# --------------------------------------------------------------------------------------------
# Exercise 2: the method that fits
# --------------------------------------------------------------------------------------------
def _model(name: str) -> mem.ModelSize:
    return next(m for m in mem.MODELS if m.name == checks.choice(name, "model", [m.name for m in mem.MODELS]))


def best_method(params: float, budget_gb: float) -> str:
    """The first method of :data:`ORDER` whose estimate fits ``budget_gb`` (at most 70 % of it), else 'none'."""
    budget_gb = checks.positive(budget_gb, "budget_gb")
    return next((m for m in ORDER if mem.estimate(params, m).fits(budget_gb)), "none")


def choice_hints(params: float, budget_gb: float) -> dict[str, str]:
    """The hint each wrong option earns, from the estimates: over the budget, inside it but over 70 %, or too far."""
    answer = best_method(params, budget_gb)
    usable = mem.usable_gb(budget_gb)
    est = {m: mem.estimate(params, m) for m in ORDER}
    hints: dict[str, str] = {}
    for m in ORDER:
        gb, label = est[m].gb, est[m].label[0].upper() + est[m].label[1:]
        if gb > budget_gb:
            hints[m] = f"{label} needs {gb:.2f} GB: more than the whole {budget_gb:g} GB."
        elif gb > usable:
            hints[m] = (f"{label} needs {gb:.2f} GB: under {budget_gb:g} GB, but over the usable 70 % "
                        f"({usable:g} GB). The other 30 % is for activations and the program itself.")
        elif m != answer:
            hints[m] = (f"{label} fits ({gb:.2f} GB), but {est[answer].label} fits too ({est[answer].gb:.2f} GB) "
                        "and comes first in the order: it gives up less.")
    if answer != "none":
        hints["none"] = (f"{est[answer].label} needs {est[answer].gb:.2f} GB, within the usable 70 % of "
                         f"{budget_gb:g} GB ({usable:g} GB).")
    return hints


def check_method_for(answer: Any, model: str, budget_gb: float, *, name: str = "method") -> Feedback:
    """Check a choice among :data:`CHOICES`: the first method in :data:`ORDER` that fits ``model`` in ``budget_gb``."""
    params = _model(model).params
    expected = best_method(params, budget_gb)
    if expected == "none":
        why = f"Even QLoRA needs {mem.estimate(params, 'qlora').gb:.2f} GB, over {mem.usable_gb(budget_gb):g} GB."
    else:
        why = (f"{mem.estimate(params, expected).label}: {mem.estimate(params, expected).gb:.2f} GB, within "
               f"{mem.usable_gb(budget_gb):g} GB.")
    return check_choice(answer, expected, name=name, options=CHOICES, hints=choice_hints(params, budget_gb), why=why)


def check_best_methods(method_8gb: Any, method_48gb: Any) -> Feedback:
    """Exercise 2: the first method that fits the 1.7B model on an 8 GB laptop, and the 70B model on a 48 GB GPU."""
    answers = {"method_8gb": method_8gb, "method_48gb": method_48gb}
    return _together([(name, check_method_for(answers[name], model, gb, name=name)) for name, model, gb in FIT_CASES],
                     "one of " + ", ".join(repr(c) for c in CHOICES))
