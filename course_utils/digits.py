"""The course's small real task: scikit-learn's handwritten digits, the MLP that learns them, and its scores.

scikit-learn ships the digits data set (1,797 images of 8 x 8 pixels, digits 0-9) inside the package, so
everything here works offline. Notebooks 01 (quantization) and 02 (mixed precision) use the same split,
:func:`load_digits_data`: 1,347 training and 450 test images, stratified, fixed by a seed.

* **data**: :class:`DigitsData` (with :meth:`DigitsData.batches`, random mini-batches for a training loop);
* **model**: :func:`make_mlp`, the one MLP builder of the course (notebook 01's 64 -> 64 -> 10 network by
  default; notebook 02's classifier and notebook 03's sweep model are the same function with other sizes);
* **training and scoring**: :func:`train_digits_mlp` (deterministic: fixed seeds, float64 arithmetic on one
  thread, so the rounding of the trained weights does not depend on the machine's thread count, then float32),
  :func:`evaluate` (test accuracy and loss);
* **formats**: :func:`quality_by_format` answers notebook 01's question "same model, four formats": how good
  is the model when its weights are stored in bfloat16, float16, int8, int4, int3 or int2?
"""

import copy
import math
from typing import Iterator, NamedTuple, Sequence

import torch
from torch import nn

from course_utils import checks, quant
from course_utils.hardware import cpu_threads

#: Formats :func:`model_in_format` knows, with their bits per weight.
FORMAT_BITS: dict[str, int] = {"float32": 32, "bfloat16": 16, "float16": 16, "int8": 8, "int4": 4, "int3": 3, "int2": 2}
#: The formats of the lesson's experiment, from widest to narrowest.
FORMATS: tuple[str, ...] = tuple(FORMAT_BITS)
#: Activations :func:`make_mlp` can put after each hidden layer.
_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU}
#: Most random mini-batches :meth:`DigitsData.batches` draws in one call.
MAX_STEPS = 100_000


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------
class DigitsData(NamedTuple):
    """Digits split into train and test: pixels scaled to [0, 1] (float32, 64 per image), labels 0-9 (int64)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    def batches(self, steps: int, batch_size: int, seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``steps`` random mini-batches ``(x, y)`` from the training set (drawn with replacement from ``seed``).

        The same arguments give the same batches; the global random stream is left alone.
        """
        steps = checks.integer(steps, "steps", 1, MAX_STEPS)
        batch_size = checks.integer(batch_size, "batch_size", 1, len(self.y_train))
        g = torch.Generator().manual_seed(checks.integer(seed, "seed", 0))
        # generator expressions, not a generator function: the arguments are checked now, not at the first next()
        draws = (torch.randint(0, len(self.y_train), (batch_size,), generator=g) for _ in range(steps))
        return ((self.x_train[idx], self.y_train[idx]) for idx in draws)


def load_digits_data() -> DigitsData:
    """scikit-learn's digits in the course's split: a quarter (450 images) held out for testing, 1,347 to train on.

    The split is stratified by digit and fixed (``random_state=0``): every call gives the same images.
    """
    from sklearn.datasets import load_digits  # scikit-learn is needed only here
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    return DigitsData(x_tr, y_tr, x_te, y_te)


def check_data(data: object, name: str = "data") -> DigitsData:
    """``data`` when it is a :class:`DigitsData`, else a TypeError naming ``name``."""
    return checks.instance(data, name, DigitsData, "a DigitsData (from load_digits_data)")


# --------------------------------------------------------------------------------------------
# The MLP
# --------------------------------------------------------------------------------------------
def make_mlp(
    hidden: int = 64,
    seed: int = 0,
    *,
    depth: int = 1,
    in_features: int = 64,
    out_features: int = 10,
    activation: str = "relu",
) -> nn.Sequential:
    """An MLP initialised from ``seed``: ``in_features`` -> ``depth`` hidden layers of ``hidden`` -> ``out_features``.

    Each hidden layer is ``nn.Linear`` followed by ``activation`` ("relu" or "gelu"). The defaults are
    notebook 01's digits network (64 pixels -> 64 ReLU units -> 10 digit scores); notebook 02 trains
    ``make_mlp(hidden=128, depth=2)``. The caller's random stream is left alone.
    """
    hidden = checks.integer(hidden, "hidden", 1, 65536)
    seed = checks.integer(seed, "seed", 0)
    depth = checks.integer(depth, "depth", 1, 64)
    in_features = checks.integer(in_features, "in_features", 1, 65536)
    out_features = checks.integer(out_features, "out_features", 1, 65536)
    act = _ACTIVATIONS[checks.choice(activation, "activation", _ACTIVATIONS)]
    with torch.random.fork_rng(devices=[]):  # do not disturb the caller's random stream
        torch.manual_seed(seed)
        layers: list[nn.Module] = []
        for width in [in_features] + [hidden] * (depth - 1):
            layers += [nn.Linear(width, hidden), act()]
        return nn.Sequential(*layers, nn.Linear(hidden, out_features))


