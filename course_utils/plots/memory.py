"""Charts of notebook 04 (memory budgets): methods against budgets, what takes the memory, estimate vs measured."""
from __future__ import annotations

from typing import Any, Sequence

from course_utils.memory import BUDGETS, Budget, MemoryEstimate, usable_gb
from course_utils.plots import COLORS, new_figure

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


def measured_description(estimate_gb: float, measured_gb: float, seq: int) -> str:
    """A one-paragraph text description of :func:`plot_estimate_vs_measured` for this machine's numbers."""
    ratio = measured_gb / estimate_gb if estimate_gb > 0 else float("nan")
    return (f"Four columns. The team's estimate for LoRA on SmolLM2-135M in float32: 0.54 GB; the peak they "
            f"measured at batch 8: 1.88 GB. This machine's estimate: {estimate_gb:.2f} GB; its measured peak at "
            f"batch 8 and {seq} tokens per sequence: {measured_gb:.2f} GB, {ratio:.1f} times the estimate, split "
            "into the framework's baseline, the weights, the gradients, the AdamW states, the activations saved for "
            "backward and the rest.")



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
    parts = {part: nbytes / 1e9 for part, nbytes in estimate.categories().items()}
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
