"""Quantization from scratch: integer codes, scales, zero-points, blocks, NF4, and what it all costs.

The whole idea in two lines (for one scale ``s`` and zero-point ``z``)::

    q = clamp(round(x / s) + z)        # store small integers
    x_hat = s * (q - z)                # read them back; x - x_hat is the quantization error

* **Symmetric** (``z = 0``): levels ``-(2**(b-1) - 1) ... 2**(b-1) - 1`` (int8: -127..127, int4: -7..7),
  ``s = max|x| / q_max``, so the value furthest from zero lands exactly on a level.
* **Asymmetric** (with a zero-point): levels ``0 ... 2**b - 1``, ``s = (hi - lo) / (2**b - 1)`` over
  ``lo = min(x, 0)`` and ``hi = max(x, 0)``, ``z = round(-lo / s)``. Keeping 0 in the range means 0 is
  stored exactly, and every value is at most ``s / 2`` from its read-back.
* **Blocks**: with ``block_size=64`` every 64 consecutive values (in row-major order) get their own scale
  (and zero-point), so one outlier only coarsens its own block. Real 4-bit formats work this way.
* **NF4**: 16 levels placed at quantiles of the normal distribution instead of evenly, with one absmax
  scale per block of 64 (the format QLoRA uses). :func:`nf4_levels` derives them, and :func:`nf4_agreement`
  compares our NF4 with another one's read-back (bitsandbytes', in the notebook).

Sizes count what a real format would store: the codes packed at ``bits`` bits each, a float32 scale
(4 bytes) per block, and for asymmetric formats a zero-point packed at ``bits`` bits per block.
Everything here runs on CPU or GPU; the maths is done in float32.
"""

import copy
import math
from typing import Literal, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from course_utils import checks

#: Bit widths :func:`quantize` supports.
MIN_BITS, MAX_BITS = 2, 8
#: How many values share a scale: None (the whole tensor), a block size, or "row" (each output row of a matrix).
BlockSize = int | None | Literal["row"]
#: Bytes of one stored scale (a float32, as in bitsandbytes' absmax and the lesson's "4 bytes for the step").
SCALE_BYTES = 4

# --------------------------------------------------------------------------------------------
# The lesson's eight weights (seed: "Quantization: fewer bits per weight")
# --------------------------------------------------------------------------------------------
#: Eight made-up float32 weights; the one furthest from zero is -0.35, so the 4-bit step (levels -7..7) is 0.05.
EIGHT_WEIGHTS: tuple[float, ...] = (0.12, -0.05, 0.31, -0.22, 0.02, -0.35, 0.18, 0.07)


# --------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------
def _check_tensor(x: object) -> torch.Tensor:
    """``x`` as a non-empty floating-point tensor (:func:`_block_stats` rejects NaN and inf on its way)."""
    checks.instance(x, "x", torch.Tensor, "a torch.Tensor")
    if not x.is_floating_point():
        raise TypeError(f"x must have a floating-point dtype (float32, bfloat16, ...), got {x.dtype}")
    if x.numel() == 0:
        raise ValueError(f"x must not be empty (shape {tuple(x.shape)})")
    return x


# --------------------------------------------------------------------------------------------
# Quantize / dequantize
# --------------------------------------------------------------------------------------------
def level_range(bits: int, symmetric: bool = True) -> tuple[int, int]:
    """Smallest and largest integer code: symmetric ``(-(2**(b-1)-1), 2**(b-1)-1)``, else ``(0, 2**b-1)``."""
    bits = checks.integer(bits, "bits", MIN_BITS, MAX_BITS)
    if checks.flag(symmetric, "symmetric"):
        q_max = 2 ** (bits - 1) - 1
        return -q_max, q_max
    return 0, 2**bits - 1


