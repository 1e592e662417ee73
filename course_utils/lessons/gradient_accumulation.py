"""Notebook 03 (gradient accumulation): its chart, its widget and its exercises.

What a smaller micro-batch saves (memory) and costs (time), drawn from rows measured by
:mod:`course_utils.accumulation`, whose functions also give every expected answer.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Sequence

from matplotlib.ticker import FuncFormatter, NullFormatter

from course_utils import accumulation as acc
from course_utils import checks
from course_utils.accumulation import MicroBatchRow
from course_utils.lessons import kit
from course_utils.lessons.kit import Feedback, plt
from course_utils.units import format_bytes


def plot_micro_batch_sweep(rows: Sequence[MicroBatchRow], highlight: int | None = None,
                           budget_bytes: int | None = None) -> Any:
    """Two panels over micro-batch size: activation memory (left) and time for the whole batch (right).

    ``highlight`` marks one micro-batch size; ``budget_bytes`` draws the activation memory a pretend GPU
    has room for.
    """
    if not rows:
        raise ValueError("rows must hold at least one measured micro-batch size")
    if highlight is not None:
        acc.find_row(rows, highlight)
    if budget_bytes is not None:
        checks.positive(budget_bytes, "budget_bytes")
    sizes = [r.micro_batch_size for r in rows]
    batch = rows[0].micro_batch_size * rows[0].accumulation_steps
    fig, (ax_mem, ax_time) = plt.subplots(1, 2, figsize=(10, 3.8))
    fig.suptitle(f"One batch of {batch}, run as micro-batches: same gradient, less memory, more time")
    panels = (  # axes, values, colour, title, y label, legend corner
        (ax_mem, [r.activation_bytes / 1e3 for r in rows], "measured", "Activation memory of one micro-batch",
         "activation memory (KB)", "upper left"),
        (ax_time, [r.seconds * 1e3 for r in rows], "estimate", f"Time for all {batch} examples (forward + backward)",
         "wall time (ms)", "upper right"),
    )
    for ax, values, color, title, ylabel, corner in panels:
        ax.plot(sizes, values, "o-", color=kit.COLORS[color], label="measured")
        if budget_bytes is not None and ax is ax_mem:
            ax.axhline(budget_bytes / 1e3, color=kit.COLORS["float16"], linestyle="--",
                       label=f"room on the pretend GPU ({format_bytes(budget_bytes)})")
        ax.set(title=title, xlabel="micro-batch size (examples)", ylabel=ylabel, yscale="log")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 100, not 10^2
        ax.yaxis.set_minor_formatter(NullFormatter())
        if highlight is not None:
            ax.plot([highlight], [values[sizes.index(highlight)]], "o", markersize=14, markerfacecolor="none",
                    markeredgecolor="black", label=f"micro-batch {highlight}")
        ax.legend(loc=corner, fontsize=8)
    return kit.finish(fig)


def show_micro_batch(micro_batch_size: int, rows: Sequence[MicroBatchRow], budget_bytes: int | None = None) -> Any:
    """The widget's callback: print the summary for one micro-batch size and draw the sweep chart.

    ``rows`` come from :func:`course_utils.accumulation.sweep_micro_batches` (measured once, so moving the
    slider is instant). Returns the figure (also shown).
    """
    print(acc.micro_batch_summary(rows, micro_batch_size, budget_bytes))
    fig = plot_micro_batch_sweep(rows, highlight=micro_batch_size, budget_bytes=budget_bytes)
    plt.show()
    return fig


def micro_batch_widget(rows: Sequence[MicroBatchRow], budget_bytes: int | None = None, value: int = 16) -> Any:
    """A slider over the measured micro-batch sizes wired to :func:`show_micro_batch`."""
    import ipywidgets as w

    sizes = [r.micro_batch_size for r in rows]
    if value not in sizes:
        raise ValueError(f"value must be one of the measured sizes {sizes}, got {value!r}")
    slider = w.SelectionSlider(options=sizes, value=value, description="micro-batch",
                               continuous_update=False, style={"description_width": "initial"})
    return kit.interact_panel(partial(show_micro_batch, rows=rows, budget_bytes=budget_bytes), micro_batch_size=slider)


#: Exercise 1: a recipe's effective batch on one GPU, the micro-batch that fits, and a colleague's uneven choice.
_TRIPS_BATCH, _TRIPS_MICRO, _TRIPS_UNEVEN = 48, 8, 10

#: Exercise 2's hand-made cases: ``((mean_losses, token_counts), batch loss)``. The first tells every typical
#: mistake apart; the second has equal counts, where the mean of the means happens to be right.
_BATCH_LOSS_CASES: tuple[tuple[tuple[list[float], list[int]], float], ...] = (
    (([2.0, 4.0], [1, 3]), 3.5),
    (([1.0, 3.0], [5, 5]), 2.0),
    (([2.5], [7]), 2.5),
    (([1.0, 2.0, 3.0, 4.0], [10, 20, 30, 40]), 3.0),
)


def check_trips(steps: Any, last_trip_weight: Any) -> Feedback:
    """Exercise 1: the steps for 48 = 8 x steps, and one example's weight in the short trip of a loop in 10s."""
    batch, micro, uneven = _TRIPS_BATCH, _TRIPS_MICRO, _TRIPS_UNEVEN
    trips = acc.trip_sizes(batch, uneven)
    n_trips, last = len(trips), trips[-1]
    # the answers: accumulation steps on one GPU, and each trip's mean divided by the trips, in the short trip
    want_steps = acc.accumulation_steps_for(batch, micro)
    weights = acc.weight_per_item(trips, "micro_mean")
    want, others = weights[-1], weights[0]
    first = kit.check_number(
        steps, want_steps, name="steps", what=f"the number of micro-batches of {micro} per update",
        rel_tol=0, abs_tol=1e-9,
        mistakes=[(batch * micro, f"micro-batch x steps = batch, so divide: steps = {batch} / {micro}."),
                  (micro / batch, f"Upside down: how many micro-batches of {micro} make {batch}?"),
                  (micro, f"{micro} is the micro-batch size; the question asks how many of them make {batch}."),
                  (batch, f"{batch} is the effective batch; the question asks how many micro-batches of {micro} "
                          "make it.")],
        hint=f"steps = effective batch / micro-batch (one GPU), as in acc.accumulation_steps_for({batch}, {micro}).")
    if not first.correct:
        return first
    if kit.is_placeholder(last_trip_weight):
        done = kit.unanswered("last_trip_weight", "the weight of one example of the last trip (e.g. 1 / 7)")
        return Feedback(False, f"steps = {want_steps} is right; now {done.message}", answered=False)
    second = kit.check_number(
        last_trip_weight, want, name="last_trip_weight", what="the weight of one example of the last trip",
        rel_tol=0.01,
        mistakes=[(1 / batch, f"1/{batch} is what every example gets in the big batch, and what a correct loop "
                              f"must give. This loop takes the mean over the trip's {last} examples, then divides "
                              f"by {n_trips} trips."),
                  (1 / (n_trips * uneven), f"1/{n_trips * uneven} is the weight of an example in a full trip of "
                                           f"{uneven}. The last trip holds only {last}."),
                  (1 / last, f"That is the trip's mean alone: the loop also divides by the {n_trips} trips."),
                  (1 / n_trips, f"1/{n_trips} is the weight of the whole trip; its {last} examples share it."),
                  (1 / (len(trips) - 1) / last, f"The loop runs {n_trips} trips, not {n_trips - 1}: "
                                                f"{batch} = {' + '.join(map(str, trips))}.")],
        hint=f"One example of a trip of n examples weighs (1 / n) x (1 / {n_trips}).")
    if not second.correct:
        return second
    return kit.right(f"steps = {want_steps}, and last_trip_weight = 1/{round(1 / want)} = {want:g}: each of the "
                 f"{last} examples of the short trip counts {want / others:.2f}x as much as the others (1/"
                 f"{round(1 / others)}), instead of 1/{batch} for all. That is why acc.accumulation_steps_for("
                 f"{batch}, {uneven}) refuses the split.")


