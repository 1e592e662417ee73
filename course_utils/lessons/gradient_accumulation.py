"""Notebook 03 (gradient accumulation): its chart, its widget and its exercises.

What a smaller micro-batch saves (memory) and costs (time), drawn from rows measured by
:mod:`course_utils.accumulation`, whose functions also give every expected answer.
"""

import copy
import math
from functools import partial
from typing import Any, Callable, Sequence

import torch
from matplotlib.ticker import FuncFormatter, NullFormatter

from course_utils import accumulation as acc
from course_utils import checks
from course_utils.lessons import kit
from course_utils.lessons.kit import Feedback, plt
from course_utils.units import format_bytes


def _draw_sweep(ax: Any, sizes: list[int], values: list[float], title: str, ylabel: str, color: str) -> None:
    """One panel of the sweep: ``values`` over the micro-batch ``sizes``, both axes logarithmic, plain numbers."""
    ax.plot(sizes, values, "o-", color=kit.COLORS[color], label="measured")
    ax.set(title=title, xlabel="micro-batch size (examples)", ylabel=ylabel, yscale="log")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 100, not 10^2
    ax.yaxis.set_minor_formatter(NullFormatter())


def plot_micro_batch_sweep(
    rows: Sequence[acc.MicroBatchRow], highlight: int | None = None, budget_bytes: int | None = None
) -> Any:
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
    memory = [r.activation_bytes / 1e3 for r in rows]  # KB
    times = [r.seconds * 1e3 for r in rows]  # ms
    fig, (ax_mem, ax_time) = plt.subplots(1, 2, figsize=(10, 3.8))
    fig.suptitle(f"One batch of {batch}, run as micro-batches: same gradient, less memory, more time")
    _draw_sweep(ax_mem, sizes, memory, "Activation memory of one micro-batch", "activation memory (KB)", "measured")
    time_title = f"Time for all {batch} examples (forward + backward)"
    _draw_sweep(ax_time, sizes, times, time_title, "wall time (ms)", "estimate")
    if budget_bytes is not None:
        room = f"room on the pretend GPU ({format_bytes(budget_bytes)})"
        ax_mem.axhline(budget_bytes / 1e3, color=kit.COLORS["float16"], linestyle="--", label=room)
    if highlight is not None:
        ring = {"markersize": 14, "markerfacecolor": "none", "markeredgecolor": "black"}
        for ax, values in ((ax_mem, memory), (ax_time, times)):
            ax.plot([highlight], [values[sizes.index(highlight)]], "o", label=f"micro-batch {highlight}", **ring)
    ax_mem.legend(loc="upper left", fontsize=8)
    ax_time.legend(loc="upper right", fontsize=8)
    return kit.finish(fig)


def show_micro_batch(micro_batch_size: int, rows: Sequence[acc.MicroBatchRow], budget_bytes: int | None = None) -> None:
    """The widget's callback: print the summary for one micro-batch size and show the sweep chart.

    ``rows`` come from :func:`course_utils.accumulation.sweep_micro_batches` (measured once, so moving the
    slider is instant).
    """
    print(acc.micro_batch_summary(rows, micro_batch_size, budget_bytes))
    plot_micro_batch_sweep(rows, highlight=micro_batch_size, budget_bytes=budget_bytes)
    plt.show()


def micro_batch_widget(rows: Sequence[acc.MicroBatchRow], budget_bytes: int | None = None, value: int = 16) -> Any:
    """A slider over the measured micro-batch sizes wired to :func:`show_micro_batch`."""
    import ipywidgets as w

    sizes = [r.micro_batch_size for r in rows]
    checks.choice(value, "value", sizes)
    slider = w.SelectionSlider(options=sizes, value=value, description="micro-batch", continuous_update=False)
    slider.style.description_width = "initial"
    return kit.interact_panel(partial(show_micro_batch, rows=rows, budget_bytes=budget_bytes), micro_batch_size=slider)


#: Exercise 1: the check's three updates, each ``(batch size, micro-batches)``, on one model and optimizer as in a
#: training loop. The last batch does not split evenly: ``x.chunk(4)`` cuts 10 examples into 3, 3, 3 and 1.
_UPDATES = ((8, 4), (8, 4), (10, 4))
#: Plain SGD's learning rate in the check: the weights move by lr x the gradient, which the check reads back.
_LR = 0.5


