"""Charts for notebook 05: the tricks measured, estimate vs measured, and what a step's peak is made of."""
from __future__ import annotations

from typing import Any, Sequence

from course_utils.plots import COLORS, new_figure, plt

GB = 1e9
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


def describe_breakdown(estimate: Any, budget_gb: float | None = None) -> str:
    """Text description of :func:`breakdown_chart`."""
    parts = "; ".join(f"{label} {b / GB:.2f} GB" for label, b in estimate.parts())
    tail = "" if budget_gb is None else f" A dashed line marks the {budget_gb:g} GB budget."
    return (f"One horizontal bar of {estimate.peak_gb:.2f} GB split into the parts present at the peak moment "
            f"({estimate.peak_moment}), left to right: {parts}.{tail}")
