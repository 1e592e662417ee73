"""Notebook 04 (memory budgets): its charts, the two planners and the exercises; nothing here imports torch.
:func:`plan` and :func:`step_plan` work on plain values; the ``*_view`` functions return the widgets' text and chart."""

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from course_utils import checks, datasheets
from course_utils import memory as mem
from course_utils.configs import config_presets
from course_utils.lessons import kit
from course_utils.lessons.kit import Feedback
from course_utils.memory import BUDGETS, Budget, MemoryEstimate, Method
from course_utils.step_memory import estimate_step
from course_utils.timeline import KINDS, PHASES, Timeline, TimelinePoint, tensor_total
from course_utils.units import GB

#: Colours of the parts of memory in the stacked bars: the estimate's, the step estimate's and a measured peak's.
_PART_COLORS = {
    "weights": kit.COLORS["float32"],
    "gradients": kit.COLORS["float16"],
    "AdamW states": kit.COLORS["int8"],
    "optimizer": kit.COLORS["int8"],
    "activations": kit.COLORS["measured"],
    "baseline": "#8C8C8C",
    "overhead": "#8C8C8C",
    "other": "#D9D9D9",
}
#: Colours of :func:`course_utils.memory.account_for_peak`'s parts, in its order (the last for any further part).
_PEAK_COLORS = [_PART_COLORS[k] for k in ("baseline", "weights", "gradients", "AdamW states", "activations", "other")]
#: The methods chart's colours by method: the base's format (float32 unless named here).
_METHOD_COLORS = {"lora-bf16": kit.COLORS["bfloat16"], "qlora": kit.COLORS["nf4"]}
#: Line styles of the budgets' lines, in the order of :data:`course_utils.memory.BUDGETS`.
_BUDGET_STYLES = ("--", "-.", ":", (0, (5, 1)), (0, (1, 3)))
#: Notebook 04's reference run, a LoRA step of SmolLM2-135M at batch 8: the estimate (computed) and the peak the
#: course's own run recorded (1.88 GB: a reported figure, drawn beside the peak measured here).
TEAM_RUN = ("team's run", mem.estimate(mem.SMOLLM2_PARAMS, "lora").gb, 1.88)


def _gb(value: float) -> str:
    """GB with two decimals, or four when the part is within 0.01 GB of zero (so small parts do not read as zero)."""
    return f"{value:.2f}" if abs(value) >= 0.01 else f"{value:.4f}"


def plot_methods_vs_budgets(estimates: Sequence[MemoryEstimate], title: str | None = None) -> Any:
    """One column per method for one model, and a line at the 70 % line of each of :data:`~.memory.BUDGETS`."""
    if not estimates or not all(isinstance(e, MemoryEstimate) for e in estimates):
        raise TypeError("estimates must be a non-empty sequence of MemoryEstimate")
    title = title or f"{estimates[0].model}: training memory by method (estimates, activations excluded)"
    fig, ax = kit.new_figure(title, "method", "memory (GB)", figsize=(8.0, 4.2))
    values = [e.gb for e in estimates]
    colors = [_METHOD_COLORS.get(e.method, kit.COLORS["float32"]) for e in estimates]
    bars = ax.bar([e.label.replace(", ", ",\n") for e in estimates], values, zorder=2, color=colors)
    white = {"facecolor": "white", "edgecolor": "none", "pad": 1.0}
    ax.bar_label(bars, [f"{value:.1f} GB" for value in values], padding=2, zorder=4, bbox=white)
    for budget, style in zip(BUDGETS, _BUDGET_STYLES):
        label = f"70 % line of {budget.label}: {budget.line_gb:g} GB"
        ax.axhline(budget.line_gb, color="#555555", linestyle=style, linewidth=1.2, zorder=3, label=label)
    ax.set_ylim(0, max(values + [b.line_gb for b in BUDGETS]) * 1.12)
    return kit.finish(fig, ax, loc="upper right")