def _accumulation_case() -> tuple[torch.nn.Linear, torch.optim.SGD, list[tuple[torch.Tensor, torch.Tensor, int]]]:
    """The check's linear layer (10 -> 1, float64, seed 0), its SGD optimizer, and one seeded batch per update."""
    with torch.random.fork_rng(devices=[]):  # leave the caller's random stream alone
        torch.manual_seed(0)
        model = torch.nn.Linear(10, 1).double()
    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(n, 10, generator=g).double(), torch.randn(n, 1, generator=g).double(), k) for n, k in _UPDATES
    ]
    return model, torch.optim.SGD(model.parameters(), lr=_LR), batches


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``tensors`` (one per parameter), detached and flattened into one vector."""
    return torch.cat([t.detach().flatten() for t in tensors])


def _near(got: torch.Tensor, want: torch.Tensor) -> bool:
    """True when ``got`` is ``want`` up to float64 rounding (a relative 1e-6 of its size)."""
    return bool(torch.isfinite(got).all()) and float((got - want).norm()) <= 1e-6 * float(want.norm())


def _update_slips(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, k: int, carried: torch.Tensor
) -> list[tuple[torch.Tensor, str]]:
    """The gradient each typical slip gives on this update (from a copy of ``model``), with the hint it earns.

    ``carried`` is this update's gradient plus the previous one's (zero on the first update): what a loop that never
    zeroes ``.grad`` gives.
    """
    probe = copy.deepcopy(model)
    chunks = [_flat(acc.accumulated_gradients(probe, xb, yb)) for xb, yb in zip(x.chunk(k), y.chunk(k))]
    splits = [_flat(acc.accumulated_gradients(probe, xb, yb)) for xb, yb in zip(x.tensor_split(k), y.tensor_split(k))]
    sizes = [len(xb) for xb in x.chunk(k)]
    shares = " or ".join(f"1/{round(1 / w)}" for w in sorted(set(acc.weight_per_item(sizes, "micro_mean"))))
    unweighted = (
        f"x.chunk({k}) cuts {len(x)} examples into {', '.join(map(str, sizes))}: dividing each mean loss by {k} gives "
        f"one example {shares} of the gradient, not 1/{len(x)}. Weight each micro-batch's loss by len(xb) / len(x)."
    )
    once = "Zero once per update, before the loop (or after optimizer.step())."
    wiped = f"zero_grad() inside the loop wipes the earlier ones. {once}"
    too_large = (
        f"The gradient is {k} times too large: each backward() adds into .grad, so divide each micro-batch's loss by "
        f"the {k} micro-batches (more exactly: multiply it by len(xb) / len(x))."
    )
    return [
        (sum(chunks), too_large),
        (chunks[-1] / k, f"Only the last micro-batch's gradient is left: {wiped}"),
        (chunks[-1], f"Only the last micro-batch's gradient is left, undivided: {wiped}"),
        (sum(chunks) / k, unweighted),
        (sum(splits) / k, unweighted),
        (carried, f"This update also carried the previous update's gradient: .grad adds up until you zero it. {once}"),
    ]


def check_accumulation_step(fn: Any) -> Feedback:
    """Check ``fn(model, optimizer, x, y, micro_batches)``: one update equal to the big batch's, and its loss."""
    name = "accumulation_step"
    model, optimizer, batches = _accumulation_case()
    steps: list[int] = []
    optimizer.register_step_post_hook(lambda *_: steps.append(1))
    hint = (
        "Zero the gradients; for each micro-batch, backward() its mean loss times len(xb) / len(x); then one "
        "optimizer.step(). Return the batch's loss, the sum of those weighted losses."
    )
    previous = torch.zeros(())  # the previous update's gradient: none before the first
    for i, (x, y, k) in enumerate(batches, 1):
        before = _flat(model.parameters())
        want = _flat(acc.accumulated_gradients(copy.deepcopy(model), x, y))
        with torch.no_grad():
            want_loss = float(torch.nn.functional.mse_loss(model(x), y))
        slips = _update_slips(model, x, y, k, previous + want)
        steps.clear()
        call = f"{name} on update {i} ({len(x)} examples, {k} micro-batches)"
        got, feedback = kit.call_answer(fn, (model, optimizer, x, y, k), name=name, call=call, hint=hint)
        if feedback is not None:
            return feedback
        if len(steps) != 1:
            once = "Step once, after the loop: one update per batch."
            none = "Call optimizer.step() once, after the loop, on the optimizer you are given."
            return kit.wrong(f"{call} called optimizer.step() {len(steps)} times.", once if steps else none)
        gradient = (before - _flat(model.parameters())) / _LR
        if not _near(gradient, want):
            slip = next((why for wrong_gradient, why in slips if _near(gradient, wrong_gradient)), hint)
            return kit.wrong(f"{call} moved the weights differently from one step on the whole batch.", slip)
        loss = kit.one_number(got)
        if not isinstance(loss, float):
            return kit.wrong(f"{name} should return the batch's loss, one number; got {type(got).__name__}.", hint)
        if not math.isclose(loss, want_loss, rel_tol=1e-6):
            summed = "Add up the weighted micro-batch losses (loss.item() each): their sum is the batch's loss."
            return kit.wrong(f"{call} returned {loss:.6g}; the batch's mean loss is {want_loss:.6g}.", summed)
        previous = want
    last_x, _, last_k = batches[-1]
    return kit.right(
        f"{name} moves the weights exactly as one step on the whole batch, on all {len(batches)} updates, including "
        f"{len(last_x)} examples in {last_k} micro-batches."
    )


