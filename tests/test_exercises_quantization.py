"""Notebook 01's exercise checkers: the right answer passes, the placeholder is "not answered", slips get hints."""
from __future__ import annotations

import torch

from course_utils import quant
from course_utils.exercises import quantization as ex

N = 11008 * 4096  # the exercise's matrix


# --------------------------------------------------------------------------------------------
# Bytes of an int4 matrix with a scale per 64 weights
# --------------------------------------------------------------------------------------------
def test_bytes_right_answer() -> None:
    assert ex.int4_block_bytes() == quant.packed_storage(N, 4, 64).total == 25_362_432
    feedback = ex.check_int4_block_bytes(N * 4 // 8 + N // 64 * 4)
    assert feedback.correct and feedback.answered
    assert "25,362,432 bytes" in str(feedback) and "4.5 bits per weight" in str(feedback)
    assert ex.check_int4_block_bytes(25_362_432.0).correct


def test_bytes_placeholder() -> None:
    for placeholder in (..., None):
        feedback = ex.check_int4_block_bytes(placeholder)
        assert not feedback.correct and not feedback.answered
        assert str(feedback).startswith("Not answered yet")


def _hint(answer: object) -> str:
    feedback = ex.check_int4_block_bytes(answer)
    assert not feedback.correct and feedback.answered
    return feedback.hint


def test_bytes_typical_slips_get_their_hint() -> None:
    assert "codes alone" in _hint(N // 2)                              # forgot the scales
    assert "half a byte" in _hint(N * 4 + N // 64 * 4)                   # 4 bytes a weight / bits as bytes
    assert "add the scales" in _hint(N * 4)                             # both slips at once
    assert "in bits" in _hint(N * 4 + N // 64 * 32)                     # the whole total in bits
    assert "not 2" in _hint(N // 2 + N // 64 * 2)                       # 16-bit scales
    assert "one scale for the whole matrix" in _hint(N // 2 + 4)        # one scale only
    assert "two to a byte" in _hint(N + N // 64 * 4)                    # a byte per code
    assert "MB" in _hint(25.362432)
    assert "Codes:" in _hint(12345)                                     # anything else: the general hint


def test_bytes_wrong_types() -> None:
    for answer in ("25362432", True, float("nan")):
        feedback = ex.check_int4_block_bytes(answer)
        assert not feedback.correct and feedback.answered and "number" in feedback.message


# --------------------------------------------------------------------------------------------
# quantize_int8 by hand
# --------------------------------------------------------------------------------------------
def right_int8(x):
    s = x.abs().max() / 127
    return torch.round(x / s), s


def test_int8_right_answers() -> None:
    assert ex.check_quantize_int8(right_int8).correct

    def with_int8_codes_and_float_scale(x):
        s = x.abs().max().item() / 127
        return torch.round(x / s).to(torch.int8), s

    assert ex.check_quantize_int8(with_int8_codes_and_float_scale).correct
    # the cases really are quant.quantize's: codes and scale agree on every one
    for x in ex.int8_cases():
        codes, scale = right_int8(x)
        q = quant.quantize(x, 8)
        assert torch.equal(codes.to(torch.int8), q.codes) and float(scale) == float(q.scales)


def test_int8_placeholder() -> None:
    def not_written(x):
        raise NotImplementedError

    def no_return(x):
        s = x.abs().max() / 127  # noqa: F841 - a student's unfinished function

    for fn in (..., None, not_written, no_return):
        feedback = ex.check_quantize_int8(fn)
        assert not feedback.correct and not feedback.answered, fn


def _int8_hint(fn) -> str:
    feedback = ex.check_quantize_int8(fn)
    assert not feedback.correct and feedback.answered
    return feedback.hint


def test_int8_typical_slips_get_their_hint() -> None:
    def over_128(x):
        s = x.abs().max() / 128
        return torch.round(x / s), s

    def largest_not_absolute(x):
        s = x.max() / 127
        return torch.round(x / s), s

    def truncated(x):
        s = x.abs().max() / 127
        return (x / s).int(), s

    def not_rounded(x):
        s = x.abs().max() / 127
        return x / s, s

    def inverse_scale(x):
        s = 127 / x.abs().max()
        return torch.round(x * s), s

    def over_255(x):
        s = x.abs().max() / 255
        return torch.round(x / s), s

    assert "127, not 128" in _int8_hint(over_128)
    assert "x.abs().max()" in _int8_hint(largest_not_absolute)
    assert "torch.round" in _int8_hint(truncated) and "cuts" in _int8_hint(truncated)
    assert "whole numbers" in _int8_hint(not_rounded)
    assert "inverse" in _int8_hint(inverse_scale)
    assert "not by 255" in _int8_hint(over_255)


def test_int8_wrong_shapes_and_errors_are_one_line() -> None:
    assert "return q, s" in _int8_hint(lambda x: x)
    assert "one number" in ex.check_quantize_int8(lambda x: (x, x)).message
    assert "shape" in ex.check_quantize_int8(lambda x: (x[:1], x.abs().max() / 127)).message
    feedback = ex.check_quantize_int8(lambda x: 1 / 0)
    assert not feedback.correct and "ZeroDivisionError" in feedback.message
    assert "should be a function" in ex.check_quantize_int8(42).message
