"""A small real network to quantize: an MLP trained on scikit-learn's handwritten digits.

scikit-learn ships the digits data set (1,797 images of 8 x 8 pixels, digits 0-9) inside the package, so
everything here works offline. Training takes about a second on one CPU core and is deterministic: fixed
seeds, float64 arithmetic on one thread (so the rounding of the trained weights does not depend on the
machine's thread count), then the model is converted to float32, the format it is evaluated in.

:func:`quality_by_format` answers the lesson's question "same model, four formats": how good is the model
when its weights are stored in bfloat16, float16, int8, int4, int3 or int2?
"""
from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Literal, NamedTuple, Sequence

import torch
from torch import nn

from course_utils import quant

#: Formats :func:`model_in_format` knows, with their bits per weight.
FORMAT_BITS: dict[str, int] = {"float32": 32, "bfloat16": 16, "float16": 16, "int8": 8, "int4": 4, "int3": 3,
                               "int2": 2}
#: The formats of the lesson's experiment, from widest to narrowest.
FORMATS: tuple[str, ...] = tuple(FORMAT_BITS)


@dataclass(frozen=True)
class DigitsData:
    """Digits split into train and test: pixels scaled to [0, 1] (float32), labels 0-9 (int64)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def load_digits_data(test_fraction: float = 0.25, seed: int = 0) -> DigitsData:
    """scikit-learn's digits, split with stratification (the same split for the same ``seed``)."""
    if not isinstance(test_fraction, float) or not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be a float between 0 and 1 (exclusive), got {test_fraction!r}")
    _check_int(seed, "seed", 0)
    from sklearn.datasets import load_digits  # noqa: PLC0415 - scikit-learn is needed only here
    from sklearn.model_selection import train_test_split  # noqa: PLC0415

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)
    return DigitsData(x_tr, y_tr, x_te, y_te)


def _check_int(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be {minimum} or more, got {value}")
    return value


def make_mlp(hidden: int = 64, seed: int = 0) -> nn.Sequential:
    """64 pixels -> ``hidden`` ReLU units -> 10 digit scores, initialised from ``seed``."""
    _check_int(hidden, "hidden", 1)
    _check_int(seed, "seed", 0)
    gen_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    finally:
        torch.random.set_rng_state(gen_state)  # do not disturb the caller's random stream


@contextmanager
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_digits_mlp(data: DigitsData | None = None, hidden: int = 64, epochs: int = 30, lr: float = 1e-2,
                     batch_size: int = 64, seed: int = 0) -> nn.Sequential:
    """Train :func:`make_mlp` with Adam on the digits (mini-batches shuffled from ``seed``); float32, eval mode.

    Deterministic: the same arguments give bit-identical weights on a machine. About a second on one core.
    """
    data = load_digits_data() if data is None else data
    if not isinstance(data, DigitsData):
        raise TypeError(f"data must be a DigitsData (from load_digits_data) or None, got {type(data).__name__}")
    _check_int(epochs, "epochs", 1)
    _check_int(batch_size, "batch_size", 1)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0.0 < lr < 1.0:
        raise ValueError(f"lr must be a number between 0 and 1 (exclusive), got {lr!r}")
    model = make_mlp(hidden, seed).double()
    x, y = data.x_train.double(), data.y_train
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    order = torch.Generator().manual_seed(seed)
    with _one_thread():
        for _ in range(epochs):
            perm = torch.randperm(len(x), generator=order)
            for start in range(0, len(x), batch_size):
                idx = perm[start:start + batch_size]
                loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    return model.float().eval()


class Quality(NamedTuple):
    """How good a model is on the test images: accuracy (0-1) and average cross-entropy loss."""

    accuracy: float
    loss: float


def evaluate(model: nn.Module, data: DigitsData) -> Quality:
    """Accuracy and cross-entropy of ``model`` on ``data``'s test set (computed in float32)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(data, DigitsData):
        raise TypeError(f"data must be a DigitsData, got {type(data).__name__}")
    with torch.no_grad():
        logits = model(data.x_test).float()
    accuracy = float((logits.argmax(dim=1) == data.y_test).float().mean())
    return Quality(accuracy, float(nn.functional.cross_entropy(logits, data.y_test)))


def _check_format(fmt: object) -> str:
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a string, one of {', '.join(FORMATS)}; got {type(fmt).__name__}")
    if fmt not in FORMAT_BITS:
        raise ValueError(f"fmt must be one of {', '.join(FORMATS)}; got {fmt!r}")
    return fmt


def linear_weight_count(model: nn.Module) -> int:
    """Number of weights in the model's ``nn.Linear`` layers (biases not counted)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def model_in_format(model: nn.Module, fmt: str,
                    block_size: int | None | Literal["row"] = None) -> tuple[nn.Module, int]:
    """A copy of ``model`` whose Linear weights went through format ``fmt``, and those weights' stored bytes.

    16-bit formats round every parameter to bfloat16/float16 and back; intN formats quantize the Linear
    weights with :func:`course_utils.quant.quantize_model_weights` (symmetric, one scale per tensor unless
    ``block_size`` says otherwise; biases stay float32). The copy computes in float32 either way: this
    measures what the rounding does to quality, not speed.
    """
    fmt = _check_format(fmt)
    bits = FORMAT_BITS[fmt]
    if fmt.startswith("int"):
        return quant.quantize_model_weights(model, bits, block_size=block_size)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    clone = copy.deepcopy(model)
    if fmt != "float32":
        # The lesson compares storage formats on purpose: this is the format under test, not a device choice.
        dtype = torch.bfloat16 if fmt == "bfloat16" else torch.float16
        with torch.no_grad():
            for p in clone.parameters():
                p.copy_(p.to(dtype).to(p.dtype))
    return clone, linear_weight_count(model) * bits // 8


class FormatResult(NamedTuple):
    """Quality of the model in one format, and the bytes its Linear weights take in that format."""

    fmt: str
    bits: int
    accuracy: float
    loss: float
    weight_bytes: int


def quality_by_format(model: nn.Module, data: DigitsData, formats: Sequence[str] = FORMATS,
                      block_size: int | None | Literal["row"] = None) -> list[FormatResult]:
    """Evaluate ``model`` in every format of ``formats`` (see :func:`model_in_format`)."""
    if not formats:
        raise ValueError(f"formats must name at least one of {', '.join(FORMATS)}")
    rows = []
    for fmt in formats:
        converted, size = model_in_format(model, fmt, block_size)
        accuracy, loss = evaluate(converted, data)
        rows.append(FormatResult(fmt, FORMAT_BITS[fmt], accuracy, loss, size))
    return rows


def format_quality_table(rows: Sequence[FormatResult]) -> str:
    """The results as a fixed-width text table: accuracy in % (1 decimal), loss (3 decimals), bytes."""
    lines = [f"{'format':<10}{'bits':>5}{'test accuracy':>15}{'test loss':>11}{'weight bytes':>14}"]
    for r in rows:
        lines.append(f"{r.fmt:<10}{r.bits:>5}{100 * r.accuracy:>14.1f}%{r.loss:>11.3f}{r.weight_bytes:>14,}")
    return "\n".join(lines)