def _bar_against(
    title: str, xlabel: str, name: str, parts_gb: dict[str, float], lines: Sequence[tuple[float, Any, str]], note: str
) -> Any:
    """One stacked bar ``name`` of ``parts_gb``, a line per ``(GB, style, label)`` of ``lines``, ``note`` on top."""
    fig, ax = kit.new_figure(title, xlabel, "memory (GB)", figsize=(7.5, 4.2))
    bottom = 0.0
    for part, value in parts_gb.items():
        label = f"{part}: {value:.2f} GB"
        ax.bar([name], [value], bottom=bottom, color=_PART_COLORS[part], zorder=2, width=0.5, label=label)
        bottom += value
    for gb, style, label in lines:
        ax.axhline(gb, color="#333333", linestyle=style, linewidth=1.2, zorder=3, label=label)
    ax.annotate(note, (0, bottom), ha="center", va="bottom", xytext=(0, 3), textcoords="offset points")
    ax.set(xlim=(-0.8, 0.8), ylim=(0, max([bottom] + [gb for gb, _, _ in lines]) * 1.15))
    return kit.finish(fig, ax, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=9)


def plot_step_against_budgets(estimate: Any, budgets: Sequence[Budget]) -> Any:
    """A :class:`~course_utils.step_memory.StepEstimate`'s peak as one stacked bar of its five parts, with a line at
    each GPU budget's usable memory and its :func:`~course_utils.memory.step_verdict`. 04 and 05 draw with it."""
    lines = []
    for budget, style in zip(budgets, _BUDGET_STYLES + ("-",) * len(budgets)):
        usable = datasheets.usable_gb(budget.gb)
        verdict = mem.step_verdict(estimate.peak_gb, usable)
        lines.append((usable, style, f"{budget.label}, usable {usable:.4g} GB: {verdict}"))
    title = f"Predicted peak of one training step: {estimate.arch.name}"
    parts = {part: nbytes / GB for part, nbytes in estimate.categories().items()}
    note = f"{estimate.peak_gb:.2f} GB"
    return _bar_against(title, "the step estimate, split at its peak moment", "step", parts, lines, note)


def plot_estimate_vs_measured(
    cases: Sequence[tuple[str, float, Any]],
    title: str = "Predicted vs measured peak of a training step",
    counts: str = "weights, gradients, optimizer, activations, baseline",
) -> Any:
    """A pair of bars per case ``(label, estimate GB, measured)``: the estimate (of what ``counts`` says) beside
    the measured peak, a number of GB, None ("not run"), or :func:`course_utils.memory.account_for_peak`'s parts,
    stacked (a negative part, where counted parts overlap, drawn as zero). 04 and 05 draw with it."""
    if not cases:
        raise ValueError("cases must contain at least one (label, estimate, measured) row")
    fig, ax = kit.new_figure(title, "case", "peak memory (GB)", figsize=(8, 3.6))
    width, top = 0.38, 0.0
    for i, (_, estimate, measured) in enumerate(cases):
        checks.number(estimate, "estimate", 0)
        label = None if i else f"estimate ({counts})"
        ax.bar(i - width / 2, estimate, width, color=kit.COLORS["estimate"], zorder=2, label=label)
        ax.text(i - width / 2, estimate, f"{estimate:.2f}", ha="center", va="bottom", fontsize=8)
        if isinstance(measured, (list, tuple)):  # the peak's parts, stacked, each labelled
            if not measured:
                raise ValueError("measured must be a number of GB, None, or the measured peak's parts")
            colors = _PEAK_COLORS + _PEAK_COLORS[-1:] * len(measured)
            bars = [(f"{name}: {_gb(gb)} GB", gb, color) for (name, gb), color in zip(measured, colors)]
        else:
            bars = [(None if i else "measured peak", 0.0 if measured is None else measured, kit.COLORS["measured"])]
        bottom = 0.0
        for label, gb, color in bars:
            height = max(0.0, checks.number(gb, "measured"))
            ax.bar(i + width / 2, height, width, bottom=bottom, color=color, zorder=2, label=label)
            bottom += height
        shown = "not run" if measured is None else f"{bottom:.2f}"
        ax.text(i + width / 2, bottom, shown, ha="center", va="bottom", fontsize=8)
        top = max(top, estimate, bottom)
    ax.set_xticks(range(len(cases)), [c[0] for c in cases])
    ax.set_ylim(0, top * 1.18 or 1)
    return kit.finish(fig, ax, loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8, ncol=2)


