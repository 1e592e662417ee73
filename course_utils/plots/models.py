"""Charts for real and stand-in models: where a model's bytes go at 16 and 4 bits."""
from __future__ import annotations

from typing import Any, Sequence

from course_utils.footprint import Part
from course_utils.plots import COLORS, new_figure
from course_utils.units import format_bytes

#: How the parts of :func:`course_utils.footprint.footprint_parts` are grouped in the chart.
GROUPS: dict[str, tuple[str, ...]] = {
    "embedding table (stays 16-bit)": ("embedding table", "lm_head"),
    "linear layers (quantized)": ("attention linears (q, k, v, o)", "MLP linears (gate, up, down)", "other linears"),
    "norms, biases, buffers (16-bit)": ("linear biases", "norms", "other parameters", "buffers"),
}
_GROUP_COLORS = ("#C44E52", COLORS["nf4"], "#8C8C8C")


def group_bytes(parts: Sequence[Part]) -> dict[str, int]:
    """Bytes per chart group (embedding, linears, the rest) from a list of parts."""
    if not parts or not all(isinstance(p, Part) for p in parts):
        raise TypeError("parts must be a non-empty list of course_utils.footprint.Part (from footprint_parts)")
    out = {g: 0 for g in GROUPS}
    for part in parts:
        group = next((g for g, names in GROUPS.items() if part.name in names), None)
        if group is None:
            raise ValueError(f"unknown part name {part.name!r}")
        out[group] += part.bytes
    return out


def footprint_chart(bars: Sequence[tuple[str, Sequence[Part], int]],
                    title: str = "Where the bytes go: 16-bit vs 4-bit NF4") -> Any:
    """Stacked horizontal bars, each as a percentage of its model's 16-bit size.

    ``bars``: ``(label, parts, bytes16)`` per bar, top to bottom; ``bytes16`` is the 16-bit total that
    the bar is scaled against. A dashed line marks 25 %, what 4 bits would give if every weight shrank.
    """
    if not bars:
        raise ValueError("bars must hold at least one (label, parts, bytes16) entry")
    fig, ax = new_figure(title, "share of the same model's 16-bit footprint (%)", "model and width",
                         figsize=(8.0, 0.75 * len(bars) + 2.0))
    labels = []
    for row, (label, parts, bytes16) in enumerate(bars):
        if not isinstance(bytes16, int) or bytes16 <= 0:
            raise ValueError(f"bytes16 for {label!r} must be a positive int, got {bytes16!r}")
        groups = group_bytes(parts)
        left = 0.0
        for (group, value), color in zip(groups.items(), _GROUP_COLORS):
            width = 100 * value / bytes16
            ax.barh(row, width, left=left, color=color, label=group if row == 0 else None, height=0.6)
            left += width
        ax.text(left + 1, row, f"{format_bytes(sum(groups.values()))}  ({left:.0f} %)", va="center", fontsize=9)
        labels.append(label)
    ax.axvline(25, color="black", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(bars)), labels)
    ax.set_ylim(len(bars) - 0.5, -0.9)  # top to bottom, with room above the first bar for the 25 % label
    ax.text(25.8, -0.62, "25 %: a quarter of the 16-bit size", fontsize=8)
    ax.set_xlim(0, 130)
    ax.legend(loc="upper center", bbox_to_anchor=(0.35, -0.2), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
