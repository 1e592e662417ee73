"""Gradient accumulation: several small trips instead of one overloaded one.

A batch that does not fit is split into micro-batches. Each micro-batch runs forward and backward;
PyTorch *adds* the gradients into ``.grad``; dividing each micro-batch's loss by the number of
micro-batches turns that sum into the big batch's average. After the last micro-batch the optimizer
steps once. With data parallelism (see :mod:`course_utils.ddp`) every process does this on its own
slice of the batch, so::

    effective batch = micro-batch size x accumulation steps x number of processes (GPUs)

This module holds the small pieces the notebook ``03_gradient_accumulation`` calls:

- the batch arithmetic, with clear errors for sizes that cannot work;
- the equality check (one batch vs accumulated micro-batches) and a gradient comparison;
- a micro-batch sweep that measures activation memory and wall time honestly on CPU and GPU;
- the padding trap (per-micro-batch mean losses) and its fix (sum of token losses / total tokens);
- the small dataset and models of the training loops (plain PyTorch and Hugging Face ``Trainer``).
"""

import math
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from course_utils import checks, hardware
from course_utils.digits import make_mlp
from course_utils.training_step import saved_for_backward
from course_utils.units import format_bytes, format_seconds

#: The micro-batch sizes the notebook's sweep and widget offer (all divide the batch of 64).
MICRO_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)


# --------------------------------------------------------------------------------------------
# Batch arithmetic
# --------------------------------------------------------------------------------------------
def accumulation_steps_for(batch_size: int, micro_batch_size: int, world_size: int = 1) -> int:
    """How many micro-batches each process runs per optimizer step to reach ``batch_size`` examples.

    Raises ValueError when the sizes cannot split evenly: every process must get the same whole number
    of micro-batches, or the examples would not be weighted equally.
    """
    checks.integer(batch_size, "batch_size")
    checks.integer(world_size, "world_size", 1, batch_size)  # each process needs at least one example
    if batch_size % world_size:
        raise ValueError(f"world_size must divide batch_size ({batch_size}), got {world_size}")
    per_process = batch_size // world_size
    checks.integer(micro_batch_size, "micro_batch_size", 1, per_process)
    if per_process % micro_batch_size:
        divisors = [d for d in range(1, per_process + 1) if per_process % d == 0]  # the sizes that split it evenly
        raise ValueError(
            f"micro_batch_size must divide the per-process batch ({per_process}): "
            f"{micro_batch_size} does not; try one of {divisors}"
        )
    return per_process // micro_batch_size


def scale_learning_rate(base_lr: float, base_batch: int, new_batch: int, rule: str = "linear") -> float:
    """A *starting point* for the learning rate when the effective batch changes (then tune it).

    ``"linear"`` scales with the batch (a common rule for SGD, Goyal et al. 2017); ``"sqrt"`` with its
    square root (often used with Adam). Accumulating to the *same* batch you tuned
    for needs no change: the gradient is the same.
    """
    base_lr = checks.positive(base_lr, "base_lr")
    checks.integer(base_batch, "base_batch")
    checks.integer(new_batch, "new_batch")
    factors = {"linear": new_batch / base_batch, "sqrt": math.sqrt(new_batch / base_batch)}
    return base_lr * factors[checks.choice(rule, "rule", factors)]


def weight_per_item(counts: Sequence[int], normalize: str = "total_tokens") -> list[float]:
    """The weight one item (an example or a real token) of each micro-batch gets in the accumulated gradient.

    ``counts`` holds the items of each micro-batch. ``"micro_mean"``: each micro-batch's mean loss divided by the
    number of micro-batches, so an item of micro-batch *i* weighs ``1 / (len(counts) * counts[i])``.
    ``"total_tokens"``: each micro-batch's summed loss divided by all the items, so every item weighs
    ``1 / sum(counts)``, exactly as in one big batch. The counts come from a checked source (the lesson's
    hand-made cases): at least one, each >= 1.
    """
    if checks.choice(normalize, "normalize", ("micro_mean", "total_tokens")) == "micro_mean":
        return [1 / (len(counts) * n) for n in counts]
    return [1 / sum(counts)] * len(counts)


