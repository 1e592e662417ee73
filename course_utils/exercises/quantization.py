"""Auto-checked exercises of notebook 01 (quantization): bytes of a quantized matrix, and int8 by hand.

The expected answers come from :mod:`course_utils.quant` (its storage arithmetic and its ``quantize``), never
retyped; each typical slip earns its own hint.
"""
from __future__ import annotations

from typing import Any

import torch

from course_utils import quant
from course_utils.exercises import Feedback, check_number, is_placeholder, right, unanswered, wrong

# --------------------------------------------------------------------------------------------
# Exercise 1: how many bytes does an int4 matrix with a scale per 64 weights take?
# --------------------------------------------------------------------------------------------
#: The matrix of the exercise: one MLP matrix of a 7-billion-parameter model (hidden 4096, MLP 11008).
BYTES_ROWS, BYTES_COLS = 11008, 4096
#: Its format: int4 codes, one float32 scale per block of 64 weights.
BYTES_BITS, BYTES_BLOCK = 4, 64


def int4_block_bytes() -> int:
    """The exercise's answer: bytes of the matrix in int4 with a float32 scale per 64 weights."""
    return quant.packed_storage(BYTES_ROWS * BYTES_COLS, BYTES_BITS, BYTES_BLOCK).total


def check_int4_block_bytes(answer: Any) -> Feedback:
    """Check the bytes of an 11008 x 4096 matrix in int4 with one float32 scale per block of 64 weights."""
    n = BYTES_ROWS * BYTES_COLS
    parts = quant.packed_storage(n, BYTES_BITS, BYTES_BLOCK)
    blocks = parts.scales // quant.SCALE_BYTES
    as_bytes = "A 4-bit code is half a byte: the codes take weights x 4 / 8 bytes."
    mistakes = [
        (parts.codes, "That is the codes alone: add one 4-byte scale for every block of 64 weights."),
        (n * 4 + parts.scales, "weights x 4 counts bits (or 4 bytes a weight, as in float32). " + as_bytes),
        (n * 4, "weights x 4 counts bits (or 4 bytes a weight, as in float32). " + as_bytes + " Then add the "
                "scales."),
        (n * BYTES_BITS + blocks * 32, "That is the total in bits: divide by 8 to get bytes."),
        (parts.codes + blocks * 2, "The scales are float32: 4 bytes each, not 2."),
        (parts.codes + quant.SCALE_BYTES, "That is one scale for the whole matrix: here every block of 64 weights "
                                          "has its own."),
        (n + parts.scales, "The codes are packed at 4 bits, two to a byte, not one byte each."),
        (parts.total / 1e6, "That is in MB: give the answer in bytes."),
        (parts.total / 2**20, "That is in MiB: give the answer in bytes."),
    ]
    expected = int4_block_bytes()
    feedback = check_number(answer, expected, name="answer_bytes", what="a number of bytes", rel_tol=0, abs_tol=0.5,
                            mistakes=mistakes, unit="bytes",
                            hint="Codes: weights x 4 bits / 8. Scales: (weights / 64) blocks x 4 bytes. Add both.")
    if not feedback.answered or not isinstance(answer, (int, float)) or isinstance(answer, bool):
        return feedback
    if feedback.correct:
        return right(f"answer_bytes = {answer:,.0f} bytes: {parts.codes:,} bytes of codes + {parts.scales:,} bytes "
                     f"of scales, {expected * 8 / n:g} bits per weight.")
    shown = f"{answer:,.0f}" if abs(answer) >= 1000 else f"{answer:g}"
    return Feedback(False, feedback.message.replace(f"{float(answer):g}", shown, 1), feedback.hint)


# --------------------------------------------------------------------------------------------
# Exercise 2: write symmetric int8 quantization with one scale
# --------------------------------------------------------------------------------------------
def int8_cases() -> list[torch.Tensor]:
    """The tensors the int8 exercise is tried on: the notebook's numbers, a negative extreme, random weights."""
    gen = torch.Generator().manual_seed(1)
    return [torch.tensor([0.5, -1.27, 0.02, 1.0]), torch.tensor(quant.EIGHT_WEIGHTS),
            torch.tensor([-2.0, 0.3, 1.1, -0.7]), torch.randn(256, generator=gen)]


def _as_float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):  # a tensor of several values raises RuntimeError
        return None