#: Custom size: the parameter count comes from the 'billions' control.
CUSTOM = "custom size (billions of parameters)"
#: The planner's models: the shipped configs (exact counts) and the lesson's round sizes (assumed adapter share).
_PRESET_CONFIGS = {
    "SmolLM2-135M (config)": "smollm2-135m",
    "Qwen2.5-1.5B (config)": "qwen2.5-1.5b-instruct",
    "Qwen3-4B (config)": "qwen3-4b-instruct-2507",
}
_ROUND_SIZES = {m.name: m for m in mem.MODELS[1:]}  # the lesson's models after SmolLM2: 1.7B, 7B, 70B
_MODEL_CHOICES = (*_PRESET_CONFIGS, *_ROUND_SIZES, CUSTOM)
#: The GPUs the step planner budgets against, each judged against its usable memory (a T4 15.83 GB: 15.33 GB).
_STEP_GPUS = ("T4", "L4", "A100-40GB", "H100")
_STYLE = {"description_width": "initial"}
#: A slider's options: its whole description shown, and a redraw only on release.
_SLIDER = {"style": _STYLE, "continuous_update": False}


@dataclass(frozen=True)
class Plan:
    """A planner's answer: the estimate, the budgets it is judged against, and the text under the bar."""

    estimate: Any
    budgets: tuple[Budget, ...]
    text: str


def plan(model: str, billions: float, method: str, lora_rank: int, budget_gb: float) -> Plan:
    """Estimate ``method`` on ``model`` at ``lora_rank`` against ``budget_gb`` GB. ``model``: a shipped config
    (exact counts, LoRA on q_proj and v_proj), a round size or :data:`CUSTOM` (``billions``; these assume the
    lesson's 0.34 % adapter share)."""
    checks.choice(model, "model", _MODEL_CHOICES)  # the method is checked by the estimate
    checks.integer(lora_rank, "lora_rank", 1, 1024)
    checks.positive(billions, "billions", 1000.0)
    line = mem.line_gb(budget_gb)
    if model in _PRESET_CONFIGS:
        size = mem.model_from_config(_PRESET_CONFIGS[model], lora_rank, name=model.replace(" (config)", ""))
    else:
        params = int(round(billions * GB))  # used for CUSTOM only
        size = _ROUND_SIZES.get(model, mem.ModelSize(mem.size_name(params), params))
    est = mem.estimate(size.params, method, adapter=size.adapter, lora_rank=lora_rank, name=size.name)
    if mem.ALL_METHODS[method].trains_all:
        trained = f"trains all {est.params:,} parameters"
    else:
        how = "assumed: 0.34% of the model x rank/8" if est.adapter_assumed else "counted from the config"
        trained = f"LoRA rank {lora_rank} trains {est.trained:,.0f} numbers ({how})"
    parts = " + ".join(f"{part} {_gb(gb)}" for part, gb in est.parts_gb().items())
    text = (
        f"{est.model}, {est.label}: {trained}.\n"
        f"Estimate: {est.gb:.2f} GB = {parts} GB (activations not included).\n"
        f"Memory {budget_gb:g} GB, 70 % line {line:g} GB: {'fits' if est.fits(budget_gb) else 'does not fit'} "
        f"(the estimate is {100 * est.gb / line:.0f} % of the line)."
    )
    return Plan(est, (Budget(f"{budget_gb:g} GB", float(budget_gb)),), text)


def method_options(methods: Mapping[str, Method] = mem.ALL_METHODS) -> list[tuple[str, str]]:
    """The planners' method menu, (label, key): the table's four, then the extras such as full fine-tuning in bf16."""
    return [(m.label, k) for k, m in methods.items()]


def planner_view(model: str, billions: float, method: str, lora_rank: int, budget_gb: float) -> tuple[str, Any]:
    """The budget planner's view: the plan's text, and its estimate's parts against the memory and its 70 % line."""
    result = plan(model, billions, method, lora_rank, budget_gb)
    est, line = result.estimate, mem.line_gb(budget_gb)
    title = f"What takes the memory: {est.model}, {est.label}"
    lines = [(budget_gb, "-", f"memory: {budget_gb:g} GB"), (line, "--", f"70 % line: {line:g} GB")]
    note = f"{est.gb:.2f} GB: {'fits' if est.fits(budget_gb) else 'does not fit'}"
    figure = _bar_against(title, "the estimate (activations not included)", "estimate", est.parts_gb(), lines, note)
    return result.text, figure