# --------------------------------------------------------------------------------------------
# The equality check
# --------------------------------------------------------------------------------------------
def _backward_micro_batches(model: nn.Module, x: torch.Tensor, y: torch.Tensor, micro_batch_size: int) -> None:
    """Clear ``.grad``, then run the batch as micro-batches (forward + backward each), letting ``.grad`` add them up.

    Each micro-batch loss is divided by the number of micro-batches, so the sum of the micro-batch
    gradients is the batch average (forgetting that division is the classic bug). One micro-batch's
    graph is alive at a time.
    """
    model.zero_grad(set_to_none=True)
    steps = accumulation_steps_for(len(x), micro_batch_size)  # ValueError unless the size divides the batch
    for xb, yb in zip(x.split(micro_batch_size), y.split(micro_batch_size)):
        (F.mse_loss(model(xb), yb) / steps).backward()


def accumulated_gradients(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, micro_batch_size: int | None = None
) -> list[torch.Tensor]:
    """Copies of every parameter's gradient (mean squared error) after running the batch as micro-batches.

    ``micro_batch_size=None`` runs the whole batch in one forward and backward pass: the reference.
    ``.grad`` is left clean. The size must divide the batch (:func:`accumulation_steps_for` checks it).
    """
    _backward_micro_batches(model, x, y, len(x) if micro_batch_size is None else micro_batch_size)
    grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


class _GradientComparison(NamedTuple):
    """How a gradient compares with a reference: ``same`` (allclose) and the largest difference."""

    same: bool
    max_difference: float


def compare_gradients(
    reference: Sequence[torch.Tensor], other: Sequence[torch.Tensor], rtol: float = 1e-5, atol: float | None = None
) -> _GradientComparison:
    """Compare two lists of gradients with ``torch.allclose``, parameter by parameter.

    ``atol=None`` scales the absolute tolerance to each gradient's size (``rtol`` x its largest entry):
    an entry near zero is a sum that cancelled out, and its rounding error follows the size of the terms
    that were added, not the size of the result. Pass ``atol`` explicitly for a fixed tolerance.
    """
    if len(reference) != len(other) or any(a.shape != b.shape for a, b in zip(reference, other)):
        raise ValueError("other must hold one gradient per parameter, each of its reference's shape")
    same = all(
        torch.allclose(a, b, rtol=rtol, atol=rtol * float(a.abs().max()) if atol is None else atol)
        for a, b in zip(reference, other)
    )
    return _GradientComparison(same, max(float((a - b).abs().max()) for a, b in zip(reference, other)))


# --------------------------------------------------------------------------------------------
# Activation memory and time per micro-batch size
# --------------------------------------------------------------------------------------------
#: Inputs per example of the sweep's model and batch.
_SWEEP_FEATURES = 256
#: The sweep's model, ``make_mlp(**SWEEP_MLP)`` (:func:`course_utils.digits.make_mlp`, the course's one MLP
#: builder): 256 inputs, three hidden layers of 512 with GELU, one output. Real activations, so activation
#: memory grows with the batch.
SWEEP_MLP = {"in_features": _SWEEP_FEATURES, "hidden": 512, "depth": 3, "out_features": 1, "activation": "gelu"}


def regression_batch(batch_size: int = 64, in_features: int = _SWEEP_FEATURES) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed random batch ``(x, y)`` for the sweep (one target per example), drawn from its own generator."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(batch_size, in_features, generator=g), torch.randn(batch_size, 1, generator=g)


#: What each activation-memory reading measures, by device type.
MEMORY_METHODS = {
    "cuda": "CUDA memory a micro-batch's forward pass adds, read before backward: its saved activations",
    "cpu": (
        "bytes autograd saves for backward during one micro-batch's forward (saved_tensors_hooks, parameters excluded)"
    ),
}


