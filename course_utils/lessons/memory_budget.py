"""Notebook 04 (memory budgets): its charts, the two planners and the exercises.

The estimates come from :mod:`course_utils.memory` and :mod:`course_utils.step_memory`, never retyped.
:func:`plan` and :func:`step_plan` do the work on plain values (tested); :func:`planner_view` and
:func:`step_planner_view` return the text and the chart; :func:`budget_planner` and :func:`step_planner` only
wire ipywidgets controls to them (:func:`course_utils.lessons.kit.view_panel` prints and shows). Nothing here
imports torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from course_utils import checks, datasheets
from course_utils import memory as mem
from course_utils.lessons.kit import (COLORS, Feedback, check_choice, check_number, finish, new_figure, plt,
                                      right, unanswered, view_panel)
from course_utils.memory import BUDGETS, Budget, MemoryEstimate, Method, line_gb
from course_utils.timeline import KINDS, PHASES, Timeline, tensor_total
from course_utils.units import GB

#: Colours of the parts of memory in the stacked bars: the estimate's, the step estimate's and a measured peak's.
_PART_COLORS = {"weights": COLORS["float32"], "gradients": COLORS["float16"], "AdamW states": COLORS["int8"],
                "optimizer": COLORS["int8"], "activations": COLORS["measured"], "baseline": "#8C8C8C",
                "overhead": "#8C8C8C", "other": "#D9D9D9"}
#: Colours of :func:`course_utils.memory.account_for_peak`'s parts, in its order (the last for any further part).
_PEAK_COLORS = [_PART_COLORS[k] for k in ("baseline", "weights", "gradients", "AdamW states", "activations", "other")]
#: Line styles of the budgets' lines, in the order of :data:`course_utils.memory.BUDGETS`.
_BUDGET_STYLES = ("--", "-.", ":", (0, (5, 1)), (0, (1, 3)))
#: Notebook 04's reference run: the team's estimate and measured peak (GB) of a LoRA step of SmolLM2-135M, batch 8.
TEAM_RUN = ("team's run", 0.54, 1.88)


def plot_methods_vs_budgets(estimates: Sequence[MemoryEstimate], title: str | None = None) -> Any:
    """One column per method for the same model, with a dashed line at the 70 % line of each of the lesson's
    budgets (:data:`course_utils.memory.BUDGETS`). Returns the figure."""
    if not estimates or not all(isinstance(e, MemoryEstimate) for e in estimates):
        raise TypeError("estimates must be a non-empty sequence of MemoryEstimate")
    fig, ax = new_figure(title or f"{estimates[0].model}: training memory by method (estimates, activations "
                         "excluded)", "method", "memory (GB)", figsize=(8.0, 4.2))
    values = [e.gb for e in estimates]
    colors = [COLORS["float32"], COLORS["float32"], COLORS["bfloat16"], COLORS["nf4"]]
    bars = ax.bar([e.label.replace(", ", ",\n") for e in estimates], values, zorder=2,
                  color=[colors[i] if i < len(colors) else COLORS["float32"] for i in range(len(values))])
    ax.bar_label(bars, [f"{value:.1f} GB" for value in values], padding=2, zorder=4,
                 bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0})
    for budget, style in zip(BUDGETS, _BUDGET_STYLES):
        ax.axhline(budget.line_gb, color="#555555", linestyle=style, linewidth=1.2, zorder=3,
                   label=f"70 % line of {budget.label}: {budget.line_gb:g} GB")
    ax.set_ylim(0, max(values + [b.line_gb for b in BUDGETS]) * 1.12)
    return finish(fig, ax, loc="upper right")


def _bar_against(title: str, xlabel: str, name: str, parts_gb: dict[str, float],
                 lines: Sequence[tuple[float, Any, str]], note: str) -> Any:
    """One stacked bar ``name`` of ``parts_gb`` (each part labelled with its GB), a horizontal line per ``(GB,
    style, label)`` of ``lines``, and ``note`` above the bar. Returns the figure."""
    fig, ax = new_figure(title, xlabel, "memory (GB)", figsize=(7.5, 4.2))
    bottom = 0.0
    for part, value in parts_gb.items():
        ax.bar([name], [value], bottom=bottom, color=_PART_COLORS[part], zorder=2, width=0.5,
               label=f"{part}: {value:.2f} GB")
        bottom += value
    for gb, style, label in lines:
        ax.axhline(gb, color="#333333", linestyle=style, linewidth=1.2, zorder=3, label=label)
    ax.annotate(note, (0, bottom), ha="center", va="bottom", xytext=(0, 3), textcoords="offset points")
    ax.set(xlim=(-0.8, 0.8), ylim=(0, max([bottom] + [gb for gb, _, _ in lines]) * 1.15))
    return finish(fig, ax, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=9)


def plot_step_against_budgets(estimate: Any, budgets: Sequence[Budget]) -> Any:
    """One stacked bar of a GPU step's predicted peak (weights, gradients, optimizer, activations, overhead), with a
    line at each budget's usable memory (the card's memory ``gb`` less the CUDA context) and its verdict
    (:func:`course_utils.memory.step_verdict`) in the legend. ``estimate`` is a
    :class:`course_utils.step_memory.StepEstimate`. 04's step planner and 05's bottleneck planner draw with it
    (with the GPU budgets they were given, already checked)."""
    usable = [datasheets.usable_gb(b.gb) for b in budgets]
    lines = [(u, style, f"{b.label}, usable {u:.4g} GB: {mem.step_verdict(estimate.peak_gb, u)}")
             for b, u, style in zip(budgets, usable, _BUDGET_STYLES + ("-",) * len(budgets))]
    return _bar_against(f"Predicted peak of one training step: {estimate.arch.name}",
                        "the step estimate, split at its peak moment", "step",
                        {part: nbytes / GB for part, nbytes in estimate.categories().items()}, lines,
                        f"{estimate.peak_gb:.2f} GB")


def plot_estimate_vs_measured(cases: Sequence[tuple[str, float, Any]],
                              title: str = "Predicted vs measured peak of a training step",
                              counts: str = "weights, gradients, optimizer, activations, baseline") -> Any:
    """A pair of bars per case ``(label, estimate GB, measured)``: the estimate (of what ``counts`` says) beside
    the measured peak. 04 and 05 draw with it.

    ``measured`` is a number of GB, None (an empty bar marked "not run"), or
    :func:`course_utils.memory.account_for_peak`'s list of (part, GB), drawn stacked; negative parts are drawn as
    zero (they say the counted parts overlap), so the column's top is the measured peak.
    """
    if not cases:
        raise ValueError("cases must contain at least one (label, estimate, measured) row")
    fig, ax = new_figure(title, "case", "peak memory (GB)", figsize=(8, 3.6))
    width, top = 0.38, 0.0
    for i, (_, estimate, measured) in enumerate(cases):
        checks.number(estimate, "estimate", 0)
        ax.bar(i - width / 2, estimate, width, color=COLORS["estimate"], zorder=2,
               label=None if i else f"estimate ({counts})")
        ax.text(i - width / 2, estimate, f"{estimate:.2f}", ha="center", va="bottom", fontsize=8)
        stacked = isinstance(measured, (list, tuple))
        parts = list(measured) if stacked else [("measured peak", 0.0 if measured is None else measured)]
        if not parts:
            raise ValueError("measured must be a number of GB, None, or the measured peak's parts")
        bottom = 0.0
        for j, (name, value) in enumerate(parts):
            value = checks.number(value, "measured")
            if stacked:
                color, label = _PEAK_COLORS[min(j, len(_PEAK_COLORS) - 1)], f"{name}: {_gb(value)} GB"
            else:
                color, label = COLORS["measured"], None if i else name
            ax.bar(i + width / 2, max(0.0, value), width, bottom=bottom, color=color, zorder=2, label=label)
            bottom += max(0.0, value)
        ax.text(i + width / 2, bottom, "not run" if measured is None else f"{bottom:.2f}", ha="center",
                va="bottom", fontsize=8)
        top = max(top, estimate, bottom)
    ax.set_xticks(range(len(cases)), [c[0] for c in cases])
    ax.set_ylim(0, top * 1.18 or 1)
    return finish(fig, ax, loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8, ncol=2)


#: Custom size: the parameter count comes from the 'billions' control.
CUSTOM = "custom size (billions of parameters)"
#: The planner's models: the shipped configs (exact counts) and the lesson's round sizes (assumed adapter share).
_PRESET_CONFIGS = {"SmolLM2-135M (config)": "smollm2-135m", "Qwen2.5-1.5B (config)": "qwen2.5-1.5b-instruct",
                   "Qwen3-4B (config)": "qwen3-4b-instruct-2507"}
_ROUND_SIZES = {"a 1.7B model": 1.7, "a 7B model": 7.0, "a 70B model": 70.0}
_MODEL_CHOICES: tuple[str, ...] = (*_PRESET_CONFIGS, *_ROUND_SIZES, CUSTOM)
#: The GPUs the step planner budgets against by default (names from the datasheet table; each by its card's memory,
#: :func:`course_utils.memory.gpu_budget`, and judged against its usable memory: a T4 15.83 GB, usable 15.33 GB).
_STEP_GPUS = ("T4", "L4", "A100-40GB", "H100")
_STYLE = {"description_width": "initial"}


@dataclass(frozen=True)
class Plan:
    """A planner's answer: the estimate, the budgets (the budget planner's one, or the step planner's GPUs), and
    the text under the bar."""

    estimate: Any
    budgets: tuple[Budget, ...]
    text: str


def plan(model: str, billions: float, method: str, lora_rank: int, budget_gb: float) -> Plan:
    """Estimate ``method`` on ``model`` at ``lora_rank`` against ``budget_gb`` GB.

    ``model`` is a shipped config ("SmolLM2-135M (config)"), a round size ("a 7B model") or :data:`CUSTOM`;
    ``billions`` is used only for :data:`CUSTOM`; ``method`` one of :data:`course_utils.memory.ALL_METHODS`.
    Configs give exact counts (LoRA on q_proj and v_proj); round sizes and custom sizes assume the lesson's
    0.34 % adapter share.
    """
    checks.choice(model, "model", _MODEL_CHOICES)  # the method is checked by the estimate
    checks.integer(lora_rank, "lora_rank", 1, 1024)
    checks.positive(billions, "billions", 1000.0)
    mem.check_budget(budget_gb)
    if model in _PRESET_CONFIGS:
        size = mem.model_from_config(_PRESET_CONFIGS[model], lora_rank, name=model.replace(" (config)", ""))
    else:
        params = int(round(_ROUND_SIZES.get(model, billions) * GB))
        size = mem.ModelSize(model if model in _ROUND_SIZES else mem.size_name(params), params)
    est = mem.estimate(size.params, method, adapter=size.adapter, lora_rank=lora_rank, name=size.name)
    line, pg = mem.line_gb(budget_gb), est.parts_gb()
    if mem.ALL_METHODS[method].trains_all:
        trained = f"trains all {est.params:,} parameters"
    else:
        how = "assumed: 0.34% of the model x rank/8" if est.adapter_assumed else "counted from the config"
        trained = f"LoRA rank {lora_rank} trains {est.trained:,.0f} numbers ({how})"
    text = (f"{est.model}, {est.label}: {trained}.\n"
            f"Estimate: {est.gb:.2f} GB = weights {_gb(pg['weights'])} + gradients {_gb(pg['gradients'])} "
            f"+ AdamW states {_gb(pg['AdamW states'])} GB (activations not included).\n"
            f"Memory {budget_gb:g} GB, 70 % line {line:g} GB: {'fits' if est.fits(budget_gb) else 'does not fit'} "
            f"(the estimate is {100 * est.gb / line:.0f} % of the line).")
    return Plan(est, (Budget(f"{budget_gb:g} GB", float(budget_gb)),), text)


def method_options(methods: Mapping[str, Method] = mem.ALL_METHODS) -> list[tuple[str, str]]:
    """The planners' method menu, (label, key): the table's four, then the extras such as full fine-tuning in bf16."""
    return [(m.label, k) for k, m in methods.items()]


def _gb(value: float) -> str:
    """GB with two decimals, or four when the part is within 0.01 GB of zero (so small parts do not read as zero)."""
    return f"{value:.2f}" if abs(value) >= 0.01 else f"{value:.4f}"


def planner_view(model: str, billions: float, method: str, lora_rank: int, budget_gb: float) -> tuple[str, Any]:
    """The widget's view: the plan's text, and a stacked bar of weights, gradients and AdamW states beside the
    memory and its 70 % line."""
    result = plan(model, billions, method, lora_rank, budget_gb)
    est, line = result.estimate, line_gb(budget_gb)
    return result.text, _bar_against(
        f"What takes the memory: {est.model}, {est.label}", "the estimate (activations not included)", "estimate",
        est.parts_gb(), [(budget_gb, "-", f"memory: {budget_gb:g} GB"), (line, "--", f"70 % line: {line:g} GB")],
        f"{est.gb:.2f} GB: {'fits' if est.fits(budget_gb) else 'does not fit'}")


def budget_planner(model: str = "a 7B model", method: str = "lora-bf16", lora_rank: int = 8,
                   budget_gb: float = 16.0, billions: float = 7.0) -> Any:
    """The budget-planner widget: pick a model, a method, a LoRA rank and a budget; see the estimate."""
    import ipywidgets as w

    plan(model, billions, method, lora_rank, budget_gb)  # bad defaults fail here, with a clear message
    controls = {
        "model": w.Dropdown(options=list(_MODEL_CHOICES), value=model, description="model", style=_STYLE),
        "billions": w.FloatLogSlider(value=billions, base=10, min=-1, max=3, step=0.05,
                                     description="custom size (B)", style=_STYLE, continuous_update=False),
        "method": w.Dropdown(options=method_options(), value=method, description="method", style=_STYLE),
        "lora_rank": w.Dropdown(options=[1, 2, 4, 8, 16, 32, 64, 128], value=lora_rank, description="LoRA rank",
                                style=_STYLE),
        "budget_gb": w.FloatSlider(value=budget_gb, min=2, max=160, step=2, description="memory (GB)",
                                   style=_STYLE, continuous_update=False),
    }
    # Moving the size slider means "plan for this size": switch the model to the custom size, so the
    # slider never looks dead while a preset is selected.
    controls["billions"].observe(lambda _change: setattr(controls["model"], "value", CUSTOM), names="value")
    return view_panel(planner_view, first_row=["model", "billions"], **controls)


# --------------------------------------------------------------------------------------------
# The whole-step planner: the step estimate (activations included) against GPU budgets
# --------------------------------------------------------------------------------------------
def step_plan(config: str = "smollm2-135m", method: str = "lora", batch: int = 8, seq: int = 512,
              checkpointing: bool = False, optimizer: str = "adamw") -> Plan:
    """Estimate one training step on a GPU (allocator counter) and say which of the lesson's GPUs it fits.

    ``config`` is a shipped preset, a ``config.json`` path or a dict; ``method`` one of
    :data:`course_utils.memory.ALL_METHODS` (``full-bf16`` included); every other argument is checked by
    :func:`course_utils.step_memory.estimate_step`. The text lists the five parts and one line per GPU: its usable
    memory (the card's less the CUDA context) and :func:`course_utils.memory.step_verdict`'s word, "fits" (at most
    90 % of usable), "tight" (90-100 %) or "does not fit" (no 70 % line: this estimate includes the activations).
    """
    from course_utils.step_memory import estimate_step

    checks.flag(checkpointing, "checkpointing")
    budgets = tuple(mem.gpu_budget(g) for g in _STEP_GPUS)
    # one estimate per card: its attention kernel (and 16-bit dtype) can change the activations
    by_card = {b.capability: estimate_step(config, method=method, batch=batch, seq=seq, checkpointing=checkpointing,
                                           optimizer=optimizer, device="cuda", capability=b.capability)
               for b in budgets}
    est = by_card[budgets[-1].capability]  # the newest card's: the bar and the parts
    parts = ", ".join(f"{k} {v / GB:.2f}" for k, v in est.categories().items())
    lines = [f"{est.describe()}: predicted peak {est.peak_gb:.2f} GB on a GPU ({parts} GB), "
             f"{est.attention.backend} attention.", f"Peak moment: {est.peak_moment}."]
    for b in budgets:
        usable, own = datasheets.usable_gb(b.gb), by_card[b.capability]
        differs = ""
        if own.peak_bytes != est.peak_bytes:
            differs = f"; {own.attention.backend} attention: {own.peak_gb:.2f} GB"
        lines.append(f"  {b.label}, usable {usable:.4g} GB: {mem.step_verdict(own.peak_gb, usable)} "
                     f"({100 * own.peak_gb / usable:.0f} % of usable{differs})")
    return Plan(est, budgets, "\n".join(lines))


def step_planner_view(config: str, method: str, batch: int, seq: int, checkpointing: bool,
                      optimizer: str) -> tuple[str, Any]:
    """The step planner's view: the plan's text, and the stacked bar against each GPU."""
    result = step_plan(config, method, batch, seq, checkpointing, optimizer)
    return result.text, plot_step_against_budgets(result.estimate, result.budgets)


def step_controls(config: str, method: str, batch: int, seq: int, checkpointing: bool, optimizer: str,
                  methods: Mapping[str, Method] = mem.ALL_METHODS) -> dict[str, Any]:
    """The step planners' controls (04's and 05's), keyed by their callbacks' arguments: the shipped presets,
    ``methods`` (by :func:`method_options`), batch, tokens, checkpointing, optimizer."""
    import ipywidgets as w

    from course_utils.configs import config_presets

    return {
        "config": w.Dropdown(options=list(config_presets()), value=config, description="model", style=_STYLE),
        "method": w.Dropdown(options=method_options(methods), value=method, description="method", style=_STYLE),
        "batch": w.Dropdown(options=[1, 2, 4, 8, 16, 32, 64], value=batch, description="batch", style=_STYLE),
        "seq": w.Dropdown(options=[128, 256, 512, 1024, 2048, 4096], value=seq, description="tokens", style=_STYLE),
        "optimizer": w.Dropdown(options=[("AdamW", "adamw"), ("8-bit AdamW", "adamw8bit")], value=optimizer,
                                description="optimizer", style=_STYLE),
        "checkpointing": w.Checkbox(value=checkpointing, description="gradient checkpointing"),
    }


def step_planner(config: str = "qwen2.5-1.5b-instruct", method: str = "lora", batch: int = 8, seq: int = 1024) -> Any:
    """The whole-step planner widget: model, method, batch, sequence length, checkpointing, optimizer (starting
    without checkpointing, with AdamW)."""
    step_plan(config, method, batch, seq)  # bad defaults fail here, clearly
    controls = step_controls(config, method, batch, seq, False, "adamw")
    return view_panel(step_planner_view, first_row=["config", "method"], **controls)


#: Exercise 1: a model of 3 billion parameters (not in the table), trained three ways; LoRA's adapter is assumed
#: at the lesson's share of the model (0.34 %, rank 8).
_THREE_WAYS_PARAMS = 3_000_000_000
#: How close an answer must be, per method. LoRA's adapter is 1 % of its total, so its tolerance is tighter.
REL_TOL = {"full": 0.02, "lora": 0.005, "lora-bf16": 0.01, "qlora": 0.015}
#: Exercise 2 tries the methods in this order and takes the first whose estimate fits: each step down the list
#: gives up something (training every weight, then the precision of the frozen weights). "none": no method fits.
_ORDER: tuple[str, ...] = tuple(mem.METHODS)
_CHOICES: tuple[str, ...] = (*_ORDER, "none")


# --------------------------------------------------------------------------------------------
# Exercise 1: a 3B model, three ways
# --------------------------------------------------------------------------------------------
def training_gb(method: str, params: float = _THREE_WAYS_PARAMS) -> float:
    """The estimator's GB for training ``params`` parameters with ``method`` (LoRA's adapter assumed, rank 8)."""
    return mem.estimate(params, method).gb


def _memory_mistakes(method: str) -> list[tuple[float, str]]:
    """Typical wrong answers (GB) for exercise 1's ``method`` and the hint each one earns, most telling first.

    :func:`~course_utils.lessons.kit.check_number` tries the right answer first and the slips in this order, so a
    slip that lands within the tolerance of the right answer, or of a slip before it, never shows its hint. The
    unit slips (GiB, bytes) are check_number's.
    """
    meth, n = mem.METHODS[method], _THREE_WAYS_PARAMS
    if meth.trains_all:
        slips = [
            (12 * n, "12 bytes per parameter: one of the four numbers is missing. Each trained weight keeps "
                     "itself (4 bytes), its gradient (4) and AdamW's two running averages (4 + 4)."),
            (8 * n, "8 bytes per parameter: two of the four numbers are missing. AdamW keeps two running "
                    "averages per weight (8 bytes), on top of the weight and its gradient."),
            (4 * n, "That is the weights alone. Training adds a gradient and AdamW's two averages to each "
                    "weight: 16 bytes in all."),
        ]
    else:
        base, adapter = meth.base_bytes, mem.assumed_adapter_params(n)
        slips = [
            (base * n, f"That is the frozen weights alone ({base:g} bytes each). Add the adapter: 12 bytes "
                       "(gradient + AdamW's two averages) for each of its numbers, 0.34 % of the model."),
            ((base + 12) * n, "You gave every weight a gradient and AdamW states. The base is frozen: only the "
                              "adapter's numbers (0.34 % of the model) get them."),
            ((base + 8) * n, "You counted AdamW's states for the whole model. Only the adapter is trained, so "
                             "only its numbers (0.34 % of the model) get states."),
            (12 * adapter, f"That is the adapter alone. The frozen base is still in memory, at {base:g} bytes a "
                           "weight."),
            (base * n + 4 * adapter, "You left out AdamW's two states for the adapter: 8 bytes per adapter number."),
            (base * n + 8 * adapter, "You left out the adapter's gradients: 4 bytes per adapter number."),
        ]
        slips += [(training_gb(other) * GB, f"That counts the base in {bytes_text} a weight; {meth.label} stores "
                   f"it at {base:g} bytes a weight.")
                  for other, bytes_text in (("lora", "float32, 4 bytes"), ("lora-bf16", "bfloat16, 2 bytes"),
                                            ("qlora", "4 bits, half a byte")) if other != method]
    return [(nbytes / GB, why) for nbytes, why in slips]


def _check_training_gb(answer_gb: Any, method: str, name: str) -> Feedback:
    """Check one of exercise 1's answers in GB against the estimator, with a hint for each usual slip."""
    return check_number(answer_gb, training_gb(method), name=name, unit="GB",
                        what=f"the GB of {mem.METHODS[method].label} (a number)", rel_tol=REL_TOL[method],
                        mistakes=_memory_mistakes(method),
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
    answers = {"full_gb": (full_gb, "full"), "lora_gb": (lora_gb, "lora"), "qlora_gb": (qlora_gb, "qlora")}
    return _together([(name, _check_training_gb(answer, method, name))
                      for name, (answer, method) in answers.items()], "numbers of GB")


# --------------------------------------------------------------------------------------------
# Exercise 2: the method that fits
# --------------------------------------------------------------------------------------------
def best_method(params: float, budget_gb: float) -> str:
    """The first method in the order full, LoRA, LoRA on a 16-bit base, QLoRA whose estimate fits ``budget_gb``
    (at most its 70 % line), else 'none'."""
    return next((m for m in _ORDER if mem.estimate(params, m).fits(budget_gb)), "none")


def _check_method_for(answer: Any, model: str, budget_gb: float, name: str) -> Feedback:
    """Check a choice of method (or "none"): the first that fits ``model`` of the lesson's table in ``budget_gb``.

    Each wrong option earns a hint from the estimates: over the memory, inside it but over the 70 % line, or too
    far down.
    """
    params = next(m.params for m in mem.MODELS if m.name == model)
    expected, line = best_method(params, budget_gb), mem.line_gb(budget_gb)
    est = {m: mem.estimate(params, m) for m in _ORDER}
    hints: dict[str, str] = {}
    for m in _ORDER:
        gb, label = est[m].gb, est[m].label[0].upper() + est[m].label[1:]
        if gb > budget_gb:
            hints[m] = f"{label} needs {gb:.2f} GB: more than the whole {budget_gb:g} GB."
        elif gb > line:
            hints[m] = (f"{label} needs {gb:.2f} GB: under {budget_gb:g} GB, but over its 70 % line "
                        f"({line:g} GB). The other 30 % is for activations and the program itself.")
        elif m != expected:
            hints[m] = (f"{label} fits ({gb:.2f} GB), but {est[expected].label} fits too ({est[expected].gb:.2f} GB) "
                        "and comes first in the order: it gives up less.")
    if expected == "none":
        why = f"Even QLoRA needs {est['qlora'].gb:.2f} GB, over the 70 % line ({line:g} GB)."
    else:
        hints["none"] = (f"{est[expected].label} needs {est[expected].gb:.2f} GB, within the 70 % line of "
                         f"{budget_gb:g} GB ({line:g} GB).")
        why = f"{est[expected].label}: {est[expected].gb:.2f} GB, within the 70 % line ({line:g} GB)."
    return check_choice(answer, expected, name=name, options=_CHOICES, hints=hints, why=why)


def check_best_methods(method_8gb: Any, method_48gb: Any) -> Feedback:
    """Exercise 2: the first method that fits the 1.7B model on an 8 GB laptop, and the 70B model on a 48 GB GPU."""
    cases = {"method_8gb": (method_8gb, "a 1.7B model", 8.0), "method_48gb": (method_48gb, "a 70B model", 48.0)}
    results = [(name, _check_method_for(answer, model, gb, name)) for name, (answer, model, gb) in cases.items()]
    return _together(results, "one of " + ", ".join(repr(c) for c in _CHOICES))


# --------------------------------------------------------------------------------------------
# One step's memory over time: predicted and measured on the same axes
# --------------------------------------------------------------------------------------------
#: A colour per kind of memory, bottom of the stack first (course_utils.timeline.KINDS).
KIND_COLORS = {"framework": "#BBBBBB", "weights": "#4C72B0", "optimizer states": "#8172B2", "gradients": "#C44E52",
               "activations": "#55A868", "temporaries": "#CCB974"}


def _predicted_x(predicted: Timeline, measured: Timeline | None) -> list[float]:
    """Where each predicted point goes on the x axis: spread evenly over the time its phase took in the measured
    step (its index when there is no measurement)."""
    if measured is None or measured.times_s is None:
        return [float(i) for i in range(len(predicted.points))]
    spans: dict[str, tuple[float, float]] = {}
    for point, t in zip(measured.points, measured.times_s):
        lo, hi = spans.get(point.phase, (t, t))
        spans[point.phase] = (min(lo, t), max(hi, t))
    end = max(measured.times_s)
    xs: list[float] = []
    for phase in PHASES:
        idx = [i for i, p in enumerate(predicted.points) if p.phase == phase]
        lo, hi = spans.get(phase, (end, end) if phase == "after zero_grad" else (0.0, 0.0))
        xs += [lo + (hi - lo) * k / len(idx) for k in range(len(idx))]  # each phase from its start
    return xs


def timeline_chart(predicted: Timeline, measured: Timeline | None = None, title: str = "One training step", *,
                   whole_process: bool = False, measured_peak_bytes: int | None = None) -> Any:
    """The step's memory over time: the measured kinds as a stacked area (the predicted ones without a
    measurement), the predicted total as a dashed step line, each peak marked with its phase. ``whole_process``:
    the process's own memory too (a CPU estimate's framework part), at the bottom; ``measured_peak_bytes``: a
    peak measured some other way (a whole process's), drawn as a dotted line."""
    def total(point: Any) -> float:
        return (point.total if whole_process else tensor_total(point)) / GB

    fig, ax = plt.subplots(figsize=(8.0, 3.8))
    shown = measured or predicted
    xs = shown.times_s if measured is not None and measured.times_s else list(range(len(shown.points)))
    kinds = [k for k in KINDS if (whole_process or k != "framework") and shown.kind_max(k) > 0]
    ax.stackplot(xs, [[p.by_kind.get(k, 0) / GB for p in shown.points] for k in kinds], labels=kinds,
                 colors=[KIND_COLORS[k] for k in kinds], alpha=0.85, step="post" if measured is None else None)
    px = _predicted_x(predicted, measured)
    ax.step(px, [total(p) for p in predicted.points], where="post", color="black", linestyle="--", linewidth=1.2,
            label="predicted total")
    if measured_peak_bytes is not None:
        ax.axhline(measured_peak_bytes / GB, color=COLORS["measured"], linestyle=":", label="measured peak")
    peaks = [(predicted, px, "predicted")] + ([(measured, xs, "measured")] if measured is not None else [])
    for tl, x, who in peaks:
        i = tl.points.index(tl.peak)
        ax.plot(x[i], total(tl.peak), "o" if who == "measured" else "x", color="black")
        ax.annotate(f"{who} peak: {tl.peak.phase}", (x[i], total(tl.peak)), textcoords="offset points",
                    xytext=(6, 6 if who == "measured" else -14), fontsize=8)
    ax.set(title=title, ylabel="GB alive" + ("" if whole_process else " (tensors)"),
           xlabel="seconds into the step" if measured is not None else "moments of the step, in order")
    return finish(fig, ax, fontsize=8, loc="upper left")


def timeline_text(predicted: Timeline, measured: Timeline | None = None, whole_process: bool = False) -> str:
    """The chart's text description: what is drawn, then each peak with its phase and moment, and their gap.
    ``whole_process``: as :func:`timeline_chart`'s (the prediction alone, the process's own memory counted)."""

    def size(point: Any) -> float:
        return (point.total if whole_process else tensor_total(point)) / GB

    def peak(tl: Timeline, who: str) -> str:
        return f"{who} peak {size(tl.peak):.2f} GB in {tl.peak.phase} ({tl.peak.label.split(' (')[0]})"

    kinds = ", ".join(k for k in KINDS if whole_process or k != "framework")
    what = "GB alive" if whole_process else "GB of tensors"
    head = f"Text description: {what} over the step, stacked by kind ({kinds}); dashed: predicted total."
    if measured is None:
        return f"{head}\n{peak(predicted, 'Predicted')}."
    gap = 100 * (tensor_total(predicted.peak) - tensor_total(measured.peak)) / tensor_total(measured.peak)
    return f"{head}\n{peak(measured, 'Measured')}; {peak(predicted, 'predicted')}: {gap:+.1f} %."