# --------------------------------------------------------------------------------------------
# Training and scoring
# --------------------------------------------------------------------------------------------
def train_digits_mlp(data: DigitsData | None = None, seed: int = 0) -> nn.Sequential:
    """Train :func:`make_mlp` (64 -> 64 -> 10) with Adam (lr 1e-2) on the digits; float32, eval mode.

    30 passes over the training images in mini-batches of 64, shuffled from ``seed``. Deterministic:
    the same arguments give bit-identical weights on a machine. About a second on one core.
    """
    data = load_digits_data() if data is None else check_data(data)
    model = make_mlp(seed=seed).double()
    x, y = data.x_train.double(), data.y_train
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    order = torch.Generator().manual_seed(seed)
    with cpu_threads(1):
        for _ in range(30):  # epochs
            for idx in torch.randperm(len(x), generator=order).split(64):  # shuffled mini-batches of 64
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
    """Accuracy and cross-entropy of ``model`` on ``data``'s test set, on the model's device, in float32."""
    checks.instance(model, "model", nn.Module, "a torch.nn.Module")
    data = check_data(data)
    with torch.no_grad():
        logits = model(data.x_test.to(next(model.parameters()).device)).float().cpu()
    accuracy = float((logits.argmax(dim=1) == data.y_test).float().mean())
    return Quality(accuracy, float(nn.functional.cross_entropy(logits, data.y_test)))


# --------------------------------------------------------------------------------------------
# Same model, several formats
# --------------------------------------------------------------------------------------------
def linear_weight_count(model: nn.Module) -> int:
    """Number of weights in the model's ``nn.Linear`` layers (biases not counted)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def model_in_format(model: nn.Module, fmt: str, block_size: quant.BlockSize = None) -> tuple[nn.Module, int]:
    """A copy of ``model`` whose Linear weights went through format ``fmt``, and those weights' stored bytes.

    16-bit formats round every parameter to bfloat16/float16 and back; intN formats quantize the Linear
    weights with :func:`course_utils.quant.quantize_model_weights` (symmetric, one scale per tensor unless
    ``block_size`` says otherwise; biases stay float32). The copy computes in float32 either way: this
    measures what the rounding does to quality, not speed.
    """
    bits = FORMAT_BITS[checks.choice(fmt, "fmt", FORMATS)]
    checks.instance(model, "model", nn.Module, "a torch.nn.Module")
    if fmt.startswith("int"):
        return quant.quantize_model_weights(model, bits, block_size=block_size)
    clone = copy.deepcopy(model)
    # The lesson compares storage formats on purpose: this is the format under test, not a device choice.
    with torch.no_grad():
        for p in clone.parameters():
            p.copy_(p.to(getattr(torch, fmt)).to(p.dtype))  # float32 to float32 changes nothing
    return clone, linear_weight_count(model) * bits // 8


class FormatResult(NamedTuple):
    """The network in one weight format: test accuracy (0-1), test loss, the bytes its Linear weights take in that
    format, and the part of them spent on float32 scales (0 for float formats)."""

    fmt: str
    bits: int
    accuracy: float
    loss: float
    weight_bytes: int
    scale_bytes: int = 0


def score_in_format(model: nn.Module, data: DigitsData, fmt: str, block_size: quant.BlockSize = None) -> FormatResult:
    """``model`` scored with its Linear weights in ``fmt`` (see :func:`model_in_format`), scale bytes counted.

    The int formats are symmetric (no zero-points), so what the weights take beyond their packed codes is
    their float32 scales; a float format stores its codes only.
    """
    converted, size = model_in_format(model, fmt, block_size)
    bits = FORMAT_BITS[fmt]
    codes = sum(math.ceil(m.weight.numel() * bits / 8) for m in model.modules() if isinstance(m, nn.Linear))
    return FormatResult(fmt, bits, *evaluate(converted, data), size, size - codes)


def quality_by_format(model: nn.Module, data: DigitsData, block_size: quant.BlockSize = None) -> list[FormatResult]:
    """Evaluate ``model`` in every format of :data:`FORMATS` (see :func:`score_in_format`)."""
    return [score_in_format(model, data, fmt, block_size) for fmt in FORMATS]


def format_quality_table(rows: Sequence[FormatResult]) -> str:
    """The results as a fixed-width text table: accuracy in % (1 decimal), loss (3 decimals), bytes."""
    head = f"{'format':<10}{'bits':>5}{'test accuracy':>15}{'test loss':>11}{'weight bytes':>14}"
    body = [f"{r.fmt:<10}{r.bits:>5}{100 * r.accuracy:>14.1f}%{r.loss:>11.3f}{r.weight_bytes:>14,}" for r in rows]
    return "\n".join([head, *body])