def _dropdown(description: str, options: Any, value: Any) -> Any:
    """An ipywidgets dropdown that shows its whole description."""
    import ipywidgets as w

    return w.Dropdown(options=options, value=value, description=description, style=_STYLE)


def budget_planner(
    model: str = "a 7B model",
    method: str = "lora-bf16",
    lora_rank: int = 8,
    budget_gb: float = 16.0,
    billions: float = 7.0,
) -> Any:
    """The budget-planner widget: pick a model, a method, a LoRA rank and a budget; see the estimate."""
    import ipywidgets as w

    plan(model, billions, method, lora_rank, budget_gb)  # bad defaults fail here, with a clear message
    controls = {
        "model": _dropdown("model", _MODEL_CHOICES, model),
        "billions": w.FloatLogSlider(
            value=billions, base=10, min=-1, max=3, step=0.05, description="custom size (B)", **_SLIDER
        ),
        "method": _dropdown("method", method_options(), method),
        "lora_rank": _dropdown("LoRA rank", [1, 2, 4, 8, 16, 32, 64, 128], lora_rank),
        "budget_gb": w.FloatSlider(value=budget_gb, min=2, max=160, step=2, description="memory (GB)", **_SLIDER),
    }
    # moving the size slider means "plan for this size": it never looks dead while a preset is selected
    controls["billions"].observe(lambda _change: setattr(controls["model"], "value", CUSTOM), names="value")
    return kit.view_panel(planner_view, first_row=["model", "billions"], **controls)


# ------------------------------- The whole-step planner: the step estimate (activations included) against GPU budgets
def step_plan(
    config: str = "smollm2-135m",
    method: str = "lora",
    batch: int = 8,
    seq: int = 512,
    checkpointing: bool = False,
    optimizer: str = "adamw",
) -> Plan:
    """Estimate one training step on a GPU (allocator counter; arguments as
    :func:`~course_utils.step_memory.estimate_step`'s) and say which of the lesson's GPUs it fits: per GPU its usable
    memory and :func:`~course_utils.memory.step_verdict`'s word (no 70 % line: the activations are counted)."""
    checks.flag(checkpointing, "checkpointing")
    step = {"method": method, "batch": batch, "seq": seq, "checkpointing": checkpointing, "optimizer": optimizer}
    budgets = tuple(mem.gpu_budget(g) for g in _STEP_GPUS)
    # one estimate per card: its attention kernel (and 16-bit dtype) can change the activations
    per_card = [estimate_step(config, **step, device="cuda", capability=b.capability) for b in budgets]
    est = per_card[-1]  # the newest card's: the bar and the parts
    parts = ", ".join(f"{k} {v / GB:.2f}" for k, v in est.categories().items())
    lines = [
        f"{est.describe()}: predicted peak {est.peak_gb:.2f} GB on a GPU ({parts} GB), "
        f"{est.attention.backend} attention.",
        f"Peak moment: {est.peak_moment}.",
    ]
    for budget, own in zip(budgets, per_card):
        usable = datasheets.usable_gb(budget.gb)
        other_kernel = own.peak_bytes != est.peak_bytes  # this card's attention kernel changes the peak
        differs = f"; {own.attention.backend} attention: {own.peak_gb:.2f} GB" if other_kernel else ""
        lines.append(
            f"  {budget.label}, usable {usable:.4g} GB: {mem.step_verdict(own.peak_gb, usable)} "
            f"({100 * own.peak_gb / usable:.0f} % of usable{differs})"
        )
    return Plan(est, budgets, "\n".join(lines))


def step_planner_view(
    config: str, method: str, batch: int, seq: int, checkpointing: bool, optimizer: str
) -> tuple[str, Any]:
    """The step planner's view: the plan's text, and the stacked bar against each GPU."""
    result = step_plan(config, method, batch, seq, checkpointing, optimizer)
    return result.text, plot_step_against_budgets(result.estimate, result.budgets)