def _first(t: torch.Tensor, k: int = 4) -> str:
    """The first ``k`` values of ``t`` as '[0.5, -1.27, ...]' (whole numbers without '.0')."""
    values = ", ".join(f"{v:.4g}" for v in t.reshape(-1)[:k].tolist())
    return f"[{values}{', ...' if t.numel() > k else ''}]"


def _slip(x: torch.Tensor, codes: torch.Tensor, scale: float) -> str:
    """The hint for a wrong (codes, scale): which typical slip reproduces it."""
    absmax = float(x.abs().max())  # x: the float32 test tensor; codes: the student's, as float64
    right_scale = absmax / 127
    if abs(scale - right_scale) > 1e-6 * right_scale:
        slips = [(absmax / 128, "int8 keeps the symmetric levels -127..127, so q_max is 127, not 128."),
                 (absmax / 255, "The levels run from -127 to 127: divide max|x| by q_max = 127, not by 255."),
                 (float(x.max()) / 127, "Use the largest absolute value, x.abs().max(): here the extreme is "
                                        "negative."),
                 (127 / absmax, "The scale is max|x| / 127 (the gap between two levels), not its inverse.")]
        for value, hint in slips:
            if abs(scale - value) <= 1e-6 * max(abs(value), 1e-12):
                return hint
        return "The scale is s = max|x| / 127, with max|x| = x.abs().max()."
    x32 = x.to(torch.float32)
    ratio = (x32 / (x32.abs().max() / 127)).to(torch.float64)  # as a student's float32 code computes it
    if torch.equal(codes, ratio.trunc()):
        return "Round to the nearest level with torch.round: .int() or .long() cuts the fraction off instead."
    if torch.equal(codes, ratio.floor()):
        return "Round to the nearest level with torch.round, not floor."
    if not torch.equal(codes, codes.round()):
        return "The codes must be whole numbers: q = torch.round(x / s)."
    return "The codes are q = torch.round(x / s), with the scale s = max|x| / 127."


def check_quantize_int8(fn: Any) -> Feedback:
    """Check ``fn(x) -> (codes, scale)``, symmetric int8 with one scale, against ``quant.quantize(x, 8)``."""
    name = "quantize_int8"
    if is_placeholder(fn):
        return unanswered(name, "your function")
    if not callable(fn):
        return wrong(f"{name} should be a function, got {type(fn).__name__}.", "Write def quantize_int8(x): ...")
    cases = int8_cases()
    for i, x in enumerate(cases, 1):
        try:
            got = fn(x.clone())
        except NotImplementedError:
            return unanswered(name, "your code (the function body still raises NotImplementedError)")
        except Exception as err:  # noqa: BLE001 - a student's bug is reported in one line, never a traceback
            return wrong(f"{name} raised {type(err).__name__} on test tensor {i}: {err}",
                         "Use torch operations on the whole tensor: x.abs().max(), torch.round(x / s).")
        if is_placeholder(got):
            return unanswered(name, "a return statement (the function returns nothing yet)")
        if not isinstance(got, tuple) or len(got) != 2:
            return wrong(f"{name} should return two things, (codes, scale); got {type(got).__name__}.",
                         "End with: return q, s")
        codes, scale = got
        scale = _as_float(scale)
        if scale is None:
            return wrong(f"{name}'s scale should be one number (a float or a one-value tensor) on test tensor {i}.",
                         "One scale for the whole tensor: s = x.abs().max() / 127.")
        if not isinstance(codes, torch.Tensor) or codes.shape != x.shape:
            shape = tuple(codes.shape) if isinstance(codes, torch.Tensor) else type(codes).__name__
            return wrong(f"{name}'s codes should be a tensor of x's shape {tuple(x.shape)}; got {shape}.",
                         "q = torch.round(x / s) keeps the shape of x.")
        expected = quant.quantize(x, 8)
        codes = codes.detach().to(torch.float64)
        want = expected.codes.to(torch.float64)
        scale_ok = abs(scale - float(expected.scales)) <= 1e-6 * float(expected.scales)
        if not scale_ok or not torch.equal(codes, want):
            return wrong(f"on test tensor {i} ({_first(x)}) {name} gives scale {scale:.6g} and codes {_first(codes)};"
                         f" quant.quantize gives scale {float(expected.scales):.6g} and codes {_first(want)}.",
                         _slip(x, codes, scale))
    return right(f"{name} gives the same codes and scale as quant.quantize(x, 8) on all {len(cases)} test tensors.")