def memory_method(device: torch.device | str | None = None) -> str:
    """Which activation-memory reading :func:`activation_memory` takes on ``device``: 'cuda' or 'cpu'.

    'cuda' (the CUDA allocator's counter) on a CUDA device; 'cpu' (bytes saved for backward, counted with
    ``saved_tensors_hooks``) anywhere else. :data:`MEMORY_METHODS` says what each one measures.
    """
    return "cuda" if hardware.as_device(device).type == "cuda" else "cpu"


def activation_memory(model: nn.Module, x: torch.Tensor, y: torch.Tensor, micro_batch_size: int) -> tuple[int, str]:
    """Memory one micro-batch's activations take, and what was measured (see :data:`MEMORY_METHODS`).

    With accumulation only one micro-batch's activations are alive at a time, so this is the
    activation part of the peak. On CUDA it is what the allocator holds after the forward pass (the
    saved activations), read before backward so that weight-gradient temporaries are not counted;
    elsewhere it is the bytes autograd saves for backward. ``micro_batch_size`` divides the batch
    (:func:`sweep_micro_batches` checked it).
    """
    # Copies, as a data loader would hand them over: a slice would share (and count) the whole batch's storage.
    xb, yb = x[:micro_batch_size].clone(), y[:micro_batch_size].clone()

    def step() -> torch.Tensor:
        return F.mse_loss(model(xb), yb)

    kind = memory_method(x.device)
    if kind == "cuda":
        # Read between the forward and the backward pass: the saved activations (plus the small loss and output),
        # not the peak of the step, which also holds backward's weight-gradient temporaries (one per weight
        # matrix, whatever the micro-batch) and would hide a small micro-batch's activations.
        step().backward()  # warm-up: allocate .grad and the kernels' workspaces before measuring
        torch.cuda.synchronize(x.device)
        base = torch.cuda.memory_allocated(x.device)
        loss = step()
        torch.cuda.synchronize(x.device)
        measured = max(0, torch.cuda.memory_allocated(x.device) - base)
    else:
        loss, measured = saved_for_backward(step, exclude=model.parameters())
    loss.backward()  # frees the graph
    model.zero_grad(set_to_none=True)
    return measured, MEMORY_METHODS[kind]


class _ProportionCheck(NamedTuple):
    """Does activation memory grow in proportion to the micro-batch? ``spread``: largest over smallest bytes per
    example, minus 1 (0.0 means exactly proportional)."""

    spread: float
    rtol: float = 0.25

    @property
    def holds(self) -> bool:
        """True when every micro-batch size takes the same bytes per example, within ``rtol``."""
        return self.spread <= self.rtol

    def __str__(self) -> str:
        claim = "activation memory in proportion to the micro-batch"
        return f"{claim} (bytes per example equal within {self.rtol:.0%} at every size): {self.holds}"


def proportion_check(rows: Sequence["MicroBatchRow"]) -> _ProportionCheck:
    """Check that activation memory is proportional to the micro-batch size across the sweep's ``rows``.

    Bytes per example (``activation_bytes / micro_batch_size``) must agree within 25% between the smallest
    and the largest. A reading with a fixed part (such as weight-gradient temporaries)
    fails it: that part dominates small micro-batches.
    """
    checks.integer(len(rows), "len(rows)", 1)  # at least one measured micro-batch size
    per_example = [r.activation_bytes / r.micro_batch_size for r in rows]
    low, high = min(per_example), max(per_example)
    return _ProportionCheck(high / low - 1 if low else math.inf)


def time_accumulated_batch(model: nn.Module, x: torch.Tensor, y: torch.Tensor, micro_batch_size: int) -> float:
    """Median seconds to run the whole batch as micro-batches (forward + backward each), timed for at least
    0.1 s with ``torch.utils.benchmark`` (which synchronizes CUDA), using this process's thread count."""
    from torch.utils import benchmark

    one_batch = partial(_backward_micro_batches, model, x, y, micro_batch_size)
    one_batch()  # warm-up
    timer = benchmark.Timer(stmt="one_batch()", globals={"one_batch": one_batch}, num_threads=torch.get_num_threads())
    seconds = timer.blocked_autorange(min_run_time=0.1).median
    model.zero_grad(set_to_none=True)
    return float(seconds)