def step_controls(
    config: str, method: str, batch: int, seq: int, methods: Mapping[str, Method] = mem.ALL_METHODS
) -> dict[str, Any]:
    """The step planners' controls (04's and 05's), keyed by their callbacks' arguments: the shipped presets,
    ``methods``, batch, tokens, the optimizer (AdamW first) and checkpointing (off first)."""
    import ipywidgets as w

    return {
        "config": _dropdown("model", list(config_presets()), config),
        "method": _dropdown("method", method_options(methods), method),
        "batch": _dropdown("batch", [1, 2, 4, 8, 16, 32, 64], batch),
        "seq": _dropdown("tokens", [128, 256, 512, 1024, 2048, 4096], seq),
        "optimizer": _dropdown("optimizer", [("AdamW", "adamw"), ("8-bit AdamW", "adamw8bit")], "adamw"),
        "checkpointing": w.Checkbox(value=False, description="gradient checkpointing"),
    }


def step_planner(config: str = "qwen2.5-1.5b-instruct", method: str = "lora", batch: int = 8, seq: int = 1024) -> Any:
    """The whole-step planner widget: model, method, batch, sequence length, optimizer, checkpointing."""
    step_plan(config, method, batch, seq)  # bad defaults fail here, clearly
    controls = step_controls(config, method, batch, seq)
    return kit.view_panel(step_planner_view, first_row=["config", "method"], **controls)


# ---------------------------------------------------- Exercise 1: bytes per parameter, the rule behind every estimate
#: Exercise 1's cases, in the order they are checked: (base_bits, trained, the method whose number it is, in words).
BYTES_CASES: tuple[tuple[int, bool, str, str], ...] = (
    (32, True, "full", "a weight in full fine-tuning (float32)"),
    (32, False, "lora", "a frozen weight of LoRA's float32 base"),
    (16, False, "lora-bf16", "a frozen weight of LoRA's bfloat16 base"),
    (4, False, "qlora", "a frozen weight of QLoRA's 4-bit base"),
    (16, True, "lora-bf16", "an adapter number of LoRA on a bfloat16 base"),
    (4, True, "qlora", "an adapter number of QLoRA"),
)