def token_case() -> tuple[list[float], list[int], float]:
    """Exercise 2's real case: the notebook's padded batch in micro-batches of 2 sequences.

    Returns each micro-batch's mean token loss, its real-token count, and the big batch's mean token loss, all
    from :class:`~course_utils.accumulation.TinyTokenModel` on :func:`~course_utils.accumulation.padded_token_batch`.
    """
    import torch

    tokens, labels = acc.padded_token_batch()
    with torch.random.fork_rng(devices=[]):  # the model seeds torch's generator: leave the caller's untouched
        model = acc.TinyTokenModel()
    with torch.no_grad():
        sums = [acc.token_loss_sum(model, tb, lb) for tb, lb in zip(tokens.split(2), labels.split(2))]
        total, n_all = acc.token_loss_sum(model, tokens, labels)
    return [float(s) / n for s, n in sums], [n for _, n in sums], float(total) / n_all


#: Exercise 2's typical wrong formulas, each with the hint it earns.
_BATCH_LOSS_MISTAKES: tuple[tuple[Callable[[Sequence[float], Sequence[int]], float], str], ...] = (
    (lambda m, n: sum(m) / len(m),
     "That is the mean of the micro-batch means: the padding trap. A micro-batch of 6 tokens then counts as much as "
     "one of 58. Weight each mean by its number of tokens."),
    (lambda m, n: sum(m),
     "You added the means without dividing: the bug of forgetting `/ accumulation_steps`. Turn each mean back into "
     "a sum (mean x its tokens), add them up, and divide by all the tokens."),
    (lambda m, n: sum(a * b for a, b in zip(m, n)),
     "That is the sum of every token's loss. Divide it by the total number of real tokens."),
    (lambda m, n: sum(a * b for a, b in zip(m, n)) / len(m),
     "Divide the summed token losses by the number of tokens, not by the number of micro-batches."),
    (lambda m, n: sum(m) / sum(n),
     "Each mean is already divided by its own token count: multiply it back (mean x tokens) before dividing by "
     "all the tokens."),
)


def check_batch_loss(fn: Any) -> Feedback:
    """Exercise 2: ``fn(mean_losses, token_counts)`` must give the batch's mean loss per real token."""
    means, counts, full = token_case()
    cases = [*_BATCH_LOSS_CASES, ((means, counts), full)]
    hint = ("Each micro-batch's mean times its token count is its summed loss; add those up and divide by all the "
            "real tokens of the batch.")
    verdict = kit.check_function(fn, cases, name="batch_loss", rel_tol=1e-5, hint=hint, mistakes=_BATCH_LOSS_MISTAKES)
    if verdict.correct:
        return kit.right(f"batch_loss gives the big batch's mean token loss on all {len(cases)} cases, including "
                         f"the notebook's batch ({counts} tokens: {full:.4f}).")
    return verdict