@dataclass(frozen=True)
class MicroBatchRow:
    """One micro-batch size in the sweep: what it costs, and whether the gradient is still the batch's."""

    micro_batch_size: int
    accumulation_steps: int
    same_gradient: bool
    max_difference: float
    activation_bytes: int
    seconds: float
    memory_what: str


def sweep_micro_batches(
    sizes: Sequence[int] = MICRO_BATCH_SIZES, batch_size: int = 64, device: torch.device | str | None = None
) -> list[MicroBatchRow]:
    """Run one batch of ``batch_size`` at every micro-batch size: gradient check, activation memory, time.

    Uses ``make_mlp(**SWEEP_MLP)`` and :func:`regression_batch`. ``device`` defaults to the GPU when there
    is one. On a CPU the sweep runs on one thread, for steady timings on a shared machine. Each size is
    checked (:func:`accumulation_steps_for`) by the gradient check, before its memory is measured.
    """
    checks.integer(len(sizes), "len(sizes)", 1, 16)
    dev = hardware.as_device(device)
    model = make_mlp(**SWEEP_MLP).to(dev)
    x, y = (t.to(dev) for t in regression_batch(batch_size))
    rows = []
    with hardware.cpu_threads(1 if dev.type == "cpu" else None):
        reference = accumulated_gradients(model, x, y)  # the whole batch at once
        for size in sizes:
            check = compare_gradients(reference, accumulated_gradients(model, x, y, size))
            mem, what = activation_memory(model, x, y, size)
            seconds = time_accumulated_batch(model, x, y, size)
            rows.append(MicroBatchRow(size, batch_size // size, check.same, check.max_difference, mem, seconds, what))
    return rows


def find_row(rows: Sequence[MicroBatchRow], micro_batch_size: int) -> MicroBatchRow:
    """The sweep row for ``micro_batch_size`` (ValueError listing the sizes measured if it is missing)."""
    sizes = [r.micro_batch_size for r in rows]
    return rows[sizes.index(checks.choice(micro_batch_size, "micro_batch_size", sizes))]


def micro_batch_summary(rows: Sequence[MicroBatchRow], micro_batch_size: int, budget_bytes: int | None = None) -> str:
    """A few lines describing one micro-batch size against the full batch (the widget's text)."""
    row = find_row(rows, micro_batch_size)
    full = max(rows, key=lambda r: r.micro_batch_size)
    batch = row.micro_batch_size * row.accumulation_steps
    lines = [
        f"micro-batch {row.micro_batch_size} x {row.accumulation_steps} accumulation steps = batch of {batch}",
        f"same gradient as the batch of {batch}: {row.same_gradient} (largest difference {row.max_difference:.1e})",
        f"activation memory: {format_bytes(row.activation_bytes)} "
        f"({row.activation_bytes / full.activation_bytes:.0%} of micro-batch {full.micro_batch_size}'s)",
        f"time for the {batch} examples: {format_seconds(row.seconds)} "
        f"({row.seconds / full.seconds:.1f}x micro-batch {full.micro_batch_size}'s)",
    ]
    if budget_bytes is not None:
        fits = row.activation_bytes <= budget_bytes
        lines.append(f"fits a GPU with room for {format_bytes(budget_bytes)} of activations: {'yes' if fits else 'no'}")
    return "\n".join(lines)


def sweep_table(rows: Sequence[MicroBatchRow], measured: bool = True) -> str:
    """The sweep as a text table. ``measured=False`` keeps only the deterministic columns."""
    head = f"{'micro-batch':>11} {'steps':>5} {'same gradient':>13}"
    body = [f"{r.micro_batch_size:>11} {r.accumulation_steps:>5} {str(r.same_gradient):>13}" for r in rows]
    if measured:
        head += f" {'largest diff':>12} {'activations':>11} {'time':>9}"
        body = [
            f"{line} {r.max_difference:>12.1e} {format_bytes(r.activation_bytes):>11} {format_seconds(r.seconds):>9}"
            for line, r in zip(body, rows)
        ]
    return "\n".join([head, *body])


# --------------------------------------------------------------------------------------------
# The padding trap
# --------------------------------------------------------------------------------------------
#: Label value for padding positions, as PyTorch's cross_entropy and Hugging Face models expect.
IGNORE_INDEX = -100
#: Tokens of the padding demo's vocabulary (token 0 is the padding).
_VOCAB_SIZE = 32


class TinyTokenModel(nn.Module):
    """A next-token model in miniature: an embedding and a linear head (enough to have token losses).

    Its 32-token vocabulary is :func:`padded_token_batch`'s, in 16 dimensions, initialised from seed 0.
    """

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(_VOCAB_SIZE, 16)
        self.head = nn.Linear(16, _VOCAB_SIZE)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


def padded_token_batch(lengths: Sequence[int] = (30, 28, 4, 2)) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of the given lengths, right-padded to the longest: ``(tokens, labels)``.

    Real tokens and labels are drawn (seed 0) from 1 .. 31; padding positions hold token 0 and label
    :data:`IGNORE_INDEX`, so they add no loss.
    """
    checks.integer(len(lengths), "len(lengths)", 1)  # at least one sequence
    g = torch.Generator().manual_seed(0)
    tokens = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    labels = torch.full_like(tokens, IGNORE_INDEX)
    for i, n in enumerate(lengths):
        tokens[i, :n] = torch.randint(1, _VOCAB_SIZE, (n,), generator=g)
        labels[i, :n] = torch.randint(1, _VOCAB_SIZE, (n,), generator=g)
    return tokens, labels


def token_loss_sum(model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Sum of the cross-entropy over real (non-padding) tokens, and how many real tokens there were."""
    total = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
    return total, int((labels != IGNORE_INDEX).sum())


# --------------------------------------------------------------------------------------------
# The data and models of the notebook's training loops
# --------------------------------------------------------------------------------------------
def regression_dataset(n: int = 256) -> torch.utils.data.TensorDataset:
    """``n`` examples ``(x, y)`` of a small linear regression: 10 features, a fixed random true weight (seed 0)
    and noise of standard deviation 0.1 (the data of :class:`TinyRegressor`)."""
    checks.integer(n, "n", 1, 1_000_000)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 10, generator=g)
    y = x @ torch.randn(10, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)  # a true weight, then noise
    return torch.utils.data.TensorDataset(x, y)


@torch.no_grad()  # parameters require grad: reading their differences as floats must not touch autograd
def same_weights(a: nn.Module, b: nn.Module) -> bool:
    """True when two models' parameters are equal up to rounding (``torch.allclose``, rtol 1e-5, atol 1e-6).

    The models must have the same architecture (:func:`compare_gradients` raises ValueError otherwise).
    """
    return compare_gradients(list(a.parameters()), list(b.parameters()), atol=1e-6).same


class TinyRegressor(nn.Module):
    """A small model in the shape the Hugging Face Trainer expects: ``forward(x, labels)`` -> ``{"loss", "logits"}``.

    Its network is ``make_mlp`` 10 -> 32 ReLU -> 1 from seed 0: the same starting weights every time.
    """

    def __init__(self) -> None:
        super().__init__()
        self.net = make_mlp(32, 0, in_features=10, out_features=1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        out = self.net(x)
        return {"logits": out} if labels is None else {"logits": out, "loss": F.mse_loss(out, labels)}


class DictDataset(list):
    """A ``TensorDataset(x, y)`` as the dicts the Trainer feeds to a model, ``{"x": ..., "labels": ...}``, in a list."""

    def __init__(self, data: torch.utils.data.TensorDataset) -> None:
        super().__init__({"x": x, "labels": y} for x, y in data)