#: Exercise 2's hand-made cases: ``((mean_losses, token_counts), batch loss)``. The first tells every typical
#: mistake apart; the second has equal counts, where the mean of the means happens to be right.
_BATCH_LOSS_CASES: tuple[tuple[tuple[list[float], list[int]], float], ...] = (
    (([2.0, 4.0], [1, 3]), 3.5),
    (([1.0, 3.0], [5, 5]), 2.0),
    (([2.5], [7]), 2.5),
    (([1.0, 2.0, 3.0, 4.0], [10, 20, 30, 40]), 3.0),
)


def token_case() -> tuple[list[float], list[int], float]:
    """Exercise 2's real case: the notebook's padded batch in micro-batches of 2 sequences.

    Returns each micro-batch's mean token loss, its real-token count, and the big batch's mean token loss, all
    from :class:`~course_utils.accumulation.TinyTokenModel` on :func:`~course_utils.accumulation.padded_token_batch`.
    """
    tokens, labels = acc.padded_token_batch()
    with torch.random.fork_rng(devices=[]):  # the model seeds torch's generator: leave the caller's untouched
        model = acc.TinyTokenModel()
    with torch.no_grad():
        sums = [acc.token_loss_sum(model, tb, lb) for tb, lb in zip(tokens.split(2), labels.split(2))]
        total, n_all = acc.token_loss_sum(model, tokens, labels)
    return [float(s) / n for s, n in sums], [n for _, n in sums], float(total) / n_all


#: Exercise 2's typical wrong formulas, each with the hint it earns.
_BATCH_LOSS_MISTAKES: tuple[tuple[Callable[[Sequence[float], Sequence[int]], float], str], ...] = (
    (
        lambda m, n: sum(m) / len(m),
        "That is the mean of the micro-batch means: the padding trap. A micro-batch of 6 tokens then counts as much as "
        "one of 58. Weight each mean by its number of tokens.",
    ),
    (
        lambda m, n: sum(m),
        "You added the means without dividing: the bug of forgetting `/ accumulation_steps`. Turn each mean back into "
        "a sum (mean x its tokens), add them up, and divide by all the tokens.",
    ),
    (
        lambda m, n: sum(a * b for a, b in zip(m, n)),
        "That is the sum of every token's loss. Divide it by the total number of real tokens.",
    ),
    (
        lambda m, n: sum(a * b for a, b in zip(m, n)) / len(m),
        "Divide the summed token losses by the number of tokens, not by the number of micro-batches.",
    ),
    (
        lambda m, n: sum(m) / sum(n),
        "Each mean is already divided by its token count: multiply it back (mean x tokens), then divide by all tokens.",
    ),
)


def check_batch_loss(fn: Any) -> Feedback:
    """Exercise 2: ``fn(mean_losses, token_counts)`` must give the batch's mean loss per real token."""
    means, counts, full = token_case()
    cases = [*_BATCH_LOSS_CASES, ((means, counts), full)]
    hint = "Mean x token count is each micro-batch's summed loss; add those up and divide by all the real tokens."
    verdict = kit.check_function(fn, cases, name="batch_loss", rel_tol=1e-5, hint=hint, mistakes=_BATCH_LOSS_MISTAKES)
    if verdict.correct:
        return kit.right(
            f"batch_loss gives the big batch's mean token loss on all {len(cases)} cases, including "
            f"the notebook's batch ({counts} tokens: {full:.4f})."
        )
    return verdict
