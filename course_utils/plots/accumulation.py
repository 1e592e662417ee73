"""Charts for gradient accumulation: what a smaller micro-batch saves (memory) and costs (time)."""
from __future__ import annotations

from typing import Any, Sequence

from matplotlib.ticker import FuncFormatter, NullFormatter

from .. import checks
from ..accumulation import MicroBatchRow, find_row, proportion_check
from ..units import format_bytes
from . import COLORS, plt


def _check_rows(rows: Sequence[MicroBatchRow]) -> None:
    if not rows:
        raise ValueError("rows must hold at least one measured micro-batch size")


def plot_micro_batch_sweep(rows: Sequence[MicroBatchRow], highlight: int | None = None,
                           budget_bytes: int | None = None) -> Any:
    """Two panels over micro-batch size: activation memory (left) and time for the whole batch (right).

    ``highlight`` marks one micro-batch size; ``budget_bytes`` draws the activation memory a pretend GPU
    has room for.
    """
    _check_rows(rows)
    if highlight is not None:
        find_row(rows, highlight)
    if budget_bytes is not None:
        checks.positive(budget_bytes, "budget_bytes")
    sizes = [r.micro_batch_size for r in rows]
    batch = rows[0].micro_batch_size * rows[0].accumulation_steps
    fig, (ax_mem, ax_time) = plt.subplots(1, 2, figsize=(10, 3.8))
    fig.suptitle(f"One batch of {batch}, run as micro-batches: same gradient, less memory, more time")

    mem_kb = [r.activation_bytes / 1e3 for r in rows]
    ax_mem.plot(sizes, mem_kb, "o-", color=COLORS["measured"], label="measured")
    if budget_bytes is not None:
        ax_mem.axhline(budget_bytes / 1e3, color=COLORS["float16"], linestyle="--",
                       label=f"room on the pretend GPU ({format_bytes(budget_bytes)})")
    ax_mem.set_title("Activation memory of one micro-batch")
    ax_mem.set_xlabel("micro-batch size (examples)")
    ax_mem.set_ylabel("activation memory (KB)")

    ms = [r.seconds * 1e3 for r in rows]
    ax_time.plot(sizes, ms, "o-", color=COLORS["estimate"], label="measured")
    ax_time.set_title(f"Time for all {batch} examples (forward + backward)")
    ax_time.set_xlabel("micro-batch size (examples)")
    ax_time.set_ylabel("wall time (ms)")

    for ax in (ax_mem, ax_time):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
    for ax in (ax_mem, ax_time):
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 100, not 10^2
        ax.yaxis.set_minor_formatter(NullFormatter())
    if highlight is not None:
        row = find_row(rows, highlight)
        ax_mem.plot([highlight], [row.activation_bytes / 1e3], "o", markersize=14, markerfacecolor="none",
                    markeredgecolor="black", label=f"micro-batch {highlight}")
        ax_time.plot([highlight], [row.seconds * 1e3], "o", markersize=14, markerfacecolor="none",
                     markeredgecolor="black", label=f"micro-batch {highlight}")
    ax_mem.legend(loc="upper left", fontsize=8)
    ax_time.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


def describe_micro_batch_sweep(rows: Sequence[MicroBatchRow], budget_bytes: int | None = None) -> str:
    """The text description printed under the chart, with this run's numbers."""
    _check_rows(rows)
    small = min(rows, key=lambda r: r.micro_batch_size)
    big = max(rows, key=lambda r: r.micro_batch_size)
    batch = big.micro_batch_size * big.accumulation_steps
    growth = ("grows in proportion to the micro-batch size" if proportion_check(rows).holds
              else "grows with the micro-batch size, but not in proportion")
    text = (f"Left panel: activation memory {growth}, from "
            f"{format_bytes(small.activation_bytes)} at micro-batch {small.micro_batch_size} to "
            f"{format_bytes(big.activation_bytes)} at {big.micro_batch_size}. "
            f"Right panel: the time for all {batch} examples falls as micro-batches grow, from "
            f"{small.seconds * 1e3:.1f} ms ({small.accumulation_steps} micro-batches) to "
            f"{big.seconds * 1e3:.1f} ms ({big.accumulation_steps}). "
            f"Every size gives the same gradient: {all(r.same_gradient for r in rows)}.")
    if budget_bytes is not None:
        fitting = [r.micro_batch_size for r in rows if r.activation_bytes <= budget_bytes]
        text += (f" The dashed line is the room on the pretend GPU ({format_bytes(budget_bytes)}); "
                 f"micro-batch sizes that fit under it: {fitting}.")
    return text