def _bytes_slips(bits: int, trained: bool) -> list[tuple[float, str]]:
    """Typical wrong answers for the case ``(bits, trained)``, each with its hint, in the order they are tried."""
    weight = bits / 8
    if trained:
        return [
            (4 * weight, f"All four numbers in {bits} bits? Only the frozen base is; what trains stays float32."),
            (weight + 12, f"Stored in {bits} bits? The method keeps it in float32 (the copy the optimizer updates)."),
            (12, "Itself, its gradient, two averages: 4 bytes each. Forgot the gradient, or counted one average?"),
            (8, "AdamW's two running averages are missing: 4 + 4 bytes, on top of the number and its gradient."),
            (4, "That is the number alone. Training adds its gradient and AdamW's two averages: 16 bytes in all."),
            (128, "That is in bits (4 numbers x 32 bits): divide by 8 for bytes."),
        ]
    as_trained = "You gave the frozen weight a gradient and AdamW's two averages: only trained numbers get them."
    return [
        (bits // 8, f"{bits} // 8 is {bits // 8}: integer division drops the half byte. Divide with /."),
        (4, f"That stores the frozen weight in float32. The base is stored in base_bits bits, here {bits}."),
        (16, as_trained),
        (weight + 12, as_trained),
        (weight + 8, "You counted AdamW's states for a frozen weight: it keeps them only for what it trains."),
        (weight + 4, "You gave the frozen weight a gradient: backward makes gradients only for trained numbers."),
        (bits, "That is in bits: divide by 8 for bytes."),
    ]


def check_bytes_per_parameter(fn: Any) -> Feedback:
    """Exercise 1: ``fn(base_bits, trained)``, the bytes one number keeps in a training step with AdamW."""
    name = "bytes_per_parameter"
    hint = "A trained number: 4 + 4 + 4 + 4 bytes, all float32; a frozen weight only itself: base_bits / 8 bytes."
    for bits, trained, method, what in BYTES_CASES:
        call = f"{name}({bits}, {trained})"
        got, feedback = kit.call_answer(fn, (bits, trained), name=name, call=call, hint=hint)
        if feedback is not None:
            return feedback
        # trained: itself, its gradient, AdamW's two averages; frozen: itself only
        expected = 4 * mem.METHODS[method].trained_bytes if trained else mem.METHODS[method].base_bytes
        slips = _bytes_slips(bits, trained)
        what_number = "a number of bytes"
        verdict = kit.check_number(got, expected, name=call, what=what_number, rel_tol=1e-3, mistakes=slips, hint=hint)
        if not verdict.correct:
            return Feedback(False, f"for {what}, {verdict.message}", verdict.hint)
    return kit.right(
        f"{name} gives each method's bytes on all {len(BYTES_CASES)} cases: 16 for a trained number; 4, "
        "2 and 0.5 for a frozen weight in float32, bfloat16 and 4 bits."
    )


# ----------------------------------------------------------------------------------- Exercise 2: the method that fits
#: Exercise 2's methods, in order: each gives up something more (every weight trained, the frozen ones' precision).
_ORDER = tuple(mem.METHODS)
_CHOICES = (*_ORDER, "none")


def best_method(params: float, budget_gb: float) -> str:
    """The first method of :data:`_ORDER` whose estimate fits ``budget_gb`` (its 70 % line), else 'none'."""
    return next((m for m in _ORDER if mem.estimate(params, m).fits(budget_gb)), "none")


def _check_method_for(answer: Any, model: str, budget_gb: float, name: str) -> Feedback:
    """Check a choice of the first method that fits ``model`` in ``budget_gb``; each wrong option's hint says why."""
    params = _ROUND_SIZES[model].params
    expected, line = best_method(params, budget_gb), mem.line_gb(budget_gb)
    est = {m: mem.estimate(params, m) for m in _ORDER}
    best = est.get(expected)  # None when no method fits
    hints = {}
    for m, e in est.items():
        needs = f"{e.label[0].upper() + e.label[1:]} needs {e.gb:.2f} GB"
        if e.gb > budget_gb:
            hints[m] = f"{needs}: more than the whole {budget_gb:g} GB."
        elif e.gb > line:
            hints[m] = f"{needs}: over its 70 % line ({line:g} GB); the other 30 % is for activations and the program."
        elif m != expected:
            hints[m] = f"{needs}: it fits, but {best.label} fits too ({best.gb:.2f} GB) and gives up less."
    if best is None:
        why = f"Even QLoRA needs {est['qlora'].gb:.2f} GB, over the 70 % line ({line:g} GB)."
    else:
        hints["none"] = f"{best.label} needs {best.gb:.2f} GB, within the 70 % line of {budget_gb:g} GB ({line:g} GB)."
        why = f"{best.label}: {best.gb:.2f} GB, within the 70 % line ({line:g} GB)."
    return kit.check_choice(answer, expected, name=name, options=_CHOICES, hints=hints, why=why)


def check_best_methods(method_8gb: Any, method_48gb: Any) -> Feedback:
    """Exercise 2: the first method that fits the 1.7B model on an 8 GB laptop, and the 70B model on a 48 GB GPU."""
    laptop = _check_method_for(method_8gb, "a 1.7B model", 8.0, "method_8gb")
    gpu = _check_method_for(method_48gb, "a 70B model", 48.0, "method_48gb")
    if not laptop.answered and not gpu.answered:
        return kit.unanswered("method_8gb and method_48gb", "one of " + ", ".join(repr(c) for c in _CHOICES))
    if not laptop.correct:
        return laptop
    if not gpu.correct:
        return Feedback(False, f"method_8gb is right; {gpu.message}", gpu.hint, gpu.answered)
    return kit.right(f"{laptop.message} {gpu.message}")


# ----------------------------------------------- One step's memory over time: predicted and measured on the same axes
#: A colour per kind of memory, in the order of :data:`course_utils.timeline.KINDS` (the bottom of a stack first).
KIND_COLORS = dict(zip(KINDS, ("#BBBBBB", "#4C72B0", "#8172B2", "#C44E52", "#55A868", "#CCB974")))


def _alive_gb(point: TimelinePoint, whole_process: bool) -> float:
    """The GB alive at ``point``: its tensors, or with ``whole_process`` the process's own memory too."""
    return (point.total if whole_process else tensor_total(point)) / GB


def stack_by_kind(ax: Any, timeline: Timeline, xs: Sequence[float], whole_process: bool, step: str | None) -> None:
    """Stack the kinds ``timeline`` holds (the framework only ``whole_process``) at ``xs``; ``step``: as stackplot's."""
    kinds = [k for k in KINDS if (whole_process or k != "framework") and timeline.kind_max(k) > 0]
    gb = [[p.by_kind.get(k, 0) / GB for p in timeline.points] for k in kinds]
    ax.stackplot(xs, gb, labels=kinds, colors=[KIND_COLORS[k] for k in kinds], alpha=0.85, step=step)


def _predicted_x(predicted: Timeline, measured: Timeline | None) -> list[float]:
    """Each predicted point's x: spread evenly over the time its phase took in the measured step (else its index)."""
    if measured is None or measured.times_s is None:
        return [float(i) for i in range(len(predicted.points))]
    xs: list[float] = []
    for phase in PHASES:
        times = [t for p, t in zip(measured.points, measured.times_s) if p.phase == phase]
        unmeasured = max(measured.times_s) if phase == "after zero_grad" else 0.0
        lo, hi = (min(times), max(times)) if times else (unmeasured, unmeasured)
        n = sum(p.phase == phase for p in predicted.points)
        xs += [lo + (hi - lo) * k / n for k in range(n)]  # each phase from its start
    return xs


def timeline_chart(
    predicted: Timeline,
    measured: Timeline | None = None,
    title: str = "One training step",
    *,
    whole_process: bool = False,
    measured_peak_bytes: int | None = None,
) -> Any:
    """The step's memory over time: the measured (else predicted) kinds stacked, the predicted total dashed, each
    peak named by its phase. ``whole_process``: the process's own memory too, at the bottom; ``measured_peak_bytes``:
    a peak measured some other way (a whole process's), dotted."""
    xlabel = "moments of the step, in order" if measured is None else "seconds into the step"
    ylabel = "GB alive" + ("" if whole_process else " (tensors)")
    fig, ax = kit.new_figure(title, xlabel, ylabel, figsize=(8.0, 3.8))
    px = _predicted_x(predicted, measured)
    # each peak: its marker, and its name's offset (the two names apart where the peaks meet)
    peaks = [(predicted, px, "predicted", "x", (6, -14))]
    if measured is None:
        stack_by_kind(ax, predicted, px, whole_process, step="post")
    else:
        xs = measured.times_s or list(range(len(measured.points)))
        stack_by_kind(ax, measured, xs, whole_process, step=None)
        peaks.append((measured, xs, "measured", "o", (6, 6)))
    totals = [_alive_gb(p, whole_process) for p in predicted.points]
    ax.step(px, totals, where="post", color="black", linestyle="--", linewidth=1.2, label="predicted total")
    if measured_peak_bytes is not None:
        ax.axhline(measured_peak_bytes / GB, color=kit.COLORS["measured"], linestyle=":", label="measured peak")
    for tl, xs, who, marker, offset in peaks:
        x, y = xs[tl.points.index(tl.peak)], _alive_gb(tl.peak, whole_process)
        ax.plot(x, y, marker, color="black")
        ax.annotate(f"{who} peak: {tl.peak.phase}", (x, y), textcoords="offset points", xytext=offset, fontsize=8)
    return kit.finish(fig, ax, fontsize=8, loc="upper left")


def timeline_text(predicted: Timeline, measured: Timeline | None = None, whole_process: bool = False) -> str:
    """The chart's text description: what is drawn, each peak with its phase and moment, and their gap."""

    def peak(tl: Timeline, who: str) -> str:
        size = _alive_gb(tl.peak, whole_process)
        return f"{who} peak {size:.2f} GB in {tl.peak.phase} ({tl.peak.label.split(' (')[0]})"

    kinds = ", ".join(k for k in KINDS if whole_process or k != "framework")
    what = "GB alive" if whole_process else "GB of tensors"
    head = f"Text description: {what} over the step, stacked by kind ({kinds}); dashed: predicted total."
    if measured is None:
        return f"{head}\n{peak(predicted, 'Predicted')}."
    gap = 100 * (tensor_total(predicted.peak) - tensor_total(measured.peak)) / tensor_total(measured.peak)
    return f"{head}\n{peak(measured, 'Measured')}; {peak(predicted, 'predicted')}: {gap:+.1f} %."