class QuantizedTensor(NamedTuple):
    """A quantized tensor: everything needed to read it back, and nothing more.

    ``codes`` has the original shape (int8 for symmetric formats, uint8 otherwise, indices into
    ``codebook`` for NF4). ``scales`` (and ``zero_points``, asymmetric only) hold one value per block:
    one block for the whole tensor when ``block_size`` is None, else ``ceil(numel / block_size)``
    blocks of consecutive values in row-major order.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    zero_points: torch.Tensor | None
    bits: int
    block_size: int | None
    dtype: torch.dtype = torch.float32
    codebook: torch.Tensor | None = None

    @property
    def name(self) -> str:
        """A short label such as 'int4', 'int8 + zero-point, blocks of 64' or 'nf4, blocks of 64'."""
        base = "nf4" if self.codebook is not None else f"int{self.bits}"
        zero_point = " + zero-point" if self.zero_points is not None else ""
        return base + zero_point + (f", blocks of {self.block_size}" if self.block_size else ", one scale")


def _blocks(flat: torch.Tensor, block_size: int | None) -> torch.Tensor:
    """``flat`` as a (n_blocks, block) matrix, zero-padded at the end (zeros never change a block's range)."""
    size = min(block_size or flat.numel(), flat.numel())
    return F.pad(flat, (0, (-flat.numel()) % size)).reshape(-1, size)


def _unblock(blocks: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """The way back from :func:`_blocks`: the padding dropped, the original ``shape`` restored."""
    return blocks.reshape(-1)[: math.prod(shape)].reshape(shape)


def _block_stats(x: torch.Tensor, block_size: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` in float32 blocks (:func:`_blocks`), and each block's min and max; NaN and inf are caught here."""
    blocks = _blocks(x.detach().reshape(-1).to(torch.float32), block_size)
    low, high = torch.aminmax(blocks, dim=1)
    if not bool(torch.isfinite(torch.cat([low, high])).all()):  # NaN and inf propagate: one cheap check
        raise ValueError("x must hold finite numbers, not NaN or inf (or values too large for float32)")
    return blocks, low, high


def _nonzero(scales: torch.Tensor) -> torch.Tensor:
    """``scales`` with 0 replaced by 1, as a column: an all-zero block divides by 1 and reads back as zeros."""
    return torch.where(scales > 0, scales, 1.0).unsqueeze(1)


def quantize(x: torch.Tensor, bits: int, block_size: int | None = None, symmetric: bool = True) -> QuantizedTensor:
    """Quantize ``x`` to ``bits``-bit integer codes with one scale per tensor or per block.

    Symmetric: ``s = max|x| / q_max``, ``q = round(x / s)``. Asymmetric: ``s = (hi - lo) / (2**b - 1)``,
    ``z = round(-lo / s)``, ``q = clamp(round(x / s) + z, 0, 2**b - 1)``. A block of zeros gets scale 0 and
    reads back as zeros (no division by zero). See :func:`dequantize` for the way back.
    """
    x = _check_tensor(x)
    q_min, q_max = level_range(bits, symmetric)  # checks bits and symmetric
    block_size = None if block_size is None else checks.integer(block_size, "block_size", 1)
    blocks, low, high = _block_stats(x, block_size)
    zero_points = None
    if symmetric:
        scales = torch.maximum(low.neg(), high) / q_max
        # |x| <= max|x| = q_max * s, so round(x / s) is already within -q_max..q_max: no clamp needed
        codes = (blocks / _nonzero(scales)).round_().to(torch.int8)
    else:
        low, high = low.clamp(max=0.0), high.clamp(min=0.0)  # keep 0 in range: it is stored exactly
        scales = high / q_max - low / q_max  # = (high - low) / q_max, without overflow near float32's max
        safe = _nonzero(scales)
        zero_points = torch.round(-low.unsqueeze(1) / safe).clamp_(q_min, q_max)
        codes = (blocks / safe).round_().add_(zero_points).clamp_(q_min, q_max).to(torch.uint8)
        zero_points = zero_points.squeeze(1).to(torch.uint8)
    return QuantizedTensor(_unblock(codes, x.shape), scales, zero_points, bits, block_size, x.dtype)


def dequantize(q: QuantizedTensor) -> torch.Tensor:
    """Read a :class:`QuantizedTensor` back as floats: ``s * (q - z)`` (or ``s * codebook[q]`` for NF4)."""
    flat = q.codes.reshape(-1)
    values = flat.to(torch.float32) if q.codebook is None else q.codebook.to(q.scales.device)[flat.long()]
    blocks = _blocks(values, q.block_size)
    if q.zero_points is not None:
        blocks = blocks.sub_(q.zero_points.to(torch.float32).unsqueeze(1))
    return _unblock(blocks.mul_(q.scales.unsqueeze(1)), q.codes.shape).to(q.dtype)


# --------------------------------------------------------------------------------------------
# What it costs: size and error
# --------------------------------------------------------------------------------------------
class Storage(NamedTuple):
    """Bytes a quantized tensor takes, split into the codes and the overhead that makes them readable."""

    codes: int
    scales: int
    zero_points: int

    @property
    def total(self) -> int:
        """All bytes: codes + scales + zero-points."""
        return self.codes + self.scales + self.zero_points


def packed_storage(numel: int, bits: int, block_size: int | None = None, symmetric: bool = True) -> Storage:
    """Bytes of ``numel`` values in a ``bits``-bit format, without quantizing anything (what :func:`storage` counts).

    Codes packed at ``bits`` bits, :data:`SCALE_BYTES` per block (one block when ``block_size`` is None, else
    ``ceil(numel / block_size)``), and for an asymmetric format one zero-point per block packed at ``bits`` bits.
    Example: a 4096 x 4096 matrix in int4 with a float32 scale per 64 weights takes 8,388,608 + 1,048,576 =
    9,437,184 bytes.
    """
    blocks = math.ceil(numel / (block_size or numel))
    zero_points = 0 if symmetric else math.ceil(blocks * bits / 8)
    return Storage(math.ceil(numel * bits / 8), blocks * SCALE_BYTES, zero_points)


def storage(q: QuantizedTensor) -> Storage:
    """Bytes of ``q``: codes packed at ``bits`` bits, a float32 scale per block, zero-points packed at ``bits`` bits.

    These are :func:`packed_storage`'s sums for ``q``'s size and format (NF4 counts as symmetric 4-bit).
    """
    return packed_storage(q.codes.numel(), q.bits, q.block_size, q.zero_points is None)


def bits_per_weight(q: QuantizedTensor) -> float:
    """Average stored bits per value, overhead included (int4 with a float32 scale per 64 values: 4.5)."""
    return storage(q).total * 8 / q.codes.numel()


def mean_abs_error(x: torch.Tensor, x_hat: torch.Tensor | QuantizedTensor) -> float:
    """Average of ``|x - x_hat|`` (``x_hat`` may be a QuantizedTensor; it is read back first)."""
    return float(_abs_error(x, x_hat).mean())


def max_abs_error(x: torch.Tensor, x_hat: torch.Tensor | QuantizedTensor) -> float:
    """Largest ``|x - x_hat|``."""
    return float(_abs_error(x, x_hat).max())


def _abs_error(x: torch.Tensor, x_hat: torch.Tensor | QuantizedTensor) -> torch.Tensor:
    """``|x - x_hat|`` in float32 (``x_hat`` may be a QuantizedTensor: it is read back first)."""
    if isinstance(x_hat, QuantizedTensor):
        x_hat = dequantize(x_hat)
    if x_hat.shape != x.shape:
        raise ValueError(f"x_hat must have the shape of x {tuple(x.shape)}, got {tuple(x_hat.shape)}")
    return (x.float() - x_hat.float()).abs_()


class _SchemeResult(NamedTuple):
    """One row of a scheme comparison."""

    scheme: str
    bits: int
    mean_error: float
    size_bytes: int
    bits_per_weight: float


#: The schemes :func:`compare_schemes` tries: (label, block_size, symmetric).
_SCHEMES: tuple[tuple[str, int | None, bool], ...] = (
    ("one scale", None, True),
    ("blocks of 64", 64, True),
    ("one scale + zero-point", None, False),
    ("blocks of 64 + zero-points", 64, False),
)


def compare_schemes(x: torch.Tensor, bits_list: Sequence[int] = (4, 8)) -> list[_SchemeResult]:
    """Quantize ``x`` with every scheme at every bit width; report average error and size incl. overhead."""
    # quantize checks x (a tensor of finite floats) and each of bits_list
    return [_scheme_row(x, bits, *scheme) for bits in bits_list for scheme in _SCHEMES]


def _scheme_row(x: torch.Tensor, bits: int, label: str, block_size: int | None, symmetric: bool) -> _SchemeResult:
    """One row of :func:`compare_schemes`: ``x`` quantized in one scheme at ``bits`` bits."""
    q = quantize(x, bits, block_size, symmetric)
    return _SchemeResult(label, bits, mean_abs_error(x, q), storage(q).total, bits_per_weight(q))


def format_scheme_table(rows: Sequence[_SchemeResult], float32_bytes: int) -> str:
    """A fixed-width text table of :func:`compare_schemes` rows under a float32 row (sizes in MB = 10**6 bytes)."""
    rows = [_SchemeResult("float32 (no quantization)", 32, 0, float32_bytes, 32), *rows]
    lines = [f"{'scheme':<28}{'bits':>5}{'avg error':>11}{'size MB':>10}{'bits/weight':>13}"]
    for r in rows:
        size = f"{r.size_bytes / 1e6:>10.2f}"
        lines.append(f"{r.scheme:<28}{r.bits:>5}{r.mean_error:>11.4f}{size}{r.bits_per_weight:>13.3f}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The eight-number table
# --------------------------------------------------------------------------------------------
class _EightNumbers(NamedTuple):
    """The lesson's eight weights quantized symmetrically with one scale: steps, read-back and errors."""

    bits: int
    weights: tuple[float, ...]
    steps: tuple[int, ...]
    step: float
    read_back: tuple[float, ...]
    errors: tuple[float, ...]  # read_back - weight

    @property
    def decimals(self) -> int:
        """Digits to print: 2 when the step is a whole number of hundredths (0.05, 0.35), else 3 significant."""
        whole_hundredths = abs(round(self.step, 2) - self.step) < 1e-7
        return 2 if whole_hundredths else max(2, 2 - math.floor(math.log10(self.step)))


def eight_numbers(bits: int = 4) -> _EightNumbers:
    """Quantize the lesson's eight weights (symmetric, one scale ``max|x| / q_max``) and read them back.

    At 4 bits the step is 0.35 / 7 = 0.05 and the rows are exactly the lesson's table.
    """
    x = torch.tensor(EIGHT_WEIGHTS)
    q = quantize(x, bits)
    x_hat = dequantize(q)
    read_back, errors = tuple(x_hat.tolist()), tuple((x_hat - x).tolist())
    return _EightNumbers(q.bits, EIGHT_WEIGHTS, tuple(q.codes.tolist()), q.scales.item(), read_back, errors)


def _fmt(value: float, decimals: int, signed: bool = False) -> str:
    """``value`` to ``decimals`` places, with a '+' when ``signed``; a value that rounds to 0 is '0.00' ('0' signed)."""
    if abs(value) < 0.5 * 10**-decimals:
        return "0" if signed else f"{0:.{decimals}f}"
    return f"{value:{'+' if signed else ''}.{decimals}f}"


def format_eight_numbers(table: _EightNumbers) -> str:
    """The table as text, one row per line, as the lesson prints it (errors with a sign, 0 when none)."""
    d = table.decimals
    rows = {
        "Weight (float32)": [f"{w:.2f}" for w in table.weights],
        f"Stored step ({table.bits}-bit)": [str(s) for s in table.steps],
        f"Read back (step x {_fmt(table.step, d)})": [_fmt(v, d) for v in table.read_back],
        "Error (read back - weight)": [_fmt(e, d, signed=True) for e in table.errors],
    }
    width = max(7, d + 4)
    return "\n".join(f"{label:<28}" + "".join(f"{c:>{width}}" for c in cells) for label, cells in rows.items())


# --------------------------------------------------------------------------------------------
# NF4: 16 levels at normal quantiles
# --------------------------------------------------------------------------------------------
#: Outermost quantile NF4 uses: the mean of 1 - 1/(2*15) and 1 - 1/(2*16) (QLoRA, and bitsandbytes' code).
NF4_OFFSET = (1 - 1 / (2 * 15) + 1 - 1 / (2 * 16)) / 2  # 0.96770833...


def nf4_levels() -> torch.Tensor:
    """The 16 NF4 levels in [-1, 1], derived from quantiles of the standard normal distribution.

    Weights of trained networks look roughly normal, so levels should be dense near 0 and sparse in the
    tails. The construction is bitsandbytes' ``create_normal_map`` (QLoRA's NF4): 8 probabilities
    ``linspace(NF4_OFFSET, 0.5, 9)[:-1]`` for the positive side and 7, ``linspace(NF4_OFFSET, 0.5, 8)[:-1]``,
    for the negative side (both from :data:`NF4_OFFSET` down towards 0.5, spaced differently, and both without
    0.5 itself); each becomes a z-score with the inverse normal CDF (``ndtri``, scipy's ``norm.ppf``; the
    negative side gets a minus sign); one exact 0 (0.5's quantile) is added once; sort, and divide by the
    largest so the levels span [-1, 1]. The extra positive level is the price of having an exact zero in 16
    (an even number of) levels. The offset keeps the outermost quantile finite. Computed in float64 here;
    bitsandbytes ships the same 16 values hard-coded, which agree with these to about 2e-7.
    """
    positive = torch.linspace(NF4_OFFSET, 0.5, 9, dtype=torch.float64)[:-1]
    negative = torch.linspace(NF4_OFFSET, 0.5, 8, dtype=torch.float64)[:-1]
    zero = torch.zeros(1, dtype=torch.float64)
    levels = torch.cat([-torch.special.ndtri(negative), zero, torch.special.ndtri(positive)]).sort().values
    return (levels / levels.max()).to(torch.float32)


def _midpoints(levels: torch.Tensor) -> torch.Tensor:
    """The boundaries between neighbouring levels: a value rounds to the level between its two boundaries."""
    return (levels[1:] + levels[:-1]) / 2


def quantize_nf4(x: torch.Tensor, block_size: int = 64) -> QuantizedTensor:
    """NF4 from scratch: per block, divide by absmax, snap to the nearest of :func:`nf4_levels`, store its index."""
    x = _check_tensor(x)
    block_size = checks.integer(block_size, "block_size", 1)  # NF4 always has blocks (64 in QLoRA)
    levels = nf4_levels().to(x.device)
    blocks, low, high = _block_stats(x, block_size)
    absmax = torch.maximum(low.neg(), high)
    codes = torch.bucketize(blocks / _nonzero(absmax), _midpoints(levels))  # a tie goes to the lower level
    return QuantizedTensor(_unblock(codes.to(torch.uint8), x.shape), absmax, None, 4, block_size, x.dtype, levels)


class _NF4Agreement(NamedTuple):
    """How two NF4 read-backs of the same tensor agree: ours (:func:`quantize_nf4`) and another (bitsandbytes').

    ``boundary_distance`` is the largest distance, in units of the block's absmax (the scale NF4 divides by),
    between a value read back differently and the nearest boundary between two of our levels: 0.0 when all
    agree. A tiny distance means the two disagree only where rounding could go either way.
    """

    differing: int
    total: int
    boundary_distance: float

    def holds(self, max_fraction: float = 1e-5, max_distance: float = 1e-6) -> bool:
        """True when at most ``max_fraction`` of the values differ, each within ``max_distance`` of a boundary."""
        return self.differing / self.total <= max_fraction and self.boundary_distance <= max_distance


def nf4_agreement(x: torch.Tensor, ours: QuantizedTensor, other_x_hat: torch.Tensor) -> _NF4Agreement:
    """Compare our NF4 of ``x`` with another NF4 read-back ``other_x_hat`` of it, value by value.

    Values whose read-backs differ by more than 1e-4 count as differing. For those, the distance of
    ``x / absmax`` (per block) from the nearest midpoint between two of ``ours``' levels is measured: two
    correct implementations can only disagree next to such a boundary, where the seventh decimal of a level
    or the order of a division decides.
    """
    x = _check_tensor(x)
    if not isinstance(ours, QuantizedTensor) or ours.codebook is None:
        raise TypeError("ours must be a QuantizedTensor from quantize_nf4")
    if not isinstance(other_x_hat, torch.Tensor) or other_x_hat.shape != x.shape:
        raise ValueError(f"other_x_hat must be a tensor of x's shape {tuple(x.shape)}")
    differ = ((dequantize(ours) - other_x_hat).abs() > 1e-4).reshape(-1)
    normalized = (_block_stats(x, ours.block_size)[0] / _nonzero(ours.scales)).reshape(-1)[: x.numel()][differ]
    distances = (normalized.unsqueeze(1) - _midpoints(ours.codebook)).abs().amin(dim=1)
    return _NF4Agreement(int(differ.sum()), x.numel(), float(distances.max()) if differ.any() else 0.0)


# --------------------------------------------------------------------------------------------
# Whole models
# --------------------------------------------------------------------------------------------
def quantize_model_weights(model: nn.Module, bits: int, block_size: BlockSize = None) -> tuple[nn.Module, int]:
    """Quantize and read back the weight of every ``nn.Linear`` in ``model`` ("fake quantization"), symmetric.

    Returns ``(model, stored_bytes)``: the model computes with the values a ``bits``-bit format would give
    (biases stay float32, as in real schemes), and ``stored_bytes`` is what the quantized Linear weights
    would take, scales included. The returned model still holds float32 tensors: this
    measures quality, it does not save memory. ``block_size="row"`` gives each output row its own scale.
    ``model`` itself is left untouched: the quantized model is a copy. :func:`course_utils.digits.model_in_format`,
    its caller, has checked that ``model`` is a module.
    """
    target = copy.deepcopy(model)
    layers = [m for m in target.modules() if isinstance(m, nn.Linear)]
    if not layers:
        raise ValueError("model has no nn.Linear layers to quantize")
    total = 0
    with torch.no_grad():
        for layer in layers:
            # quantize checks bits and block_size on the first layer, before any weight changes
            q = quantize(layer.weight, bits, layer.weight.shape[1] if block_size == "row" else block_size)
            layer.weight.copy_(dequantize(q))
            total += storage(q).total
    return target, total
